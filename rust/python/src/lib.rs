//! `protoprompt._core`: PyO3 bindings over `protoprompt-core`.
//!
//! Thin by design: extract Python input into owned Rust values, release the GIL, run the core,
//! convert the result back and map errors to the exception classes of `protoprompt.errors`.
//! Item contents are read lazily — only items whose cost the packer needs are converted.

use protoprompt_core::costs::{
    CostEngine, CostMemo, CostPayload, CountStore, ItemSource, StoreError, StoreTally,
    SwitchedCosts,
};
use protoprompt_core::decisions::DecisionRows;
use protoprompt_core::graph::{build_graph, Graph};
use protoprompt_core::incremental::{reserve_ahead, HistoryIndex as CoreIndex, Mark, TailGraph};
use protoprompt_core::items::{
    GraphField, ItemError, ItemFields, ItemMeta, ItemValue, NotText, RawItem,
};
use protoprompt_core::pack::{
    pack_view, ContextHook, CostFailure, CostSource, Decision, PackError, PackOptions, PackResult,
    Policy, UnitDecision,
};
use protoprompt_core::tokens::{self, Encoding, TokenError, MAX_DEPTH};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple};
use pyo3::{PyErrArguments, PyTypeInfo};
use rustc_hash::FxHashMap;
use serde_json::{Map, Number, Value};
use std::sync::{Arc, Mutex, Weak};

/// mimalloc: the packer allocates and frees many small strings per item; glibc's malloc
/// showed pauses of hundreds of microseconds (fastbin consolidation) on the first allocation
/// after a large history was freed.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// ---------------------------------------------------------------------------------------------
// Errors

/// The exception classes of `protoprompt.errors`, imported as Python types (the module
/// is imported when `_core` is, so a missing class is an import error, never a panic).
mod errors {
    pyo3::import_exception!(protoprompt.errors, HistoryMismatchError);
    pyo3::import_exception!(protoprompt.errors, InvalidItemError);
    pyo3::import_exception!(protoprompt.errors, InvalidNewInputError);
    pyo3::import_exception!(protoprompt.errors, SnapshotError);
    pyo3::import_exception!(protoprompt.errors, TokenBudgetExceededError);
    pyo3::import_exception!(protoprompt.errors, TokenizerError);
    pyo3::import_exception!(protoprompt.errors, UnknownEncodingError);
    pyo3::import_exception!(protoprompt.errors, UnknownModelError);
}

/// An exception of class `E` (one of [`errors`]) built from `args`.
fn raise<E: PyTypeInfo>(py: Python<'_>, args: impl PyErrArguments + 'static) -> PyErr {
    PyErr::from_type(py.get_type::<E>(), args)
}

fn item_error(py: Python<'_>, label: &str, field: &str, message: &str) -> PyErr {
    raise::<errors::InvalidItemError>(
        py,
        (
            format!("{label}: field {field}: {message}"),
            label.to_string(),
            field.to_string(),
        ),
    )
}

fn token_error(py: Python<'_>, e: TokenError) -> PyErr {
    match &e {
        TokenError::UnknownModel(m) => {
            raise::<errors::UnknownModelError>(py, (e.to_string(), m.clone()))
        }
        TokenError::UnknownEncoding(n) => {
            raise::<errors::UnknownEncodingError>(py, (e.to_string(), n.clone()))
        }
        TokenError::BadItem { field, message } => item_error(py, "item", field, message),
        TokenError::Tokenizer(_) => raise::<errors::TokenizerError>(py, (e.to_string(),)),
    }
}

fn pack_error(py: Python<'_>, e: PackError) -> PyErr {
    match e {
        PackError::BudgetExceeded {
            used,
            budget,
            section,
        } => raise::<errors::TokenBudgetExceededError>(py, (used, budget, section.name())),
        PackError::InvalidNewInput {
            ref label,
            ref reasons,
            ..
        } => raise::<errors::InvalidNewInputError>(
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

// ---------------------------------------------------------------------------------------------
// Python -> Rust

/// A readable name of a Python value's type for error messages.
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_string())
}

/// Borrow `obj` as a dict: a dict as is, any other Mapping copied into one (`Ok(None)`: not
/// a mapping). A mapping whose `items()` (or whatever it calls) raises is an error that
/// carries that exception as its cause.
fn as_dict<'py>(
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
        FieldError::caused(field, message, e)
    };
    let dict = PyDict::new(obj.py());
    let items = mapping.items().map_err(failed)?;
    for pair in items.iter() {
        let (k, v): (Bound<'py, PyAny>, Bound<'py, PyAny>) = pair.extract().map_err(failed)?;
        dict.set_item(k, v).map_err(failed)?;
    }
    Ok(Some(dict))
}

/// Why an item cannot be read: the field (a path inside the item), what is wrong with it,
/// and the Python exception behind it if one was raised (it becomes the `__cause__`).
struct FieldError {
    field: String,
    message: String,
    cause: Option<PyErr>,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            message: message.into(),
            cause: None,
        }
    }

    fn caused(field: impl Into<String>, message: impl Into<String>, cause: PyErr) -> FieldError {
        FieldError {
            cause: Some(cause),
            ..FieldError::new(field, message)
        }
    }

    /// The `InvalidItemError` for the item at `label`, chained to the cause.
    fn raise(self, py: Python<'_>, label: &str) -> PyErr {
        let err = item_error(py, label, &self.field, &self.message);
        if let Some(cause) = self.cause {
            err.set_cause(py, Some(cause));
        }
        err
    }
}

impl From<ItemError> for FieldError {
    fn from(e: ItemError) -> FieldError {
        FieldError::new(e.field, e.message)
    }
}

/// A Python value inside an item, as the core's one item reader ([`ItemFields::read`]) sees it.
struct PyValue<'py>(Bound<'py, PyAny>);

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
        let value = map.get_item(key).map_err(|e| {
            let message = e.to_string();
            FieldError::caused(field, message, e)
        })?;
        Ok(value.map(PyValue))
    }
}

/// Read the graph-relevant fields of one item: one pass over its entries (an item has a
/// handful of keys; twelve keyed lookups cost more) collects the graph fields, which the
/// core's reader then checks and interprets. A dict is read in place: its other values are
/// not touched.
fn extract_raw(obj: &Bound<'_, PyAny>) -> Result<RawItem, FieldError> {
    let py = obj.py();
    let dict = as_dict(obj, "(item)")?.ok_or_else(|| {
        FieldError::new(
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
            return Err(FieldError::new(
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

/// Convert a JSON-like Python value to serde_json, naming the field path on failure.
///
/// Only Python code of the item itself can run meanwhile (a list subclass's `__iter__`, a
/// mapping's `items()`); if it changes a dict being read, PyO3's iterator panics: the
/// panic is caught (silently) and reported as an error naming the item.
fn to_value(obj: &Bound<'_, PyAny>, path: &mut String, depth: usize) -> Result<Value, FieldError> {
    let saved = path.len();
    let caught = tokens::quietly(std::panic::AssertUnwindSafe(|| value_of(obj, path, depth)));
    caught.unwrap_or_else(|_| {
        path.truncate(saved);
        Err(FieldError::new(
            "(item)",
            "changed while it was being read (by its own code or another thread)",
        ))
    })
}

fn value_of(obj: &Bound<'_, PyAny>, path: &mut String, depth: usize) -> Result<Value, FieldError> {
    let here = |path: &String| {
        if path.is_empty() {
            "(item)".to_string()
        } else {
            path.clone()
        }
    };
    if depth > MAX_DEPTH {
        return Err(FieldError::new(
            here(path),
            format!("nesting deeper than {MAX_DEPTH} levels"),
        ));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return s
            .to_str()
            .map(|s| Value::String(s.to_string()))
            .map_err(|_| FieldError::new(here(path), "is not valid UTF-8 text (lone surrogate?)"));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.cast::<PyInt>().is_ok() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::Number(i.into()));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::Number(u.into()));
        }
        // Arbitrary-size integer: keep its exact decimal text (it is counted as text).
        return obj
            .str()
            .map(|s| Value::String(s.to_string()))
            .map_err(|e| {
                let message = e.to_string();
                FieldError::caused(here(path), message, e)
            });
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        let v = f.value();
        return Number::from_f64(v).map(Value::Number).ok_or_else(|| {
            FieldError::new(
                here(path),
                format!("{v} is not a JSON number (NaN or infinity)"),
            )
        });
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in d.iter() {
            let key = match k.cast::<PyString>() {
                Ok(s) => s
                    .to_str()
                    .map_err(|_| FieldError::new(here(path), "has a key that is not valid UTF-8"))?
                    .to_string(),
                Err(_) => {
                    return Err(FieldError::new(
                        here(path),
                        format!("has a non-string key of type {}", type_name(&k)),
                    ))
                }
            };
            let saved = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(&key);
            let value = value_of(&v, path, depth + 1)?;
            path.truncate(saved);
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    if obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok() {
        let failed = |path: &String, e: PyErr| {
            let message = e.to_string();
            FieldError::caused(here(path), message, e)
        };
        let mut out = Vec::new();
        for (i, v) in obj.try_iter().map_err(|e| failed(path, e))?.enumerate() {
            let v = v.map_err(|e| failed(path, e))?;
            let saved = path.len();
            path.push_str(&format!("[{i}]"));
            out.push(value_of(&v, path, depth + 1)?);
            path.truncate(saved);
        }
        return Ok(Value::Array(out));
    }
    if let Some(d) = as_dict(obj, &here(path))? {
        return value_of(d.as_any(), path, depth);
    }
    Err(FieldError::new(
        here(path),
        format!("{} is not a JSON value", type_name(obj)),
    ))
}

fn resolve_encoding(model: Option<&str>, encoding: Option<&str>) -> Result<Encoding, TokenError> {
    match (encoding, model) {
        (Some(e), _) => Encoding::from_name(e),
        (None, Some(m)) => Encoding::for_model(m),
        (None, None) => Ok(Encoding::O200kBase),
    }
}

fn label(n_history: usize, p: usize) -> String {
    protoprompt_core::graph::position_label(n_history, p)
}

/// The items of a list-like argument (a str or a mapping is refused).
fn item_seq(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<Py<PyAny>>> {
    let seq = |obj: &Bound<'_, PyAny>, name: &str| -> PyResult<Vec<Py<PyAny>>> {
        if obj.cast::<PyString>().is_ok() || obj.cast::<PyDict>().is_ok() {
            return Err(PyTypeError::new_err(format!(
                "{name} must be a list of items, got {}",
                type_name(obj)
            )));
        }
        let iter = obj.try_iter().map_err(|_| {
            PyTypeError::new_err(format!(
                "{name} must be a list of items, got {}",
                type_name(obj)
            ))
        })?;
        iter.map(|r| r.map(|b| b.unbind())).collect()
    };
    seq(obj, name)
}

/// Classify the items of `items`, labelled from global position `offset`.
fn classify_items<'py>(
    py: Python<'py>,
    items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
    offset: usize,
    n_history: usize,
) -> PyResult<Vec<ItemMeta>> {
    let mut metas = Vec::with_capacity(items.len());
    for (i, item) in items.enumerate() {
        let raw = extract_raw(&item).map_err(|e| e.raise(py, &label(n_history, offset + i)))?;
        metas.push(ItemMeta::new(raw));
    }
    Ok(metas)
}

/// The bound items of a list of owned references.
fn bound<'a, 'py>(
    py: Python<'py>,
    items: &'a [Py<PyAny>],
) -> impl ExactSizeIterator<Item = Bound<'py, PyAny>> + 'a
where
    'py: 'a,
{
    items.iter().map(move |i| i.bind(py).clone())
}

/// Extract and classify every item of `history ++ new_input` (GIL held).
fn classify_all(
    py: Python<'_>,
    history: &Bound<'_, PyAny>,
    new_input: &Bound<'_, PyAny>,
) -> PyResult<(Vec<Py<PyAny>>, Vec<ItemMeta>, usize)> {
    let seq = item_seq;
    let mut items = seq(history, "history")?;
    let n_history = items.len();
    items.extend(seq(new_input, "new_input")?);
    let metas = classify_items(py, bound(py, &items), 0, n_history)?;
    Ok((items, metas, n_history))
}

/// The items of one call, read by position from the caller's lists under the GIL and
/// converted to JSON values for the core's cost engine ([`CostEngine`]).
///
/// Items are read only when their cost is needed. What a call reads stays what it read: the
/// history items it classifies are taken from the caller's list in one step when the call
/// begins (`fresh`), and an earlier position, read from the list when first needed, is kept
/// (`read`), so the objects a result returns are the objects that were classified and
/// counted, whatever another thread or an item's own code does to the caller's list meanwhile.
struct PyItems {
    /// The caller's history list, read for positions before `fresh_from` (which an index
    /// has seen in earlier calls). It holds positions `offset..`: a windowed read hands over
    /// the newest part of the history only, and earlier positions are never read.
    history: Py<PyList>,
    offset: usize,
    /// `history[fresh_from..n_history]` as it was when the call began.
    fresh: Py<PyList>,
    fresh_from: usize,
    /// History objects before `fresh_from` read by this call, by position.
    read: FxHashMap<usize, Py<PyAny>>,
    new_input: Vec<Py<PyAny>>,
    n_history: usize,
    /// The Python exception behind the last item that could not be read or converted.
    cause: Option<PyErr>,
}

/// A persistent count store handed to `HistoryIndex.pack` (`count_store=`): an object with
/// `secret` (16 bytes) and `get_many(keys: list[bytes]) -> list[int | None]`; the core's
/// cost engine decides what to ask it ([`protoprompt_core::costs`]).
struct PyCountStore {
    store: Py<PyAny>,
    secret: [u8; 16],
    /// What `get_many` raised (or why its answer was refused); the pack fails with it.
    error: Option<PyErr>,
}

impl PyCountStore {
    fn from_py(store: &Bound<'_, PyAny>) -> PyResult<PyCountStore> {
        let secret = store.getattr(intern!(store.py(), "secret"))?;
        let secret: [u8; 16] = secret
            .extract::<Vec<u8>>()
            .ok()
            .filter(|_| secret.is_instance_of::<pyo3::types::PyBytes>())
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| PyTypeError::new_err("count_store.secret must be 16 bytes"))?;
        if !store
            .getattr(intern!(store.py(), "get_many"))?
            .is_callable()
        {
            return Err(PyTypeError::new_err(
                "count_store.get_many must be callable",
            ));
        }
        Ok(PyCountStore {
            store: store.clone().unbind(),
            secret,
            error: None,
        })
    }

    /// The stored counts of `keys` (`None` where the store has none), under the GIL.
    fn ask(&self, keys: &[[u8; 16]]) -> PyResult<Vec<Option<u64>>> {
        Python::attach(|py| {
            let list = PyList::new(py, keys.iter().map(|k| pyo3::types::PyBytes::new(py, k)))?;
            let answer = self
                .store
                .bind(py)
                .call_method1(intern!(py, "get_many"), (list,))?;
            let refuse = || {
                PyValueError::new_err(format!(
                    "count_store.get_many must return a list of {} ints >= 0 or None, got {}",
                    keys.len(),
                    answer.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            };
            let answer = answer.cast::<PyList>().map_err(|_| refuse())?;
            if answer.len() != keys.len() {
                return Err(refuse());
            }
            answer
                .iter()
                .map(|v| {
                    if v.is_none() {
                        Ok(None)
                    } else if v.is_instance_of::<PyBool>() {
                        Err(refuse())
                    } else {
                        v.extract::<u64>().map(Some).map_err(|_| refuse())
                    }
                })
                .collect()
        })
    }
}

impl CountStore for PyCountStore {
    fn secret(&self) -> [u8; 16] {
        self.secret
    }

    fn get_many(&mut self, keys: &[[u8; 16]]) -> Result<Vec<Option<u64>>, StoreError> {
        self.ask(keys).map_err(|e| {
            let message = e.to_string();
            self.error = Some(e);
            StoreError { message }
        })
    }
}

/// The cost engine of one call over the caller's Python lists and store.
type PyCosts<'m> = CostEngine<'m, PyItems, PyCountStore>;

/// What a call did with its count store, as the result's `new_counts` and `store_hits`;
/// the store's own exception if it failed.
fn store_outcome(
    py: Python<'_>,
    out: &Bound<'_, PyDict>,
    link: Option<(PyCountStore, StoreTally)>,
) -> PyResult<()> {
    let Some((_, tally)) = link else {
        return Ok(());
    };
    let pairs = tally
        .new_counts
        .iter()
        .map(|(k, n)| (pyo3::types::PyBytes::new(py, k), *n));
    out.set_item("new_counts", PyList::new(py, pairs)?)?;
    out.set_item("store_hits", tally.hits)?;
    Ok(())
}

/// Why an item an index had seen cannot be read back from the caller's history list.
const GONE: &str = "is no longer in the history list: the items an index has seen must \
                    stay as they are, also while a call runs (another thread or an item's \
                    own code changed the list)";

/// Why a pack of a history suffix (`history_offset`) cannot read an earlier item.
const BEFORE_OFFSET: &str = "is before history_offset, not in the history list: a pack of \
                             the newest items only may not need it (read the history from \
                             HistoryIndex.window_start on)";

impl PyItems {
    fn new(
        history: Py<PyList>,
        fresh: Py<PyList>,
        fresh_from: usize,
        n_history: usize,
        new_input: Vec<Py<PyAny>>,
    ) -> Self {
        PyItems {
            history,
            offset: 0,
            fresh,
            fresh_from,
            read: FxHashMap::default(),
            new_input,
            n_history,
            cause: None,
        }
    }

    /// The history list starts at position `offset` (see the field).
    fn with_offset(mut self, offset: usize) -> Self {
        self.offset = offset;
        self
    }

    /// The object at global position `p` as this call reads it (see the type's note); an
    /// `IndexError` if the caller's list lost a position the index had seen.
    fn item<'py>(&mut self, py: Python<'py>, p: usize) -> PyResult<Bound<'py, PyAny>> {
        if p >= self.n_history {
            return Ok(self.new_input[p - self.n_history].bind(py).clone());
        }
        if p >= self.fresh_from {
            return self.fresh.bind(py).get_item(p - self.fresh_from);
        }
        if let Some(obj) = self.read.get(&p) {
            return Ok(obj.bind(py).clone());
        }
        if p < self.offset {
            return Err(PyIndexError::new_err(BEFORE_OFFSET));
        }
        let obj = self.history.bind(py).get_item(p - self.offset)?;
        self.read.insert(p, obj.clone().unbind());
        Ok(obj)
    }

    /// The kept history objects followed by every new-input object: what the caller sends.
    fn request<'py>(&mut self, py: Python<'py>, kept: &[usize]) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::with_capacity(kept.len() + self.new_input.len());
        let history = self.history.bind(py);
        let fresh = self.fresh.bind(py);
        for &p in kept {
            let item = if p >= self.fresh_from {
                fresh.get_item(p - self.fresh_from)
            } else if let Some(obj) = self.read.get(&p) {
                Ok(obj.bind(py).clone())
            } else if p < self.offset {
                Err(PyIndexError::new_err(BEFORE_OFFSET))
            } else {
                history.get_item(p - self.offset) // read once, here: nothing to remember it for
            };
            out.push(item.map_err(|e| {
                let label = label(self.n_history, p);
                let why = if p < self.offset { BEFORE_OFFSET } else { GONE };
                FieldError::caused("(item)", why, e).raise(py, &label)
            })?);
        }
        out.extend(self.new_input.iter().map(|o| o.bind(py).clone()));
        PyList::new(py, out)
    }
}

impl ItemSource for PyItems {
    fn values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        Python::attach(|py| {
            let mut values = Vec::with_capacity(positions.len());
            for &p in positions {
                let item = self.item(py, p).map_err(|e| {
                    self.cause = Some(e);
                    CostFailure {
                        position: p,
                        field: "(item)".to_string(),
                        message: if p < self.offset { BEFORE_OFFSET } else { GONE }.to_string(),
                    }
                })?;
                let mut path = String::new();
                match to_value(&item, &mut path, 0) {
                    Ok(v) => values.push(v),
                    Err(e) => {
                        self.cause = e.cause;
                        return Err(CostFailure {
                            position: p,
                            field: e.field,
                            message: e.message,
                        });
                    }
                }
            }
            Ok(values)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Functions

/// Count the tokens of `text` with an encoding (by name or model; default o200k_base).
#[pyfunction]
#[pyo3(signature = (text, *, model=None, encoding=None))]
fn count_tokens(
    py: Python<'_>,
    text: &str,
    model: Option<&str>,
    encoding: Option<&str>,
) -> PyResult<u64> {
    let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
    if text.len() < 4096 {
        if !enc.is_loaded() {
            py.detach(|| enc.load()); // the first build takes ~0.1 s: not under the GIL
        }
        return enc.count(text).map_err(|e| token_error(py, e));
    }
    let owned = text.to_string();
    py.detach(move || enc.count(&owned))
        .map_err(|e| token_error(py, e))
}

/// Count many texts at once (one GIL release).
#[pyfunction]
#[pyo3(signature = (texts, *, model=None, encoding=None))]
fn count_tokens_batch(
    py: Python<'_>,
    texts: Vec<String>,
    model: Option<&str>,
    encoding: Option<&str>,
) -> PyResult<Vec<u64>> {
    let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
    py.detach(move || {
        texts
            .iter()
            .map(|t| enc.count(t))
            .collect::<Result<Vec<_>, _>>()
    })
    .map_err(|e| token_error(py, e))
}

/// The text of the first `head` and the last `tail` tokens of `text`, its token count, and
/// whether anything was cut between them (see `protoprompt_core::truncate`).
#[pyfunction]
#[pyo3(signature = (text, head, tail, *, model=None, encoding=None))]
fn split_tokens(
    py: Python<'_>,
    text: &str,
    head: u64,
    tail: u64,
    model: Option<&str>,
    encoding: Option<&str>,
) -> PyResult<(String, String, u64, bool)> {
    let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
    let owned = text.to_string();
    py.detach(move || {
        protoprompt_core::truncate::split_tokens(enc, &owned, head, tail)
            .map(|s| (s.head.to_string(), s.tail.to_string(), s.total, s.cut))
    })
    .map_err(|e| token_error(py, e))
}

/// The encoding name used for `model`.
#[pyfunction]
fn encoding_for_model(py: Python<'_>, model: &str) -> PyResult<&'static str> {
    Encoding::for_model(model)
        .map(Encoding::name)
        .map_err(|e| token_error(py, e))
}

/// Names of the encodings this build ships.
#[pyfunction]
fn available_encodings() -> Vec<&'static str> {
    Encoding::ALL.iter().map(|e| e.name()).collect()
}

/// Build an encoding's tokenizer now (once per process), so that the first count or pack
/// does not pay for it. With `wait=False` the build runs on a background thread (a `fork`
/// meanwhile waits for it to finish, see `fork_guard`). Returns the encoding name.
#[pyfunction]
#[pyo3(signature = (*, model=None, encoding=None, wait=true))]
fn preload(
    py: Python<'_>,
    model: Option<&str>,
    encoding: Option<&str>,
    wait: bool,
) -> PyResult<&'static str> {
    let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
    if !enc.is_loaded() {
        if wait {
            py.detach(|| enc.load());
        } else {
            std::thread::Builder::new()
                .name("protoprompt-preload".to_string())
                .spawn(move || enc.load())
                .map_err(|e| {
                    PyValueError::new_err(format!("cannot start the preload thread: {e}"))
                })?;
        }
    }
    Ok(enc.name())
}

/// Whether an encoding's tokenizer has been built in this process.
#[pyfunction]
#[pyo3(signature = (*, model=None, encoding=None))]
fn is_preloaded(py: Python<'_>, model: Option<&str>, encoding: Option<&str>) -> PyResult<bool> {
    let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
    Ok(enc.is_loaded())
}

/// Token cost of one item under the documented cost model.
#[pyfunction]
#[pyo3(signature = (item, *, model=None, encoding=None))]
fn item_tokens(
    py: Python<'_>,
    item: &Bound<'_, PyAny>,
    model: Option<&str>,
    encoding: Option<&str>,
) -> PyResult<(u64, u64, u64)> {
    let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
    if as_dict(item, "(item)")
        .map_err(|e| e.raise(py, "item"))?
        .is_none()
    {
        return Err(item_error(
            py,
            "item",
            "(item)",
            &format!("an item must be a mapping (dict), got {}", type_name(item)),
        ));
    }
    let mut path = String::new();
    let value = to_value(item, &mut path, 0).map_err(|e| e.raise(py, "item"))?;
    let cost = py
        .detach(move || tokens::item_cost(&value, enc))
        .map_err(|e| token_error(py, e))?;
    Ok((cost.text, cost.media, cost.overhead))
}

/// The canonical text of an item (what its text cost is counted on).
#[pyfunction]
fn canonical_text(py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut path = String::new();
    let value = to_value(item, &mut path, 0).map_err(|e| e.raise(py, "item"))?;
    tokens::canonical(&value, Encoding::O200kBase)
        .map(|c| c.text)
        .map_err(|e| token_error(py, e))
}

fn graph_dict<'py>(
    py: Python<'py>,
    graph: &Graph,
    metas: &[ItemMeta],
) -> PyResult<Bound<'py, PyDict>> {
    let n = graph.n_history;
    let units = PyList::empty(py);
    for unit in &graph.units {
        let d = PyDict::new(py);
        let members: Vec<String> = unit.members.iter().map(|&p| label(n, p)).collect();
        d.set_item("members", members)?;
        d.set_item("positions", unit.members.clone())?;
        d.set_item(
            "kinds",
            unit.members
                .iter()
                .map(|&p| metas[p].kind_name())
                .collect::<Vec<_>>(),
        )?;
        d.set_item("valid", unit.is_valid())?;
        d.set_item("input_only", unit.is_input_only())?;
        d.set_item("contains_new", unit.contains_new)?;
        let problems: Vec<(&str, &str, String)> = unit
            .problems
            .iter()
            .map(|p| (p.reason.code(), p.reason.message(), label(n, p.position)))
            .collect();
        d.set_item("problems", problems)?;
        units.append(d)?;
    }
    let out = PyDict::new(py);
    out.set_item("units", units)?;
    out.set_item("n_history", n)?;
    out.set_item("mandatory_history", graph.mandatory_history())?;
    Ok(out)
}

/// Split `history ++ new_input` into atomic units (no counting).
#[pyfunction]
fn analyze<'py>(
    py: Python<'py>,
    history: &Bound<'py, PyAny>,
    new_input: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let (_items, metas, n_history) = classify_all(py, history, new_input)?;
    let graph = py.detach(|| build_graph(&metas[..n_history], &metas[n_history..]));
    graph_dict(py, &graph, &metas)
}

/// Builds an encoding's tokenizer on a helper thread while the calling thread reads the
/// items (which needs the GIL): the first call in a process does both at once. The helper
/// is joined before the call returns, whatever happens, so no thread outlives the call.
struct Preload(Option<std::thread::JoinHandle<()>>);

impl Preload {
    fn start(enc: Encoding) -> Preload {
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
    fn finish(mut self, py: Python<'_>) {
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

/// The options shared by `pack` and `HistoryIndex.pack`.
fn pack_options(
    budget: u64,
    output_reserve: u64,
    context_tokens: u64,
    policy: &str,
) -> PyResult<PackOptions> {
    let policy = Policy::from_name(policy).ok_or_else(|| {
        PyValueError::new_err(format!(
            "policy must be \"contiguous\" or \"greedy\", got {policy:?}"
        ))
    })?;
    Ok(PackOptions {
        budget,
        output_reserve,
        context_tokens,
        policy,
    })
}

/// Run `f` (the core pack) with the GIL released and a context hook calling `context`.
fn run_pack<'py>(
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

/// Small table of the kind names met so far: positions store a one-byte code.
#[derive(Default, Clone)]
struct KindNames(Vec<&'static str>);

impl KindNames {
    fn code(&mut self, name: &'static str) -> u8 {
        if let Some(i) = self
            .0
            .iter()
            .position(|n| std::ptr::eq(*n, name) || *n == name)
        {
            return i as u8;
        }
        self.0.push(name);
        (self.0.len() - 1) as u8
    }
}

/// The per-unit decisions of one pack. Only what the fill touched is stored; a row is
/// derived from the (shared) graph when Python reads it, so a pack over a long history
/// allocates nothing per unit. The index it came from detaches it before it changes
/// ([`DecisionRows::detach`]), so a kept table never makes the index copy its graph.
#[pyclass(frozen, module = "protoprompt._core")]
struct DecisionTable {
    rows: usize,
    source: Arc<Mutex<DecisionRows>>,
    touched: FxHashMap<usize, UnitDecision>,
    kind_names: Vec<&'static str>,
}

impl DecisionTable {
    fn new(
        prefix: Arc<Graph>,
        tail: Option<TailGraph>,
        result: &mut PackResult,
        kinds: Arc<Vec<u8>>,
        kind_names: &KindNames,
    ) -> Self {
        let rows = DecisionRows::new(prefix, tail, kinds);
        DecisionTable {
            rows: rows.rows(),
            source: Arc::new(Mutex::new(rows)),
            touched: std::mem::take(&mut result.touched),
            kind_names: kind_names.0.clone(),
        }
    }

    fn source(&self) -> std::sync::MutexGuard<'_, DecisionRows> {
        lock(&self.source)
    }

    fn decision(&self, u: usize, untouched: Decision) -> UnitDecision {
        self.touched.get(&u).copied().unwrap_or(UnitDecision {
            unit: u,
            decision: untouched,
            tokens: None,
        })
    }
}

/// A decision table's rows, locked (a panic while they were locked cannot leave them torn:
/// a detach replaces them whole).
fn lock(rows: &Mutex<DecisionRows>) -> std::sync::MutexGuard<'_, DecisionRows> {
    rows.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

type DecisionRow = (
    usize,
    Vec<usize>,
    Vec<&'static str>,
    &'static str,
    Option<u64>,
    Vec<(&'static str, &'static str, String)>,
);

#[pymethods]
impl DecisionTable {
    fn __len__(&self) -> usize {
        self.rows
    }

    /// `(unit, positions, kinds, code, tokens, problems)` of one row.
    fn row(&self, i: usize) -> PyResult<DecisionRow> {
        if i >= self.rows {
            return Err(pyo3::exceptions::PyIndexError::new_err(
                "decision index out of range",
            ));
        }
        let (row, n_history) = {
            let source = self.source();
            (source.row(i), source.n_history())
        };
        let kinds = row
            .kinds
            .iter()
            .map(|&k| self.kind_names[k as usize])
            .collect();
        let problems = row
            .problems
            .iter()
            .map(|p| {
                (
                    p.reason.code(),
                    p.reason.message(),
                    label(n_history, p.position),
                )
            })
            .collect();
        let d = self.decision(i, row.untouched);
        Ok((
            i,
            row.positions,
            kinds,
            d.decision.code(),
            d.tokens,
            problems,
        ))
    }

    /// Number of history items per decision code.
    fn item_counts(&self) -> FxHashMap<&'static str, usize> {
        self.tally(|n| n)
    }

    /// Number of units (with history items) per decision code.
    fn unit_counts(&self) -> FxHashMap<&'static str, usize> {
        self.tally(|n| usize::from(n > 0))
    }
}

impl DecisionTable {
    /// Sum of `weight(history items of the unit)` per decision code.
    fn tally(&self, weight: impl Fn(usize) -> usize) -> FxHashMap<&'static str, usize> {
        let source = self.source();
        let mut counts = FxHashMap::default();
        for u in 0..self.rows {
            let (n, untouched) = source.size_and_untouched(u);
            *counts
                .entry(self.decision(u, untouched).decision.code())
                .or_insert(0) += weight(n);
        }
        counts
    }
}

fn result_dict<'py>(
    py: Python<'py>,
    result: &PackResult,
    enc: Encoding,
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
    out.set_item("encoding", enc.name())?;
    out.set_item("policy", policy.name())?;
    out.set_item("decisions", Bound::new(py, decisions)?)?;
    Ok(out)
}

/// The classified history of one session, extended as it grows, so that packing the next
/// turn costs what is new and what is kept rather than the whole history.
#[pyclass(module = "protoprompt._core")]
struct HistoryIndex {
    index: CoreIndex,
    /// Kind of every indexed position (a code into `kind_names`, for decision tables).
    kinds: Arc<Vec<u8>>,
    kind_names: KindNames,
    /// Cost of every indexed position under one encoding (counted when needed).
    costs: CostMemo,
    /// The decision tables of earlier packs that may still share the graph and kinds.
    live: Vec<Weak<Mutex<DecisionRows>>>,
}

/// Items classified per step when appending to an index (bounds the full-size copies: up to
/// three chunks are alive while pipelined). At 100k items, 2048 gave the speed of 4096 with
/// a peak 6-8 MB lower (4096: +13-19 MB over the unpipelined path, 1024: slower).
const CLASSIFY_CHUNK: usize = 2048;

impl HistoryIndex {
    /// Classify `items` and append them, one chunk at a time, so that only a few chunks of
    /// full-size classified items exist at once. Positions continue from `len(self)`; labels
    /// treat positions from `n_history` on as `new_input`. On a bad item the index is put back
    /// as it was and the error names the item and field.
    ///
    /// A long history is pipelined: this thread reads the Python items (it needs the GIL)
    /// while a scoped helper thread appends the previous chunk to the core index (no GIL), so
    /// a cold start costs about the larger of the two instead of their sum.
    fn classify_into<'py>(
        &mut self,
        py: Python<'py>,
        items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
        n_history: usize,
    ) -> PyResult<()> {
        self.release_results();
        let start = self.index.len();
        let mark = self.index.mark();
        let (kinds_capacity, costs_capacity) = (self.kinds.capacity(), self.costs.capacity());
        let outcome = if items.len() <= CLASSIFY_CHUNK {
            classify_items(py, items, start, n_history).map(|metas| {
                self.note_kinds(&metas, 0);
                let index = &mut self.index;
                py.detach(|| index.extend(metas));
            })
        } else {
            self.classify_pipelined(py, items, n_history)
        };
        if outcome.is_err() {
            // Back to exactly what it was, memory included.
            Arc::make_mut(&mut self.kinds).truncate(start);
            let index = &mut self.index;
            py.detach(|| index.undo_to(mark));
            Arc::make_mut(&mut self.kinds).shrink_to(kinds_capacity);
            self.costs.shrink_back(start, costs_capacity);
        }
        outcome
    }

    fn classify_pipelined<'py>(
        &mut self,
        py: Python<'py>,
        mut items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
        n_history: usize,
    ) -> PyResult<()> {
        let mut position = self.index.len();
        let HistoryIndex {
            index,
            kinds,
            kind_names,
            costs,
            ..
        } = self;
        std::thread::scope(|scope| {
            // Chunk and the number of items still to come after it.
            let (send, receive) = std::sync::mpsc::sync_channel::<(Vec<ItemMeta>, usize)>(1);
            let helper = scope.spawn(move || {
                let mut first = true;
                for (metas, rest) in receive {
                    index.extend(metas);
                    if std::mem::take(&mut first) && rest > 0 {
                        // Sized from the first chunk: the rest is stored without regrowth.
                        index.reserve(rest);
                    }
                }
            });
            let mut outcome = Ok(());
            while items.len() > 0 {
                let chunk: Vec<Bound<'py, PyAny>> = items.by_ref().take(CLASSIFY_CHUNK).collect();
                if chunk.is_empty() {
                    break; // an iterator whose length was wrong: never loop on nothing
                }
                match classify_items(py, chunk.into_iter(), position, n_history) {
                    Ok(metas) => {
                        position += metas.len();
                        let rest = items.len();
                        note_kinds(kinds, kind_names, costs, &metas, rest);
                        // Wait for the helper (when it is behind) without the GIL, so that
                        // other Python threads run meanwhile.
                        let sent = match send.try_send((metas, rest)) {
                            Err(std::sync::mpsc::TrySendError::Full(chunk)) => {
                                py.detach(|| send.send(chunk).is_ok())
                            }
                            other => other.is_ok(),
                        };
                        if !sent {
                            break; // the helper panicked: reported by the join below
                        }
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            drop(send);
            if let Err(panic) = py.detach(|| helper.join()) {
                std::panic::resume_unwind(panic);
            }
            outcome
        })
    }

    /// Detach the decision tables of earlier packs before the graph or kinds change, so a
    /// kept result never makes the change copy them. Only tables still alive copy anything
    /// (their own rows, compactly).
    fn release_results(&mut self) {
        for table in self.live.drain(..) {
            if let Some(rows) = table.upgrade() {
                lock(&rows).detach();
            }
        }
    }

    fn note_kinds(&mut self, metas: &[ItemMeta], rest: usize) {
        note_kinds(
            &mut self.kinds,
            &mut self.kind_names,
            &mut self.costs,
            metas,
            rest,
        );
    }
}

/// Record the kinds of appended items (and room for their costs); `rest` more are coming.
fn note_kinds(
    kinds: &mut Arc<Vec<u8>>,
    names: &mut KindNames,
    costs: &mut CostMemo,
    metas: &[ItemMeta],
    rest: usize,
) {
    let kinds = Arc::make_mut(kinds);
    let needed = metas.len() + rest;
    let headroom = needed + (kinds.len() + needed) / 8 + 64;
    reserve_ahead(kinds, needed, headroom);
    kinds.extend(metas.iter().map(|m| names.code(m.kind_name())));
    costs.grow(kinds.len(), needed, headroom);
}

#[pymethods]
impl HistoryIndex {
    #[new]
    fn new() -> Self {
        HistoryIndex {
            index: CoreIndex::new(),
            kinds: Arc::default(),
            kind_names: KindNames::default(),
            costs: CostMemo::new(),
            live: Vec::new(),
        }
    }

    fn __len__(&self) -> usize {
        self.index.len()
    }

    /// Approximate bytes of memory the index holds.
    #[getter]
    fn nbytes(&self) -> usize {
        self.index.heap_bytes() + self.kinds.capacity() + self.costs.heap_bytes()
    }

    /// Classify and append history items (positions continue from `len(self)`).
    fn extend(&mut self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<()> {
        let items = item_seq(items, "items")?;
        self.classify_into(py, bound(py, &items), usize::MAX)
    }

    /// Keep only the first `length` items.
    fn truncate(&mut self, py: Python<'_>, length: usize) {
        self.release_results();
        Arc::make_mut(&mut self.kinds).truncate(length);
        self.costs.truncate(length);
        let index = &mut self.index;
        py.detach(|| index.truncate(length));
    }

    /// The index as bytes, token costs included, for `HistoryIndex.from_snapshot` with the
    /// same `bound_to` (see `CoreIndex::to_snapshot`; serialised with the GIL released).
    #[pyo3(signature = (*, bound_to=None))]
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
        bound_to: Option<Bound<'py, PyBytes>>,
    ) -> Bound<'py, PyBytes> {
        let attached = self.costs.payload();
        let binding: &[u8] = bound_to.as_ref().map_or(b"", |b| b.as_bytes());
        let index = &self.index;
        let bytes = py.detach(|| index.to_snapshot(&attached, binding));
        PyBytes::new(py, &bytes)
    }

    /// Load what `snapshot` wrote (by this version of protoprompt, with the same
    /// `bound_to`). Raises `SnapshotError` for anything else; never loads part of one.
    #[staticmethod]
    #[pyo3(signature = (data, *, bound_to=None))]
    fn from_snapshot(
        py: Python<'_>,
        data: &Bound<'_, PyBytes>,
        bound_to: Option<Bound<'_, PyBytes>>,
    ) -> PyResult<Self> {
        let bytes = data.as_bytes();
        let binding: &[u8] = bound_to.as_ref().map_or(b"", |b| b.as_bytes());
        let loaded = py.detach(|| CoreIndex::from_snapshot::<CostPayload>(bytes, binding));
        let (index, attached) =
            loaded.map_err(|e| raise::<errors::SnapshotError>(py, (e.to_string(),)))?;
        let costs = CostMemo::from_payload(attached, index.len()).map_err(|m| {
            raise::<errors::SnapshotError>(py, (format!("damaged index snapshot: {m}"),))
        })?;
        let mut kind_names = KindNames::default();
        let kinds = (0..index.len())
            .map(|p| kind_names.code(index.kind(p).name()))
            .collect();
        Ok(HistoryIndex {
            index,
            kinds: Arc::new(kinds),
            kind_names,
            costs,
            live: Vec::new(),
        })
    }

    /// How many times a change to this index copied its whole graph because a result still
    /// shared it (for tests).
    fn _graph_copies(&self) -> usize {
        self.index.graph_copies()
    }

    /// Forget every item.
    fn clear(&mut self) {
        self.release_results();
        self.index.clear();
        Arc::make_mut(&mut self.kinds).clear();
        self.costs.clear();
    }

    /// Like `pack`, for a `history` whose first `len(self)` items are the ones indexed
    /// (unchanged); the rest is classified and appended first.
    ///
    /// With `count_store` (see `PyCountStore`), long texts' counts are looked up in it before
    /// they are tokenised; the result then has `new_counts` (`(key, tokens)` pairs to write
    /// to it) and `store_hits`.
    ///
    /// `history_offset`: the list holds the history from that position on (a windowed read,
    /// see `window_start`); the positions before it must be indexed, and the pack must not
    /// need their items (an `InvalidItemError` names the first one it would need).
    #[pyo3(signature = (history, new_input, budget, *, output_reserve=0, context_tokens=0, model=None, encoding=None, policy="contiguous", context=None, count_store=None, pinned=None, history_len=None, history_offset=0))]
    #[allow(clippy::too_many_arguments)]
    fn pack<'py>(
        &mut self,
        py: Python<'py>,
        history: &Bound<'py, PyList>,
        new_input: &Bound<'py, PyAny>,
        budget: u64,
        output_reserve: u64,
        context_tokens: u64,
        model: Option<&str>,
        encoding: Option<&str>,
        policy: &str,
        context: Option<Bound<'py, PyAny>>,
        count_store: Option<Bound<'py, PyAny>>,
        pinned: Option<Vec<usize>>,
        history_len: Option<usize>,
        history_offset: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
        let opts = pack_options(budget, output_reserve, context_tokens, policy)?;
        // Only the first `history_len` items of the list are the history (a caller with one
        // long list need not copy its prefix).
        let listed = match history_len {
            Some(n) if n > history.len() => {
                return Err(PyValueError::new_err(format!(
                    "history_len is {n} but the list has {} items",
                    history.len()
                )))
            }
            Some(n) => n,
            None => history.len(),
        };
        let offset = history_offset;
        let n_history = offset.checked_add(listed).ok_or_else(|| {
            PyValueError::new_err(format!("history_offset is {offset}, too large"))
        })?;
        let pinned = pinned.unwrap_or_default();
        if let Some((i, &p)) = pinned
            .iter()
            .enumerate()
            .find(|&(_, &p)| p >= n_history || p < offset)
        {
            return Err(PyValueError::new_err(format!(
                "pinned[{i}] is {p}, not a history position in the list (it holds positions \
                 {offset}..{n_history})"
            )));
        }
        let store = count_store
            .filter(|s| !s.is_none())
            .map(|s| PyCountStore::from_py(&s))
            .transpose()?;
        let indexed = self.index.len();
        if n_history < indexed {
            return Err(raise::<errors::HistoryMismatchError>(
                py,
                (
                    format!(
                        "history has {n_history} items but the index already holds \
                         {indexed}; truncate or clear the index when items are removed"
                    ),
                    n_history,
                    indexed,
                ),
            ));
        }
        if offset > indexed {
            return Err(PyValueError::new_err(format!(
                "history_offset is {offset} but the index holds {indexed} items: the \
                 positions before the list must be indexed"
            )));
        }
        // The items this call reads for the first time, taken in one step: nothing else
        // runs while the slice is made, so whatever another thread or an item's own code
        // does to `history` from now on cannot shift what is classified, counted or sent.
        let fresh = history.get_slice(indexed - offset, listed);
        let new_items = item_seq(new_input, "new_input")?;
        let preload = Preload::start(enc);
        // new_input first: a bad new item must leave the index unchanged.
        let new_metas = classify_items(py, bound(py, &new_items), n_history, n_history)?;
        let mark = self.index.mark();
        let switched = self.costs.switch(enc, indexed);
        let outcome = self.pack_read(
            py, history, offset, &fresh, new_items, new_metas, enc, &opts, &pinned, context, store,
            preload,
        );
        if outcome.is_err() {
            self.undo(py, mark, indexed, switched);
        }
        outcome
    }

    /// The first history position a contiguous `pack` with `budget` can cost or keep, for the
    /// indexed history followed by `new_items` (items appended since it was indexed, then the
    /// new input): a read of the history from there on packs to the same request
    /// (`CoreIndex::window_start`). A cost not counted yet, or counted under another encoding,
    /// counts as an item's overhead, which only moves the start earlier.
    #[pyo3(signature = (new_items, budget, *, model=None, encoding=None))]
    fn window_start(
        &self,
        py: Python<'_>,
        new_items: &Bound<'_, PyAny>,
        budget: u64,
        model: Option<&str>,
        encoding: Option<&str>,
    ) -> PyResult<usize> {
        let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
        let items = item_seq(new_items, "new_items")?;
        let n = self.index.len();
        let metas = classify_items(py, bound(py, &items), n, n)?;
        let costs = &self.costs;
        let lower = |p: usize| costs.lower_bound(p, enc);
        let index = &self.index;
        let start = py.detach(|| {
            index.window_start(&metas, budget, |members| {
                Ok::<u64, std::convert::Infallible>(
                    members
                        .iter()
                        .fold(0u64, |a, &p| a.saturating_add(lower(p))),
                )
            })
        });
        Ok(start.unwrap_or_else(|never| match never {}))
    }

    /// Count the costs a later `window_start` with `budget` walks over, so that it finds the
    /// window from exact costs rather than lower bounds. `history` holds the indexed history
    /// from `history_offset` on (positions before it keep their lower bound); returns the
    /// window start for this history, and with `count_store`, `new_counts` and `store_hits`
    /// as `pack` does.
    #[pyo3(signature = (history, budget, *, model=None, encoding=None, history_offset=0, count_store=None))]
    #[allow(clippy::too_many_arguments)]
    fn count_window<'py>(
        &mut self,
        py: Python<'py>,
        history: &Bound<'py, PyList>,
        budget: u64,
        model: Option<&str>,
        encoding: Option<&str>,
        history_offset: usize,
        count_store: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
        let n = self.index.len();
        let offset = history_offset;
        if offset.checked_add(history.len()) != Some(n) {
            return Err(PyValueError::new_err(format!(
                "the history list must hold the indexed items from history_offset on: \
                 offset {offset} + {} items, index {n}",
                history.len()
            )));
        }
        let store = count_store
            .filter(|s| !s.is_none())
            .map(|s| PyCountStore::from_py(&s))
            .transpose()?;
        let items = PyItems::new(
            history.clone().unbind(),
            PyList::empty(py).unbind(),
            n,
            n,
            Vec::new(),
        )
        .with_offset(offset);
        let mut source = PyCosts::new(items, enc)
            .with_memo(&mut self.costs, n)
            .with_store(store);
        let index = &self.index;
        let walked = py.detach(|| {
            index.window_start(&[], budget, |members| {
                let listed: Vec<usize> = members.iter().copied().filter(|&p| p >= offset).collect();
                let counted = source.costs(&listed)?;
                let earlier = members
                    .iter()
                    .filter(|&&p| p < offset)
                    .map(|&p| source.known(p).unwrap_or(tokens::ITEM_OVERHEAD));
                Ok(counted
                    .into_iter()
                    .chain(earlier)
                    .fold(0u64, |a, c| a.saturating_add(c)))
            })
        });
        let (mut items, link) = source.finish();
        if let Some(e) = link.as_ref().and_then(|(s, _)| s.error.as_ref()) {
            return Err(e.clone_ref(py));
        }
        let start = walked.map_err(|f: CostFailure| {
            let e = pack_error(
                py,
                PackError::Item {
                    label: label(n, f.position),
                    position: f.position,
                    field: f.field,
                    message: f.message,
                },
            );
            if let Some(cause) = items.cause.take() {
                e.set_cause(py, Some(cause));
            }
            e
        })?;
        let out = PyDict::new(py);
        out.set_item("start", start)?;
        store_outcome(py, &out, link)?;
        Ok(out)
    }
}

impl HistoryIndex {
    /// The part of `pack` after the arguments are checked and the items taken (see there).
    #[allow(clippy::too_many_arguments)]
    fn pack_read<'py>(
        &mut self,
        py: Python<'py>,
        history: &Bound<'py, PyList>,
        offset: usize,
        fresh: &Bound<'py, PyList>,
        new_items: Vec<Py<PyAny>>,
        new_metas: Vec<ItemMeta>,
        enc: Encoding,
        opts: &PackOptions,
        pinned: &[usize],
        context: Option<Bound<'py, PyAny>>,
        store: Option<PyCountStore>,
        preload: Preload,
    ) -> PyResult<Bound<'py, PyDict>> {
        let indexed = self.index.len();
        let n_history = indexed + fresh.len();
        self.classify_into(py, fresh.iter(), n_history)?;
        let index = &self.index;
        let kinds = &self.kinds;
        let kind_names = &self.kind_names;
        let items = PyItems::new(
            history.clone().unbind(),
            fresh.clone().unbind(),
            indexed,
            n_history,
            new_items,
        )
        .with_offset(offset);
        let mut source = PyCosts::new(items, enc)
            .with_memo(&mut self.costs, n_history)
            .with_store(store);
        let tail = py.detach(|| index.tail(&new_metas));
        preload.finish(py);
        let view = index.view(&tail);
        let is_user = |p: usize| index.is_user_message(p);
        let packed = run_pack(py, context, |hook| {
            pack_view(view, &is_user, &mut source, opts, pinned, hook)
        });
        let (mut items, link) = source.finish();
        if let Some(e) = link.as_ref().and_then(|(s, _)| s.error.as_ref()) {
            return Err(e.clone_ref(py));
        }
        let mut result = packed.inspect_err(|e| {
            if let Some(cause) = items.cause.take() {
                e.set_cause(py, Some(cause));
            }
        })?;
        let items = items.request(py, &result.kept_history)?;
        let table = DecisionTable::new(
            index.shared_graph(),
            Some(tail),
            &mut result,
            Arc::clone(kinds),
            kind_names,
        );
        self.live.retain(|t| t.strong_count() > 0);
        self.live.push(Arc::downgrade(&table.source));
        let out = result_dict(py, &result, enc, opts.policy, table)?;
        out.set_item("items", items)?;
        store_outcome(py, &out, link)?;
        Ok(out)
    }

    /// Put the index back as it was before a failed `pack` (at `mark`, holding `len` items),
    /// with the costs (of the encoding) it had if the call switched encodings.
    fn undo(&mut self, py: Python<'_>, mark: Mark, len: usize, switched: Option<SwitchedCosts>) {
        self.release_results();
        let index = &mut self.index;
        py.detach(|| index.undo_to(mark));
        if self.kinds.len() > len {
            Arc::make_mut(&mut self.kinds).truncate(len);
        }
        self.costs.restore(switched, len);
    }
}

/// Keeps `fork` from copying a half-built tokenizer into a child process.
///
/// Tokenizers are built lazily, sometimes on a helper thread while the GIL is released (the
/// first pack, `preload(wait=False)`). A `fork` in that window (multiprocessing's default on
/// Linux) would copy the lazy cell mid-build, and the child's first count would wait
/// forever for a builder thread that does not exist there. Every build holds `BUILDS`; a
/// `pthread_atfork` prepare handler takes it too (waiting for a running build, ~0.1 s) and
/// the parent and child handlers release it.
#[cfg(unix)]
mod fork_guard {
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, MutexGuard, Once};

    static BUILDS: Mutex<()> = Mutex::new(());

    /// Test hook (`_core._hold_next_build_until_fork`): the next build, once it holds
    /// `BUILDS`, waits for a fork's prepare handler to start, so a test forks during a build
    /// for certain instead of hoping a sleep lands inside one.
    static HOLD_NEXT: AtomicBool = AtomicBool::new(false);
    static HOLDING: AtomicBool = AtomicBool::new(false);
    static FORK_BEGAN: AtomicBool = AtomicBool::new(false);

    thread_local! {
        /// Held by the forking thread from prepare to the parent / child handler.
        static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
    }

    fn around_build(build: &dyn Fn()) {
        let _held = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
        if HOLD_NEXT.swap(false, Ordering::SeqCst) {
            HOLDING.store(true, Ordering::SeqCst);
            while !FORK_BEGAN.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            HOLDING.store(false, Ordering::SeqCst);
        }
        build();
    }

    /// Arm the test hook for the next build.
    pub fn hold_next_build_until_fork() {
        FORK_BEGAN.store(false, Ordering::SeqCst);
        HOLD_NEXT.store(true, Ordering::SeqCst);
    }

    /// Whether a build is held by the test hook (it holds `BUILDS` and waits for a fork).
    pub fn build_is_held() -> bool {
        HOLDING.load(Ordering::SeqCst)
    }

    extern "C" fn prepare() {
        FORK_BEGAN.store(true, Ordering::SeqCst);
        let guard = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
        HELD.with(|h| *h.borrow_mut() = Some(guard));
    }

    extern "C" fn release() {
        HELD.with(|h| drop(h.borrow_mut().take()));
    }

    pub fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            protoprompt_core::tokens::set_build_guard(around_build);
            // SAFETY: registers three handlers that only lock/unlock `BUILDS` on the
            // forking thread; they never call into Python.
            unsafe {
                libc::pthread_atfork(Some(prepare), Some(release), Some(release));
            }
        });
    }
}

/// Option ids of mimalloc v3's `mi_option_e` (the version libmimalloc-sys builds by default).
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Whether [`configure_allocator`] switched eager arena commit off.
static LAZY_COMMIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Commit the allocator's memory as it is used, not a whole arena up front: the eager default
/// kept 12-17 MB more resident after a cold 100k-item pack, at the same speed. Applied only
/// when both option ids read their defaults in this mimalloc (2 and 1000 ms), so a renumbered
/// mimalloc, or a user's own `MIMALLOC_ARENA_EAGER_COMMIT`, is left alone.
fn configure_allocator() -> bool {
    *LAZY_COMMIT.get_or_init(|| {
        // SAFETY: reads and sets plain integer options; no memory is touched.
        unsafe {
            let defaults = libmimalloc_sys::mi_option_get(MI_OPTION_ARENA_EAGER_COMMIT) == 2
                && libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) == 1000;
            if defaults {
                libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0);
            }
            defaults
        }
    })
}

/// Whether the allocator commits memory lazily (see `configure_allocator`; for tests).
#[pyfunction]
fn _lazy_commit_allocator() -> bool {
    configure_allocator()
}

/// Test hook: the next tokenizer build, once under way (holding the build lock), waits for
/// a `fork` to begin; `_build_is_held()` says when it is there.
#[cfg(unix)]
#[pyfunction]
fn _hold_next_build_until_fork() {
    fork_guard::hold_next_build_until_fork();
}

/// Whether a build is waiting for a fork (see `_hold_next_build_until_fork`).
#[cfg(unix)]
#[pyfunction]
fn _build_is_held() -> bool {
    fork_guard::build_is_held()
}

/// Forget every count in the process-wide count cache (for tests and benchmarks that need
/// a process's first count of a text without a new process).
#[pyfunction]
fn _clear_count_cache() {
    tokens::COUNT_CACHE.clear();
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    configure_allocator();
    #[cfg(unix)]
    fork_guard::install();
    // The exception classes `errors` imports: there from the start, or no module at all.
    m.py().import("protoprompt.errors")?;
    m.add_function(wrap_pyfunction!(_lazy_commit_allocator, m)?)?;
    m.add_function(wrap_pyfunction!(_clear_count_cache, m)?)?;
    #[cfg(unix)]
    {
        m.add_function(wrap_pyfunction!(_hold_next_build_until_fork, m)?)?;
        m.add_function(wrap_pyfunction!(_build_is_held, m)?)?;
    }
    m.add_function(wrap_pyfunction!(preload, m)?)?;
    m.add_function(wrap_pyfunction!(is_preloaded, m)?)?;
    m.add_function(wrap_pyfunction!(count_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(count_tokens_batch, m)?)?;
    m.add_function(wrap_pyfunction!(split_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(encoding_for_model, m)?)?;
    m.add_function(wrap_pyfunction!(available_encodings, m)?)?;
    m.add_function(wrap_pyfunction!(item_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_text, m)?)?;
    m.add_function(wrap_pyfunction!(analyze, m)?)?;
    m.add_class::<HistoryIndex>()?;
    m.add_class::<DecisionTable>()?;
    m.add("DEFAULT_ENCODING", Encoding::O200kBase.name())?;
    m.add("ITEM_OVERHEAD", tokens::ITEM_OVERHEAD)?;
    Ok(())
}
