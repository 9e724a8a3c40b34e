//! `protoprompt._core.cut_text` and `fit_output`: token-exact cuts of texts and tool outputs
//! for model-facing copies (`protoprompt_core::truncate`). Converts, releases the GIL, maps
//! errors.

use crate::convert::{encoding_of, item_value, to_py};
use crate::errors::token_error;
use protoprompt_core::truncate::{cut_text as core_cut_text, fit_output as core_fit_output};
use pyo3::prelude::*;

/// `text` cut to at most `max_tokens` tokens, head and tail around `marker` (whose
/// `{removed}` says how many tokens were cut).
#[pyfunction]
#[pyo3(signature = (text, max_tokens, *, tail_share, marker, model=None, encoding=None))]
pub(crate) fn cut_text(
    py: Python<'_>,
    text: &str,
    max_tokens: u64,
    tail_share: f64,
    marker: &str,
    model: Option<&str>,
    encoding: Option<&str>,
) -> PyResult<String> {
    let enc = encoding_of(py, model, encoding)?;
    let (text, marker) = (text.to_string(), marker.to_string());
    py.detach(move || core_cut_text(enc, &text, max_tokens, tail_share, &marker))
        .map_err(|e| token_error(py, e))
}

/// `fit_output`'s answer: `(copy, tokens, parts_removed, media_removed)`.
type Fitted<'py> = (Bound<'py, PyAny>, u64, usize, usize);

/// A tool-output item cut to cost at most `target` tokens: `(copy, tokens, parts_removed,
/// media_removed)`, or `None` when it cannot be cut to fit.
#[pyfunction]
#[pyo3(signature = (item, target, *, model=None, encoding=None))]
pub(crate) fn fit_output<'py>(
    py: Python<'py>,
    item: &Bound<'py, PyAny>,
    target: u64,
    model: Option<&str>,
    encoding: Option<&str>,
) -> PyResult<Option<Fitted<'py>>> {
    let enc = encoding_of(py, model, encoding)?;
    let value = item_value(py, item, "item")?;
    let fit = py
        .detach(move || core_fit_output(&value, target, enc))
        .map_err(|e| token_error(py, e))?;
    fit.map(|f| {
        Ok((
            to_py(py, &f.item)?,
            f.tokens,
            f.parts_removed,
            f.media_removed,
        ))
    })
    .transpose()
}
