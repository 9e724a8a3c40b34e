//! Running a core pack from Python: the options, the tokenizer preload, the GIL release
//! with the context hook, and the result dict.

use crate::convert::{opaque_scale, resolve_encoding};
use crate::decisions::DecisionTable;
use crate::errors::token_error;
use protoprompt_core::mask::Masking;
use protoprompt_core::pack::{ContextHook, PackError, PackOptions, PackResult, Policy};
use protoprompt_core::tokens::CostBasis;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The attributes of the one options value `HistoryIndex.pack` is handed
/// (`protoprompt._pack_run.PackOptions`, checked there).
#[derive(FromPyObject)]
struct RawOptions<'py> {
    #[pyo3(attribute)]
    budget: u64,
    #[pyo3(attribute)]
    output_reserve: u64,
    #[pyo3(attribute)]
    context_tokens: u64,
    #[pyo3(attribute)]
    model: Option<String>,
    #[pyo3(attribute)]
    encoding: Option<String>,
    #[pyo3(attribute)]
    policy: String,
    #[pyo3(attribute)]
    context: Option<Bound<'py, PyAny>>,
    #[pyo3(attribute)]
    pinned: Vec<usize>,
    #[pyo3(attribute)]
    history_len: Option<usize>,
    #[pyo3(attribute)]
    history_offset: usize,
    #[pyo3(attribute)]
    opaque_scale: f64,
    #[pyo3(attribute)]
    masking: Option<Bound<'py, PyAny>>,
}

/// The options of one `HistoryIndex.pack` as the core takes them: its [`PackOptions`], the
/// cost basis, and what the binding itself needs.
pub(crate) struct CallOptions<'py> {
    pub(crate) core: PackOptions,
    /// The encoding and the calibration of opaque payloads.
    pub(crate) basis: CostBasis,
    pub(crate) context: Option<Bound<'py, PyAny>>,
    pub(crate) pinned: Vec<usize>,
    pub(crate) history_len: Option<usize>,
    pub(crate) history_offset: usize,
    pub(crate) masking: Option<Masking>,
    /// The model strips earlier turns' thinking (older Claude generations): the thinking
    /// before the last user message costs 0 in this call.
    pub(crate) strips_thinking: bool,
    /// `masking.omit_reasoning`: a unit sent masked leaves out its reasoning when it stands
    /// before the last user message (see `index::earlier_reasoning`).
    pub(crate) omit_reasoning: bool,
}

impl<'py> CallOptions<'py> {
    pub(crate) fn from_py(options: &Bound<'py, PyAny>) -> PyResult<CallOptions<'py>> {
        let py = options.py();
        let raw: RawOptions<'py> = options.extract()?;
        let encoding = resolve_encoding(raw.model.as_deref(), raw.encoding.as_deref())
            .map_err(|e| token_error(py, e))?;
        let strips_thinking = raw
            .model
            .as_deref()
            .is_some_and(protoprompt_core::tokens::strips_earlier_thinking);
        let omit_reasoning = match &raw.masking {
            Some(m) if !m.is_none() => m
                .getattr(pyo3::intern!(py, "omit_reasoning"))
                .ok()
                .map(|v| v.is_truthy())
                .transpose()?
                .unwrap_or(false),
            _ => false,
        };
        Ok(CallOptions {
            strips_thinking,
            omit_reasoning,
            core: PackOptions {
                budget: raw.budget,
                output_reserve: raw.output_reserve,
                context_tokens: raw.context_tokens,
                policy: Policy::parse(&raw.policy).map_err(PyValueError::new_err)?,
            },
            basis: CostBasis::checked(encoding, opaque_scale(raw.opaque_scale)?)
                .map_err(PyValueError::new_err)?,
            context: raw.context.filter(|c| !c.is_none()),
            pinned: raw.pinned,
            history_len: raw.history_len,
            history_offset: raw.history_offset,
            masking: raw
                .masking
                .map(|m| crate::mask::masking_from_py(&m))
                .transpose()?
                .flatten(),
        })
    }
}

/// Run `f` (the core pack) with the GIL released and a context hook calling `context`: its
/// outcome, and the exception the hook raised or the error its return value is, if any.
pub(crate) fn run_pack<'py, T: Send>(
    py: Python<'py>,
    context: Option<Bound<'py, PyAny>>,
    f: impl FnOnce(Option<ContextHook<'_>>) -> T + Send,
) -> (T, Option<PyErr>) {
    let context: Option<Py<PyAny>> = context.map(Bound::unbind);
    let mut hook_error: Option<PyErr> = None;
    let result = py.detach(|| {
        let mut hook = |remaining: u64| -> Result<u64, PackError> {
            let Some(callable) = context.as_ref() else {
                return Ok(0);
            };
            Python::attach(|py| {
                let returned = callable.bind(py).call1((remaining,))?;
                match returned.extract::<i64>() {
                    Ok(n) if n >= 0 => Ok(n as u64),
                    _ => Err(PyValueError::new_err(format!(
                        "the context callable must return a non-negative int (tokens used), \
                         got {}",
                        returned.repr().map(|r| r.to_string()).unwrap_or_default()
                    ))),
                }
            })
            .map_err(|e| {
                let message = e.to_string();
                hook_error = Some(e);
                PackError::Context(message)
            })
        };
        f(Some(&mut hook))
    });
    (result, hook_error)
}

pub(crate) fn result_dict<'py>(
    py: Python<'py>,
    result: &PackResult,
    basis: CostBasis,
    policy: Policy,
    decisions: DecisionTable,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("kept_history", &result.kept_history)?;
    out.set_item("dependency", &result.dependency)?;
    out.set_item("new_input_tokens", result.new_input_tokens)?;
    out.set_item("dependency_tokens", result.dependency_tokens)?;
    out.set_item("history_tokens", result.history_tokens)?;
    out.set_item("context_tokens", result.context_tokens)?;
    out.set_item("output_reserve", result.output_reserve)?;
    out.set_item("budget", result.budget)?;
    out.set_item("used", result.used())?;
    out.set_item("remaining", result.remaining())?;
    out.set_item("encoding", basis.encoding.name())?;
    out.set_item("opaque_scale", basis.opaque_scale.factor())?;
    out.set_item("policy", policy.name())?;
    out.set_item("decisions", Bound::new(py, decisions)?)?;
    out.set_item("masking_saved", result.masking_saved)?;
    let stop = result.stop.map(|s| (s.unit, s.left, s.cause.code()));
    out.set_item("stop", stop)?;
    Ok(out)
}
