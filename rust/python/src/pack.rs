//! Running a core pack from Python: the options value (`PackOptions`), the GIL release
//! with the context hook, and the result dict.

use crate::convert::type_name;
use crate::decisions::DecisionTable;
use crate::errors::token_error;
use protoprompt_core::facade::{CallOptions, OptionsError};
use protoprompt_core::pack::{ContextHook, PackError, PackResult, Policy};
use protoprompt_core::tokens::{CostBasis, OpaqueScale};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};

/// The options of a pack as one frozen value (`protoprompt.PackOptions`) over the core's
/// [`CallOptions`]: each field is type-checked here when it is set (on construction or
/// `replace`), its rules are the core's; the binding borrows it on every call.
#[pyclass(frozen, name = "PackOptions", module = "protoprompt._core")]
pub(crate) struct PyPackOptions {
    pub(crate) core: CallOptions,
    #[pyo3(get)]
    pub(crate) context: Option<Py<PyAny>>,
    #[pyo3(get, name = "masking")]
    masking_obj: Option<Py<PyAny>>,
}

const FIELDS: [&str; 12] = [
    "max_tokens",
    "output_reserve",
    "context_tokens",
    "model",
    "encoding",
    "policy",
    "context",
    "pinned",
    "history_len",
    "history_offset",
    "opaque_scale",
    "masking",
];

/// A token count: an int (not a bool) in `0..=u64::MAX`, with the messages of the keywords.
fn size(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, got {}",
            type_name(value)
        )));
    }
    value.extract::<u64>().map_err(|_| {
        let shown = value.str().map(|s| s.to_string()).unwrap_or_default();
        if value.lt(0i64).unwrap_or(false) {
            PyValueError::new_err(format!("{name} must be >= 0, got {shown}"))
        } else {
            PyValueError::new_err(format!(
                "{name} must be at most 2**64 - 1 tokens, got {shown}"
            ))
        }
    })
}

fn repr(value: &Bound<'_, PyAny>) -> String {
    value.repr().map(|r| r.to_string()).unwrap_or_default()
}

fn optional_str(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if value.is_none() {
        return Ok(None);
    }
    value.extract::<String>().map(Some).map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a str or None, got {}",
            type_name(value)
        ))
    })
}

/// A non-negative int (`what` names the accepted values in the message).
fn position(name: &str, what: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    let ok = !value.is_instance_of::<PyBool>() && value.is_instance_of::<PyInt>();
    ok.then(|| value.extract::<usize>().ok())
        .flatten()
        .ok_or_else(|| PyValueError::new_err(format!("{name} must be {what}, got {}", repr(value))))
}

fn pinned_of(value: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let refused = || {
        PyTypeError::new_err(format!(
            "pinned must be an iterable of history positions, got {}",
            type_name(value)
        ))
    };
    if value.is_instance_of::<PyString>() || value.is_instance_of::<PyBytes>() {
        return Err(refused());
    }
    let iter = value.try_iter().map_err(|_| refused())?;
    let mut pins = Vec::new();
    for (i, p) in iter.enumerate() {
        let p = p?;
        if p.is_instance_of::<PyBool>() || !p.is_instance_of::<PyInt>() {
            return Err(PyTypeError::new_err(format!(
                "pinned[{i}] must be an int, got {}",
                type_name(&p)
            )));
        }
        pins.push(p.extract::<usize>().map_err(|_| {
            PyValueError::new_err(format!(
                "pinned[{i}] is {}, not a history position",
                repr(&p)
            ))
        })?);
    }
    Ok(pins)
}

fn scale_of(value: &Bound<'_, PyAny>) -> PyResult<f64> {
    let number = !value.is_instance_of::<PyBool>()
        && (value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>());
    let factor = number.then(|| value.extract::<f64>().ok()).flatten();
    let Some(factor) = factor else {
        return Err(PyTypeError::new_err(format!(
            "opaque_scale must be a number, got {}",
            type_name(value)
        )));
    };
    let (min, max) = (OpaqueScale::MIN.factor(), OpaqueScale::MAX.factor());
    if !(min..=max).contains(&factor) {
        return Err(PyValueError::new_err(format!(
            "opaque_scale must be between {min:?} and {max:?}, got {}",
            repr(value)
        )));
    }
    Ok(factor)
}

impl PyPackOptions {
    fn copy(&self, py: Python<'_>) -> Self {
        PyPackOptions {
            core: self.core.clone(),
            context: self.context.as_ref().map(|c| c.clone_ref(py)),
            masking_obj: self.masking_obj.as_ref().map(|m| m.clone_ref(py)),
        }
    }

    /// Check and set one field (`Ok(true)`: the cost basis must be worked out again).
    fn set(&mut self, name: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        match name {
            "max_tokens" => self.core.pack.budget = size(name, value)?,
            "output_reserve" => self.core.pack.output_reserve = size(name, value)?,
            "context_tokens" => self.core.pack.context_tokens = size(name, value)?,
            "model" => {
                self.core.model = optional_str(name, value)?;
                return Ok(true);
            }
            "encoding" => {
                self.core.encoding = optional_str(name, value)?;
                return Ok(true);
            }
            "opaque_scale" => {
                self.core.opaque_scale = scale_of(value)?;
                return Ok(true);
            }
            "policy" => {
                let policy: String = value.extract().map_err(|_| {
                    PyValueError::new_err(format!("unknown policy {}", repr(value)))
                })?;
                self.core.pack.policy = Policy::parse(&policy).map_err(PyValueError::new_err)?;
            }
            "context" => self.context = (!value.is_none()).then(|| value.clone().unbind()),
            "pinned" => self.core.pinned = pinned_of(value)?,
            "history_len" => {
                self.core.history_len = if value.is_none() {
                    None
                } else {
                    Some(position(name, "a non-negative int or None", value)?)
                }
            }
            "history_offset" => {
                self.core.history_offset = if value.is_truthy()? {
                    position(name, "a non-negative int", value)?
                } else {
                    0
                }
            }
            "masking" => self.set_masking(value)?,
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "PackOptions got an unexpected keyword argument '{name}'"
                )))
            }
        }
        Ok(false)
    }

    fn set_masking(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = value.py();
        if value.is_none() {
            self.core.set_masking(None, false);
            self.masking_obj = None;
            return Ok(());
        }
        let class = py
            .import(intern!(py, "protoprompt.packing"))?
            .getattr(intern!(py, "Masking"))?;
        if !value.is_instance(&class)? {
            return Err(PyTypeError::new_err(format!(
                "masking must be a Masking or None, got {}",
                type_name(value)
            )));
        }
        let omit = value.getattr(intern!(py, "omit_reasoning"))?.is_truthy()?;
        self.core
            .set_masking(crate::mask::masking_from_py(value)?, omit);
        self.masking_obj = Some(value.clone().unbind());
        Ok(())
    }

    fn apply(&mut self, py: Python<'_>, fields: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let mut basis = false;
        for (name, value) in fields.into_iter().flat_map(|f| f.iter()) {
            let name: String = name.extract()?;
            basis |= self.set(&name, &value)?;
        }
        if basis {
            self.rebase(py)?;
        }
        Ok(())
    }

    /// Work out the cost basis of `model`, `encoding` and `opaque_scale` again.
    fn rebase(&mut self, py: Python<'_>) -> PyResult<()> {
        self.core.rebase().map_err(|e| match e {
            OptionsError::Token(e) => token_error(py, e),
            OptionsError::Value(m) => PyValueError::new_err(m),
        })
    }

    /// The context callable, bound for one call.
    pub(crate) fn context<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        self.context.as_ref().map(|c| c.bind(py).clone())
    }
}

#[pymethods]
impl PyPackOptions {
    #[new]
    #[pyo3(signature = (max_tokens, **fields))]
    fn new(
        py: Python<'_>,
        max_tokens: &Bound<'_, PyAny>,
        fields: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut options = PyPackOptions {
            core: CallOptions::default(),
            context: None,
            masking_obj: None,
        };
        options.set("max_tokens", max_tokens)?;
        if let Some(f) = fields {
            if f.contains("max_tokens")? {
                return Err(PyTypeError::new_err(
                    "PackOptions got multiple values for argument 'max_tokens'",
                ));
            }
        }
        options.apply(py, fields)?;
        options.rebase(py)?;
        Ok(options)
    }

    /// A copy with the given fields changed (each checked; the others are not checked again).
    #[pyo3(signature = (**fields))]
    fn replace(&self, py: Python<'_>, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut options = self.copy(py);
        options.apply(py, fields)?;
        Ok(options)
    }

    #[classattr]
    #[allow(non_snake_case)]
    fn FIELDS() -> Vec<&'static str> {
        FIELDS.to_vec()
    }

    #[getter]
    fn max_tokens(&self) -> u64 {
        self.core.pack.budget
    }
    #[getter]
    fn output_reserve(&self) -> u64 {
        self.core.pack.output_reserve
    }
    #[getter]
    fn context_tokens(&self) -> u64 {
        self.core.pack.context_tokens
    }
    #[getter]
    fn model(&self) -> Option<&str> {
        self.core.model.as_deref()
    }
    #[getter]
    fn encoding(&self) -> Option<&str> {
        self.core.encoding.as_deref()
    }
    #[getter]
    fn opaque_scale(&self) -> f64 {
        self.core.opaque_scale
    }
    #[getter]
    fn history_len(&self) -> Option<usize> {
        self.core.history_len
    }
    #[getter]
    fn history_offset(&self) -> usize {
        self.core.history_offset
    }
    /// The encoding the costs are counted with (resolved from `model` / `encoding`).
    #[getter]
    fn resolved_encoding(&self) -> &'static str {
        self.core.basis.encoding.name()
    }
    #[getter]
    fn policy(&self) -> &'static str {
        self.core.pack.policy.name()
    }
    #[getter]
    fn pinned<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.core.pinned)
    }

    fn __repr__(&self) -> String {
        self.core.describe()
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
