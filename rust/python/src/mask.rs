//! Masking from Python: the `masking` option (`protoprompt.Masking`), and the core's masked
//! copies ([`protoprompt_core::mask`]) as new Python objects in the request.

use crate::convert::{as_dict, label, to_py};
use crate::errors::{field_error, item_error};
use protoprompt_core::mask::{MaskedField, Masking};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// The fields of a `protoprompt.Masking` (its constructor checked them).
#[derive(FromPyObject)]
pub(crate) struct MaskingFields {
    #[pyo3(attribute)]
    excerpt_tokens: u64,
    #[pyo3(attribute)]
    after_turns: Option<u64>,
    #[pyo3(attribute, from_py_with = Bound::<'_, PyAny>::is_truthy)]
    pub(crate) omit_reasoning: bool,
}

impl MaskingFields {
    /// The core's [`Masking`] of these fields ([`Masking::checked`]).
    pub(crate) fn masking(&self) -> PyResult<Masking> {
        Masking::checked(self.excerpt_tokens, self.after_turns).map_err(PyValueError::new_err)
    }
}

/// The masked copy of `original`: a new dict with the original's fields in their order,
/// `masked.field` replaced by a new object of the masked value (the other fields' values are
/// the original's objects: a shallow copy; the item itself is never changed). The original's
/// field must still have the length the masked field was made from, or the item changed
/// behind the index that remembered it: an `InvalidItemError` naming it.
pub(crate) fn masked_copy<'py>(
    py: Python<'py>,
    original: &Bound<'py, PyAny>,
    masked: &MaskedField,
    n_history: usize,
    position: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let at = label(n_history, position);
    let dict = as_dict(original, "(item)")
        .map_err(|e| field_error(py, &at, e))?
        .ok_or_else(|| item_error(py, &at, "(item)", "is no longer a mapping"))?;
    let copy = dict.copy()?;
    let len = copy.get_item(masked.field)?.and_then(|v| v.len().ok());
    let unchanged = masked.check_len(len);
    unchanged.map_err(|message| item_error(py, &at, masked.field, message))?;
    copy.set_item(masked.field, masked_value(py, masked)?)?;
    Ok(copy.into_any())
}

/// The masked value as a new Python object, except a text: a Python string is immutable,
/// so the one made for the first copy of this masked field serves every later copy.
fn masked_value<'py>(py: Python<'py>, masked: &MaskedField) -> PyResult<Bound<'py, PyAny>> {
    let text = |text: &str| PyString::new(py, text).into_any().unbind();
    match masked.converted_text(text) {
        Some(s) => Ok(s.bind(py).clone()),
        None => to_py(py, &masked.value),
    }
}
