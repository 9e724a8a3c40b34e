//! Running a core pack from Python: the options value (`PackOptions`), the GIL release
//! with the context hook, and the result dict.

use crate::convert::type_name;
use crate::errors::token_error;
use protoprompt_core::facade::{
    CallOptions, FieldError, FieldValue, Int, OptionsError, ReportValue,
};
use protoprompt_core::pack::{context_tokens, ContextHook, PackError};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};

/// The options of a pack as one frozen value (`protoprompt.PackOptions`) over the core's
/// [`CallOptions`]: each field is checked when it is set (on construction or `replace`), by
/// the core's rules ([`CallOptions::set_field`]); the binding borrows it on every call.
#[pyclass(frozen, name = "PackOptions", module = "protoprompt._core")]
pub(crate) struct PyPackOptions {
    pub(crate) core: CallOptions,
    #[pyo3(get)]
    pub(crate) context: Option<Py<PyAny>>,
    #[pyo3(get, name = "masking")]
    masking_obj: Option<Py<PyAny>>,
}

/// A Python value handed for one field, as the core's rules read it ([`FieldValue`]).
struct Given<'py>(Bound<'py, PyAny>);

impl<'py> FieldValue for Given<'py> {
    type Error = PyErr;
    type Elements = Box<dyn Iterator<Item = PyResult<Given<'py>>> + 'py>;

    fn is_none(&self) -> bool {
        self.0.is_none()
    }

    fn int(&self) -> Option<Int> {
        let v = &self.0;
        if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
            return None;
        }
        Some(match v.extract::<u64>() {
            Ok(n) => Int::Fits(n),
            Err(_) if v.lt(0i64).unwrap_or(false) => Int::Negative,
            Err(_) => Int::TooBig,
        })
    }

    fn number(&self) -> Option<f64> {
        let v = &self.0;
        let number = !v.is_instance_of::<PyBool>()
            && (v.is_instance_of::<PyInt>() || v.is_instance_of::<PyFloat>());
        number.then(|| v.extract::<f64>().ok()).flatten()
    }

    fn text(&self) -> Option<String> {
        self.0.extract().ok()
    }

    fn truthy(&self) -> PyResult<bool> {
        self.0.is_truthy()
    }

    fn elements(&self) -> PyResult<Option<Self::Elements>> {
        let v = &self.0;
        if v.is_instance_of::<PyString>() || v.is_instance_of::<PyBytes>() {
            return Ok(None);
        }
        Ok(v.try_iter()
            .ok()
            .map(|i| Box::new(i.map(|r| r.map(Given))) as Self::Elements))
    }

    fn type_name(&self) -> String {
        type_name(&self.0)
    }

    fn repr(&self) -> String {
        self.0.repr().map(|r| r.to_string()).unwrap_or_default()
    }

    fn shown(&self) -> String {
        self.0.str().map(|s| s.to_string()).unwrap_or_default()
    }
}

impl PyPackOptions {
    fn copy(&self, py: Python<'_>) -> Self {
        PyPackOptions {
            core: self.core.clone(),
            context: self.context.as_ref().map(|c| c.clone_ref(py)),
            masking_obj: self.masking_obj.as_ref().map(|m| m.clone_ref(py)),
        }
    }

    /// Check and set one field (`Ok(true)`: the cost basis must be worked out again): the
    /// Python objects (`context`, `masking`) here, the others by the core's rules.
    fn set(&mut self, name: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
        match name {
            "context" => self.context = (!value.is_none()).then(|| value.clone().unbind()),
            "masking" => self.set_masking(value)?,
            _ => {
                return self
                    .core
                    .set_field(name, &Given(value.clone()))
                    .map_err(|e| match e {
                        FieldError::Type(m) => PyTypeError::new_err(m),
                        FieldError::Value(m) => PyValueError::new_err(m),
                        FieldError::Raised(e) => e,
                    })
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
        let fields: crate::mask::MaskingFields = value.extract()?;
        (self.core).set_masking(Some(fields.masking()?), fields.omit_reasoning);
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

/// The `#[pymethods]` of [`PyPackOptions`]: a read-only getter per `name: type = value`
/// (`$o` being `&self`), then the methods written out.
macro_rules! options_methods {
    (|$o:ident| { $($(#[$doc:meta])* $name:ident: $ty:ty = $value:expr,)* } $($method:tt)*) => {
        #[pymethods]
        impl PyPackOptions {
            $($(#[$doc])* #[getter] fn $name(&self) -> $ty { let $o = self; $value })*
            $($method)*
        }
    };
}

options_methods! {
    |o| {
        max_tokens: u64 = o.core.pack.budget,
        output_reserve: u64 = o.core.pack.output_reserve,
        context_tokens: u64 = o.core.pack.context_tokens,
        model: Option<&str> = o.core.model.as_deref(),
        encoding: Option<&str> = o.core.encoding.as_deref(),
        opaque_scale: f64 = o.core.opaque_scale,
        history_len: Option<usize> = o.core.history_len,
        history_offset: usize = o.core.history_offset,
        /// The encoding the costs are counted with (resolved from `model` / `encoding`).
        resolved_encoding: &'static str = o.core.basis.encoding.name(),
        policy: &'static str = o.core.pack.policy.name(),
    }

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
        CallOptions::FIELDS.to_vec()
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
                let shown = || returned.repr().map(|r| r.to_string()).unwrap_or_default();
                let tokens = context_tokens(returned.extract().ok(), shown);
                tokens.map_err(PyValueError::new_err)
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

/// One plain value of a pack's result
/// ([`protoprompt_core::facade::PackCall::report`]) as a Python object.
pub(crate) fn report_value<'py>(
    py: Python<'py>,
    value: ReportValue,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        ReportValue::Positions(p) => p.into_pyobject(py)?,
        ReportValue::Count(n) => n.into_pyobject(py)?.into_any(),
        ReportValue::Name(name) => PyString::new(py, name).into_any(),
        ReportValue::Factor(f) => PyFloat::new(py, f).into_any(),
        ReportValue::Index(u) => (u.held, u.appended, u.regrouped_from, u.why.as_deref())
            .into_pyobject(py)?
            .into_any(),
        ReportValue::Stop(stop) => stop.into_pyobject(py)?,
    })
}
