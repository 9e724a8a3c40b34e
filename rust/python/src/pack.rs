//! Running a core pack from Python: the options, the tokenizer preload, the GIL release
//! with the context hook, and the result dict.

use crate::convert::{opaque_scale, resolve_encoding};
use crate::decisions::DecisionTable;
use crate::errors::{pack_error, token_error};
use protoprompt_core::mask::Masking;
use protoprompt_core::pack::{ContextHook, PackError, PackOptions, PackResult, Policy};
use protoprompt_core::tokens::{CostBasis, Encoding};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Builds an encoding's tokenizer on a helper thread while the calling thread reads the
/// items (which needs the GIL): the first call in a process does both at once. The helper
/// is joined before the call returns, whatever happens, so no thread outlives the call.
pub(crate) struct Preload(Option<std::thread::JoinHandle<()>>);

impl Preload {
    pub(crate) fn start(enc: Encoding) -> Preload {
        if enc.is_loaded() {
            return Preload(None);
        }
        let handle = std::thread::Builder::new()
            .name("protoprompt-tokenizer".to_string())
            .spawn(move || enc.load())
            .ok();
        Preload(handle)
    }

    /// Wait for the helper with the GIL released.
    pub(crate) fn finish(mut self, py: Python<'_>) {
        if let Some(h) = self.0.take() {
            py.detach(|| {
                let _ = h.join();
            });
        }
    }
}

impl Drop for Preload {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}

/// The options of one `HistoryIndex.pack`, read from the one options value Python hands
/// over (`protoprompt.packing._PackOptions`, checked there): the core's [`PackOptions`], the
/// encoding, and what the binding itself needs.
pub(crate) struct CallOptions<'py> {
    pub(crate) core: PackOptions,
    /// The encoding and the calibration of opaque payloads.
    pub(crate) basis: CostBasis,
    pub(crate) context: Option<Bound<'py, PyAny>>,
    pub(crate) pinned: Vec<usize>,
    pub(crate) history_len: Option<usize>,
    pub(crate) history_offset: usize,
    pub(crate) masking: Option<Masking>,
}

impl<'py> CallOptions<'py> {
    pub(crate) fn from_py(options: &Bound<'py, PyAny>) -> PyResult<CallOptions<'py>> {
        let py = options.py();
        let get = |name: &Bound<'py, pyo3::types::PyString>| options.getattr(name);
        let model: Option<String> = get(intern!(py, "model"))?.extract()?;
        let encoding: Option<String> = get(intern!(py, "encoding"))?.extract()?;
        let encoding = resolve_encoding(model.as_deref(), encoding.as_deref())
            .map_err(|e| token_error(py, e))?;
        let policy: String = get(intern!(py, "policy"))?.extract()?;
        let policy = Policy::from_name(&policy).ok_or_else(|| {
            PyValueError::new_err(format!(
                "policy must be \"contiguous\" or \"greedy\", got {policy:?}"
            ))
        })?;
        let basis = CostBasis {
            encoding,
            opaque_scale: opaque_scale(get(intern!(py, "opaque_scale"))?.extract()?)?,
        };
        let core = PackOptions {
            budget: get(intern!(py, "budget"))?.extract()?,
            output_reserve: get(intern!(py, "output_reserve"))?.extract()?,
            context_tokens: get(intern!(py, "context_tokens"))?.extract()?,
            policy,
        };
        let context = Some(get(intern!(py, "context"))?).filter(|c| !c.is_none());
        Ok(CallOptions {
            core,
            basis,
            context,
            pinned: get(intern!(py, "pinned"))?.extract()?,
            history_len: get(intern!(py, "history_len"))?.extract()?,
            history_offset: get(intern!(py, "history_offset"))?.extract()?,
            masking: crate::mask::masking_from_py(&get(intern!(py, "masking"))?)?,
        })
    }
}

/// Run `f` (the core pack) with the GIL released and a context hook calling `context`.
pub(crate) fn run_pack<'py>(
    py: Python<'py>,
    context: Option<Bound<'py, PyAny>>,
    f: impl FnOnce(Option<ContextHook<'_>>) -> Result<PackResult, PackError> + Send,
) -> PyResult<PackResult> {
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
    if let Some(e) = hook_error {
        return Err(e);
    }
    result.map_err(|e| pack_error(py, e))
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
