//! Python <-> Rust: items to the core's graph fields (`RawItem`) and to JSON values, item
//! lists, encodings and labels; JSON values back to Python objects.

use crate::errors::{field_error, token_error};
use protoprompt_core::items::{
    Fault, GraphField, ItemFields, ItemMeta, ItemValue, NotText, RawItem,
};
use protoprompt_core::json::{json_item, json_value, JsonSource, Shape};
use protoprompt_core::tokens::{Encoding, OpaqueScale};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyDict, PyFloat, PyInt, PyIterator, PyList, PyMapping, PyString, PyTuple,
};
use serde_json::Value;

/// A readable name of a Python value's type for error messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_string())
}

/// Borrow `obj` as a dict: a dict as is, any other Mapping copied into one (`Ok(None)`: not
/// a mapping). A mapping whose `items()` (or whatever it calls) raises is an error that
/// carries that exception as its cause.
pub(crate) fn as_dict<'py>(
    obj: &Bound<'py, PyAny>,
    field: &str,
) -> Result<Option<Bound<'py, PyDict>>, FieldError> {
    if let Ok(d) = obj.cast::<PyDict>() {
        return Ok(Some(d.clone()));
    }
    let Ok(mapping) = obj.cast::<PyMapping>() else {
        return Ok(None);
    };
    let failed = |e: PyErr| {
        let message = format!("reading the {} failed: {e}", type_name(obj));
        Fault::caused(field, message, e)
    };
    let dict = PyDict::new(obj.py());
    let items = mapping.items().map_err(failed)?;
    for pair in items.iter() {
        let (k, v): (Bound<'py, PyAny>, Bound<'py, PyAny>) = pair.extract().map_err(failed)?;
        dict.set_item(k, v).map_err(failed)?;
    }
    Ok(Some(dict))
}

/// Why an item cannot be read ([`Fault`]): the Python exception behind it, if one was
/// raised, becomes the `__cause__` of the error ([`crate::errors::field_error`]).
pub(crate) type FieldError = Fault<PyErr>;

/// A Python value inside an item, as the core's one item reader ([`ItemFields::read`]) sees it.
pub(crate) struct PyValue<'py>(Bound<'py, PyAny>);

impl<'py> ItemValue for PyValue<'py> {
    type Error = FieldError;
    type Map = Bound<'py, PyDict>;

    fn is_null(&self) -> bool {
        self.0.is_none()
    }

    fn text(&self) -> Option<Result<&str, NotText>> {
        let s = self.0.cast::<PyString>().ok()?;
        Some(s.to_str().map_err(|_| NotText))
    }

    fn type_name(&self) -> String {
        type_name(&self.0)
    }

    fn mapping(&self, field: &str) -> Result<Option<Self::Map>, FieldError> {
        as_dict(&self.0, field)
    }

    fn entry(map: &Self::Map, key: &str, field: &str) -> Result<Option<Self>, FieldError> {
        let value = map.get_item(key).map_err(|e| Fault::raised(field, e))?;
        Ok(value.map(PyValue))
    }
}

/// Read the graph-relevant fields of one item: one pass over its entries (an item has a
/// handful of keys; twelve keyed lookups cost more) collects the graph fields, which the
/// core's reader then checks and interprets. A dict is read in place: its other values are
/// not touched.
pub(crate) fn extract_raw(obj: &Bound<'_, PyAny>) -> Result<RawItem, FieldError> {
    let py = obj.py();
    let dict = as_dict(obj, "(item)")?.ok_or_else(|| {
        Fault::new(
            "(item)",
            format!("an item must be a mapping (dict), got {}", type_name(obj)),
        )
    })?;
    let mut fields = ItemFields::default();
    let mut pos: pyo3::ffi::Py_ssize_t = 0;
    let mut key_ptr: *mut pyo3::ffi::PyObject = std::ptr::null_mut();
    let mut value_ptr: *mut pyo3::ffi::PyObject = std::ptr::null_mut();
    // SAFETY: `dict` is a live dict and the GIL is held; PyDict_Next hands out borrowed
    // references that stay valid while the dict is not mutated, and nothing in this loop
    // runs Python code (the values kept are taken as new references).
    while unsafe { pyo3::ffi::PyDict_Next(dict.as_ptr(), &mut pos, &mut key_ptr, &mut value_ptr) }
        != 0
    {
        let key = unsafe { Borrowed::from_ptr(py, key_ptr) };
        let Ok(name) = key.cast::<PyString>() else {
            // Never sent (the SDK's items are JSON objects); say so now rather than when
            // the item is costed, or never if it is dropped without being counted.
            return Err(Fault::new(
                "(item)",
                format!("has a non-string key of type {}", type_name(&key)),
            ));
        };
        if let Some(field) = name.to_str().ok().and_then(GraphField::from_name) {
            fields.set(
                field,
                PyValue(unsafe { Borrowed::from_ptr(py, value_ptr) }.to_owned()),
            );
        }
    }
    fields.read()
}

impl<'py> JsonSource for PyValue<'py> {
    type Fault = PyErr;
    type Entries = Entries<'py>;
    type Items = Items<'py>;

    #[inline]
    fn shape(&self, at: &dyn Fn() -> String) -> Result<Shape<'_, Self>, FieldError> {
        let v = &self.0;
        let entries = |d: &Bound<'py, PyDict>| Shape::Map(Entries(d.iter()));
        Ok(if v.is_none() {
            Shape::Null
        } else if let Some(text) = self.text() {
            Shape::Text(text)
        } else if let Ok(b) = v.cast::<PyBool>() {
            Shape::Bool(b.is_true())
        } else if v.cast::<PyInt>().is_ok() {
            if let Ok(i) = v.extract::<i64>() {
                Shape::Int(i)
            } else if let Ok(u) = v.extract::<u64>() {
                Shape::UInt(u)
            } else {
                Shape::BigInt(v.str().map_err(|e| Fault::raised(at(), e))?.to_string())
            }
        } else if let Ok(f) = v.cast::<PyFloat>() {
            Shape::Float(f.value())
        } else if let Ok(d) = v.cast::<PyDict>() {
            entries(d)
        } else if v.cast::<PyList>().is_ok() || v.cast::<PyTuple>().is_ok() {
            let items = v.try_iter().map_err(|e| Fault::raised(at(), e))?;
            Shape::List(Items(items))
        } else {
            as_dict(v, &at())?.as_ref().map_or(Shape::Other, entries)
        })
    }

    fn failed(field: String, e: PyErr) -> FieldError {
        Fault::raised(field, e)
    }
}

/// A dict's entries as [`PyValue`]s.
pub(crate) struct Entries<'py>(pyo3::types::iter::BoundDictIterator<'py>);

impl<'py> Iterator for Entries<'py> {
    type Item = (PyValue<'py>, PyValue<'py>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(k, v)| (PyValue(k), PyValue(v)))
    }
}

/// A list's or tuple's elements as [`PyValue`]s.
pub(crate) struct Items<'py>(Bound<'py, PyIterator>);

impl<'py> Iterator for Items<'py> {
    type Item = PyResult<PyValue<'py>>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|r| r.map(PyValue))
    }
}

/// The encoding a call asked for (see [`Encoding::resolve`]).
pub(crate) fn encoding_of(
    py: Python<'_>,
    model: Option<&str>,
    encoding: Option<&str>,
) -> PyResult<Encoding> {
    Encoding::resolve(model, encoding).map_err(|e| token_error(py, e))
}

/// One item as a JSON value ([`json_item`]): errors name it `label`.
pub(crate) fn item_value(py: Python<'_>, item: &Bound<'_, PyAny>, label: &str) -> PyResult<Value> {
    json_item(&PyValue(item.clone())).map_err(|e| field_error(py, label, e))
}

/// A Python value as a JSON value ([`json_value`]).
pub(crate) fn to_value(obj: &Bound<'_, PyAny>) -> Result<Value, FieldError> {
    json_value(&PyValue(obj.clone()))
}

/// The calibration of opaque payloads a caller asked for ([`OpaqueScale::checked`]).
pub(crate) fn opaque_scale(factor: f64) -> PyResult<OpaqueScale> {
    OpaqueScale::checked(factor).map_err(PyValueError::new_err)
}

pub(crate) fn label(n_history: usize, p: usize) -> String {
    protoprompt_core::graph::position_label(n_history, p)
}

/// The items of a list-like argument (a str or a mapping is refused).
pub(crate) fn item_seq(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<Py<PyAny>>> {
    let refused = || {
        PyTypeError::new_err(format!(
            "{name} must be a list of items, got {}",
            type_name(obj)
        ))
    };
    if obj.cast::<PyString>().is_ok() || obj.cast::<PyDict>().is_ok() {
        return Err(refused());
    }
    let iter = obj.try_iter().map_err(|_| refused())?;
    iter.map(|r| r.map(|b| b.unbind())).collect()
}

/// Classify the items of `items`, labelled from global position `offset`.
pub(crate) fn classify_items<'py>(
    py: Python<'py>,
    items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
    offset: usize,
    n_history: usize,
) -> PyResult<Vec<ItemMeta>> {
    let mut metas = Vec::with_capacity(items.len());
    for (i, item) in items.enumerate() {
        let raw =
            extract_raw(&item).map_err(|e| field_error(py, &label(n_history, offset + i), e))?;
        metas.push(ItemMeta::new(raw));
    }
    Ok(metas)
}

/// Classify `items` in chunks, as the index appends them (`IndexedHistory::append_classified`):
/// each call classifies the next `count`, labelled from global position `first`.
pub(crate) fn chunks<'py, I: Iterator<Item = Bound<'py, PyAny>>>(
    py: Python<'py>,
    mut items: I,
    n_history: usize,
) -> impl FnMut(usize, usize) -> PyResult<Vec<ItemMeta>> + use<'py, I> {
    move |first, count| {
        let chunk: Vec<Bound<'py, PyAny>> = items.by_ref().take(count).collect();
        classify_items(py, chunk.into_iter(), first, n_history)
    }
}

/// The bound items of a list of owned references.
pub(crate) fn bound<'a, 'py>(
    py: Python<'py>,
    items: &'a [Py<PyAny>],
) -> impl ExactSizeIterator<Item = Bound<'py, PyAny>> + 'a
where
    'py: 'a,
{
    items.iter().map(move |i| i.bind(py).clone())
}

/// Extract and classify every item of `history ++ new_input` (GIL held).
pub(crate) fn classify_all(
    py: Python<'_>,
    history: &Bound<'_, PyAny>,
    new_input: &Bound<'_, PyAny>,
) -> PyResult<(Vec<Py<PyAny>>, Vec<ItemMeta>, usize)> {
    let mut items = item_seq(history, "history")?;
    let n_history = items.len();
    items.extend(item_seq(new_input, "new_input")?);
    let metas = classify_items(py, bound(py, &items), 0, n_history)?;
    Ok((items, metas, n_history))
}

/// A JSON value as the Python value it came from (dicts, lists, str, int, float, bool, None).
pub(crate) fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                PyInt::new(py, i).into_any()
            } else if let Some(u) = n.as_u64() {
                PyInt::new(py, u).into_any()
            } else {
                PyFloat::new(py, n.as_f64().unwrap_or(f64::NAN)).into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for v in items {
                list.append(to_py(py, v)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}
