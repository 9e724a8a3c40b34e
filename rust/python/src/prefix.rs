//! The cache-stable prefix decision from Python (`protoprompt._core.plan_prefix`): items and
//! the previous state converted in, [`protoprompt_core::prefix::plan_prefix_values`] run
//! without the GIL, the plan converted out. The decision is the core's.

use protoprompt_core::pack::PackOptions;
use protoprompt_core::prefix::{plan_prefix_values, CachePolicy, PrefixState};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;

use crate::convert::{encoding_of, item_seq, item_value, label, to_py};
use crate::errors::pack_error;

/// The state as Python sees it: `(cut, end, masked, pinned, before_cut, kept)`.
type StateTuple = (usize, usize, Vec<usize>, Vec<usize>, Vec<u8>, Vec<u8>);

/// The plan: `(kept_history, copies, request_tokens, shared_tokens, reason_code, reason,
/// cut_position, state)`.
type PlanTuple<'py> = (
    Vec<usize>,
    Vec<(usize, Bound<'py, PyAny>)>,
    u64,
    u64,
    &'static str,
    String,
    Option<usize>,
    StateTuple,
);

fn values(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    name: &str,
    offset: usize,
    n_history: usize,
) -> PyResult<Vec<Value>> {
    let items = item_seq(obj, name)?;
    let label = |i: usize| label(n_history, offset + i);
    let value = |(i, item): (usize, &Py<PyAny>)| item_value(py, item.bind(py), &label(i));
    items.iter().enumerate().map(value).collect()
}

/// Plan one request's prefix (see `protoprompt_core::prefix`).
#[pyfunction]
#[pyo3(signature = (history, new_input, *, budget, output_reserve, context_tokens, low_water,
    keep_recent, excerpt_tokens, previous=None, model=None, encoding=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_prefix<'py>(
    py: Python<'py>,
    history: &Bound<'py, PyAny>,
    new_input: &Bound<'py, PyAny>,
    budget: u64,
    output_reserve: u64,
    context_tokens: u64,
    low_water: f64,
    keep_recent: usize,
    excerpt_tokens: u64,
    previous: Option<StateTuple>,
    model: Option<&str>,
    encoding: Option<&str>,
) -> PyResult<PlanTuple<'py>> {
    let enc = encoding_of(py, model, encoding)?;
    let policy = CachePolicy::checked(low_water, keep_recent).map_err(PyValueError::new_err)?;
    protoprompt_core::mask::Masking::checked(excerpt_tokens, None)
        .map_err(PyValueError::new_err)?;
    let n_history = item_seq(history, "history")?.len();
    let history = values(py, history, "history", 0, n_history)?;
    let new_input = values(py, new_input, "new_input", n_history, n_history)?;
    let previous = previous
        .map(|(cut, end, masked, pinned, before_cut, kept)| {
            PrefixState::from_parts((cut, end, masked, pinned), &before_cut, &kept)
        })
        .transpose()
        .map_err(PyValueError::new_err)?;
    let opts = PackOptions {
        budget,
        output_reserve,
        context_tokens,
        ..PackOptions::default()
    };
    let plan = py
        .detach(|| {
            plan_prefix_values(
                &history,
                &new_input,
                enc,
                &opts,
                excerpt_tokens,
                policy,
                previous.as_ref(),
            )
        })
        .map_err(|e| pack_error(py, e))?;
    let copies = plan
        .copies
        .iter()
        .map(|(p, v)| Ok((*p, to_py(py, v)?)))
        .collect::<PyResult<Vec<_>>>()?;
    let reason = plan.describe();
    let cut_position = plan.cut_position();
    let d = plan.decision;
    let s = d.state;
    let state = (
        s.cut,
        s.end,
        s.masked,
        s.pinned,
        s.before_cut.to_vec(),
        s.kept.to_vec(),
    );
    Ok((
        plan.kept_history,
        copies,
        d.request_tokens,
        d.shared_tokens,
        d.reason.code(),
        reason,
        cut_position,
        state,
    ))
}
