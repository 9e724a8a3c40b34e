//! Error mapping: core errors to the exception classes of `protoprompt.errors`.

use crate::convert::FieldError;
use protoprompt_core::pack::PackError;
use protoprompt_core::span::SpanError;
use protoprompt_core::tokens::TokenError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::{PyErrArguments, PyTypeInfo};

/// The exception classes of `protoprompt.errors`, imported as Python types (the module
/// is imported when `_core` is, so a missing class is an import error, never a panic).
pub(crate) mod classes {
    pyo3::import_exception!(protoprompt.errors, HistoryMismatchError);
    pyo3::import_exception!(protoprompt.errors, InvalidItemError);
    pyo3::import_exception!(protoprompt.errors, InvalidNewInputError);
    pyo3::import_exception!(protoprompt.errors, SnapshotError);
    pyo3::import_exception!(protoprompt.errors, TokenBudgetExceededError);
    pyo3::import_exception!(protoprompt.errors, TokenizerError);
    pyo3::import_exception!(protoprompt.errors, UnknownEncodingError);
    pyo3::import_exception!(protoprompt.errors, UnknownModelError);
}

/// An exception of class `E` (one of [`classes`]) built from `args`.
pub(crate) fn raise<E: PyTypeInfo>(py: Python<'_>, args: impl PyErrArguments + 'static) -> PyErr {
    PyErr::from_type(py.get_type::<E>(), args)
}

pub(crate) fn item_error(py: Python<'_>, label: &str, field: &str, message: &str) -> PyErr {
    raise::<classes::InvalidItemError>(
        py,
        (
            format!("{label}: field {field}: {message}"),
            label.to_string(),
            field.to_string(),
        ),
    )
}

/// The `InvalidItemError` for the item at `label`, chained to the Python exception behind it.
pub(crate) fn field_error(py: Python<'_>, label: &str, e: FieldError) -> PyErr {
    let err = item_error(py, label, &e.field, &e.message);
    if let Some(cause) = e.cause {
        err.set_cause(py, Some(cause));
    }
    err
}

pub(crate) fn token_error(py: Python<'_>, e: TokenError) -> PyErr {
    match &e {
        TokenError::UnknownModel(m) => {
            raise::<classes::UnknownModelError>(py, (e.to_string(), m.clone()))
        }
        TokenError::UnknownEncoding(n) => {
            raise::<classes::UnknownEncodingError>(py, (e.to_string(), n.clone()))
        }
        TokenError::BadItem { field, message } => item_error(py, "item", field, message),
        TokenError::Tokenizer(_) => raise::<classes::TokenizerError>(py, (e.to_string(),)),
    }
}

pub(crate) fn pack_error(py: Python<'_>, e: PackError) -> PyErr {
    match e {
        PackError::BudgetExceeded {
            used,
            budget,
            section,
        } => raise::<classes::TokenBudgetExceededError>(py, (used, budget, section.name())),
        PackError::InvalidNewInput {
            ref label,
            ref reasons,
            ..
        } => raise::<classes::InvalidNewInputError>(
            py,
            (
                e.to_string(),
                label.clone(),
                reasons.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
            ),
        ),
        PackError::Item {
            label,
            field,
            message,
            ..
        } => item_error(py, &label, &field, &message),
        PackError::Context(m) => PyValueError::new_err(m),
    }
}

/// A history list that does not line up with the index: `HistoryMismatchError` when the
/// history is shorter than the index, else a `ValueError`.
pub(crate) fn span_error(py: Python<'_>, e: SpanError) -> PyErr {
    match e {
        SpanError::Shrunk { n_history, indexed } => {
            raise::<classes::HistoryMismatchError>(py, (e.to_string(), n_history, indexed))
        }
        _ => PyValueError::new_err(e.to_string()),
    }
}
