//! The Python side of the core's cost engine ([`protoprompt_core::costs`]): the caller's
//! item lists as an [`ItemSource`] and the user's count store as a [`CountStore`].

use crate::convert::{label, to_value, FieldError};
use crate::errors::field_error;
use protoprompt_core::costs::{
    stored_counts, CountStore, ItemSource, StoreError, StoreTally, Stored,
};
use protoprompt_core::items::Fault;
use protoprompt_core::pack::CostFailure;
use protoprompt_core::reads::{CallReads, ReadFrom};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList};
use serde_json::Value;

/// The items of one call, read by position from the caller's lists under the GIL (where
/// from: [`CallReads`], so what a call reads stays what it read) and converted to JSON
/// values for the core's cost engine ([`CostEngine`]). Items are read only when their cost
/// is needed.
pub(crate) struct PyItems {
    /// The caller's history list (positions `offset..`).
    pub(crate) history: Py<PyList>,
    /// `history[fresh_from..n_history]` as it was when the call began.
    pub(crate) fresh: Py<PyList>,
    pub(crate) new_input: Vec<Py<PyAny>>,
    pub(crate) reads: CallReads<Py<PyAny>>,
    /// The Python exception behind the last item that could not be read or converted.
    pub(crate) cause: Option<PyErr>,
}

/// A persistent count store handed to `HistoryIndex.pack` (`count_store=`): an object with
/// `secret` (16 bytes) and `get_many(keys: list[bytes]) -> list[int | None]`; the core's
/// cost engine decides what to ask it ([`protoprompt_core::costs`]).
pub(crate) struct PyCountStore {
    pub(crate) store: Py<PyAny>,
    pub(crate) secret: [u8; 16],
    /// What `get_many` raised (or why its answer was refused); the pack fails with it.
    pub(crate) error: Option<PyErr>,
}

impl PyCountStore {
    /// The store a call was handed (`None` or Python's `None`: none).
    pub(crate) fn given(store: Option<Bound<'_, PyAny>>) -> PyResult<Option<PyCountStore>> {
        store
            .filter(|s| !s.is_none())
            .map(|s| Self::from_py(&s))
            .transpose()
    }

    fn from_py(store: &Bound<'_, PyAny>) -> PyResult<PyCountStore> {
        let secret = store.getattr(intern!(store.py(), "secret"))?;
        let secret: [u8; 16] = secret
            .extract::<Vec<u8>>()
            .ok()
            .filter(|_| secret.is_instance_of::<PyBytes>())
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

    /// The stored counts of `keys` (`None` where the store has none), under the GIL; an
    /// answer the core refuses ([`stored_counts`]) is a `ValueError`.
    pub(crate) fn ask(&self, keys: &[[u8; 16]]) -> PyResult<Vec<Option<u64>>> {
        Python::attach(|py| {
            let list = PyList::new(py, keys.iter().map(|k| PyBytes::new(py, k)))?;
            let store = self.store.bind(py);
            let answer = store.call_method1(intern!(py, "get_many"), (list,))?;
            let elements = answer.cast::<PyList>().ok().map(|l| l.iter().map(stored));
            let shown = || answer.repr().map(|r| r.to_string()).unwrap_or_default();
            stored_counts(keys.len(), elements, shown).map_err(PyValueError::new_err)
        })
    }
}

/// One element of a count store's answer as the core reads it.
fn stored(v: Bound<'_, PyAny>) -> Stored {
    if v.is_none() {
        Stored::Absent
    } else if v.is_instance_of::<PyBool>() {
        Stored::NotACount
    } else {
        v.extract().map_or(Stored::NotACount, Stored::Count)
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

/// A call's new counts as `(key, tokens)` pairs to write to its count store.
pub(crate) type NewCounts<'py> = Vec<(Bound<'py, PyBytes>, u64)>;

pub(crate) fn new_counts<'py>(py: Python<'py>, tally: &StoreTally) -> NewCounts<'py> {
    let pairs = tally.new_counts.iter();
    pairs.map(|(k, n)| (PyBytes::new(py, k), *n)).collect()
}

/// What a call did with its count store, as the result's `new_counts` and `store_hits`.
pub(crate) fn store_outcome(
    py: Python<'_>,
    out: &Bound<'_, PyDict>,
    link: Option<(PyCountStore, StoreTally)>,
) -> PyResult<()> {
    let Some((_, tally)) = link else {
        return Ok(());
    };
    out.set_item("new_counts", new_counts(py, &tally))?;
    out.set_item("store_hits", tally.hits)
}

impl PyItems {
    /// The items of a call whose `history` list holds positions `offset..`, which took
    /// `fresh` (positions `fresh_from..n_history`) when it began.
    pub(crate) fn new(
        history: &Bound<'_, PyList>,
        offset: usize,
        fresh: &Bound<'_, PyList>,
        fresh_from: usize,
        new_input: Vec<Py<PyAny>>,
    ) -> Self {
        let n_history = fresh_from + fresh.len();
        PyItems {
            history: history.clone().unbind(),
            fresh: fresh.clone().unbind(),
            new_input,
            reads: CallReads::new(offset, fresh_from, n_history),
            cause: None,
        }
    }

    /// The object at global position `p` as this call reads it (see [`CallReads`]); an
    /// `IndexError` if the caller's list lost a position the index had seen. With `keep`, a
    /// read from the caller's list is kept for the rest of the call.
    pub(crate) fn item<'py>(
        &mut self,
        py: Python<'py>,
        p: usize,
        keep: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let obj = match self.reads.locate(p) {
            ReadFrom::NewInput(i) => return Ok(self.new_input[i].bind(py).clone()),
            ReadFrom::Fresh(i) => return self.fresh.bind(py).get_item(i),
            ReadFrom::Kept(obj) => return Ok(obj.bind(py).clone()),
            ReadFrom::BeforeList => return Err(PyIndexError::new_err(self.reads.unreadable(p))),
            ReadFrom::List(i) => self.history.bind(py).get_item(i)?,
        };
        if keep {
            self.reads.keep(p, obj.clone().unbind());
        }
        Ok(obj)
    }

    /// The object at `p` as [`PyItems::item`] reads it, an error naming it if it cannot be
    /// read (its exception the cause).
    fn readable<'py>(
        &mut self,
        py: Python<'py>,
        p: usize,
        keep: bool,
    ) -> Result<Bound<'py, PyAny>, FieldError> {
        self.item(py, p, keep)
            .map_err(|e| Fault::caused("(item)", self.reads.unreadable(p), e))
    }

    /// The kept history objects followed by every new-input object: what the caller sends.
    pub(crate) fn request<'py>(
        &mut self,
        py: Python<'py>,
        kept: &[usize],
    ) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::with_capacity(kept.len() + self.new_input.len());
        for &p in kept {
            // Read once, here: nothing to keep it for.
            let item = self.readable(py, p, false);
            let at = || label(self.reads.n_history(), p);
            out.push(item.map_err(|e| field_error(py, &at(), e))?);
        }
        out.extend(self.new_input.iter().map(|o| o.bind(py).clone()));
        PyList::new(py, out)
    }
}

impl ItemSource for PyItems {
    fn values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        Python::attach(|py| {
            let mut value = |p: usize| {
                let read = self.readable(py, p, true).and_then(|item| to_value(&item));
                read.map_err(|e| {
                    self.cause = e.cause;
                    CostFailure {
                        position: p,
                        field: e.field,
                        message: e.message,
                    }
                })
            };
            positions.iter().map(|&p| value(p)).collect()
        })
    }
}
