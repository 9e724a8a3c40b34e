//! The cache-stable prefix decision from Python (`protoprompt._core.plan_prefix`): items and
//! the previous state converted in, [`PrefixCall::plan`] run without the GIL, the plan
//! converted out. The checks and the decision are the core's.

use protoprompt_core::prefix::{PlanParts, PrefixCall, PrefixState, StateParts};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;

use crate::convert::{encoding_of, item_seq, item_value, label, to_py};
use crate::errors::pack_error;

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
    previous: Option<StateParts>,
    model: Option<&str>,
    encoding: Option<&str>,
) -> PyResult<PlanParts<Bound<'py, PyAny>>> {
    let enc = encoding_of(py, model, encoding)?;
    let reserve = (budget, output_reserve, context_tokens);
    let call = PrefixCall::checked(reserve, low_water, keep_recent, excerpt_tokens)
        .map_err(PyValueError::new_err)?;
    let n_history = item_seq(history, "history")?.len();
    let history = values(py, history, "history", 0, n_history)?;
    let new_input = values(py, new_input, "new_input", n_history, n_history)?;
    let previous = previous.map(PrefixState::from_parts).transpose();
    let previous = previous.map_err(PyValueError::new_err)?;
    let plan = py.detach(|| call.plan((&history, &new_input), enc, previous.as_ref()));
    let plan = plan.map_err(|e| pack_error(py, e))?;
    plan.into_parts(|v| to_py(py, v))
}
