//! The `protoprompt._core.HistoryIndex` pyclass (`PyHistoryIndex`): one core
//! [`IndexedHistory`] (graph, kinds, token costs, live decision tables), extended between
//! calls. This module only reads the Python arguments, releases the GIL and maps errors.

use crate::convert::{bound, chunks, classify_items, item_seq};
use crate::costs::{new_counts, store_outcome, NewCounts, PyCountStore, PyItems};
use crate::decisions::DecisionTable;
use crate::errors::{classes, pack_error, raise, span_error};
use crate::pack::{report_value, run_pack, PyPackOptions};
use protoprompt_core::facade::{CallEnd, Ending, Finished};
use protoprompt_core::indexed::IndexedHistory;
use protoprompt_core::pipeline::RequestEdit;
use protoprompt_core::span::{indexed_span, pack_span};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

/// What `window` returns: start, fits, tie code, why (a sentence), reach.
type WindowTuple = (usize, bool, Option<&'static str>, Option<String>, usize);

/// The classified history of one session, extended as it grows, so that packing the next
/// turn costs what is new and what is kept rather than the whole history.
#[pyclass(name = "HistoryIndex", module = "protoprompt._core")]
pub(crate) struct PyHistoryIndex {
    /// The index with its kinds, costs and live decision tables (all bookkeeping is there).
    pub(crate) inner: IndexedHistory,
}

impl PyHistoryIndex {
    /// Classify `items` and append them (`IndexedHistory::append_classified`: a long
    /// history is read here, with the GIL, while a helper thread appends the previous chunk
    /// without it). Positions continue from `len(self)`; labels treat positions from
    /// `n_history` on as `new_input`. On a bad item the index is put back as it was and the
    /// error names the item and field.
    pub(crate) fn classify_into<'py>(
        &mut self,
        py: Python<'py>,
        items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
        n_history: usize,
    ) -> PyResult<()> {
        let total = items.len();
        let blocking = |f: &mut (dyn FnMut() + Send)| py.detach(f);
        let classify = chunks(py, items, n_history);
        self.inner.append_classified(total, classify, &blocking)
    }
}

#[pymethods]
impl PyHistoryIndex {
    #[new]
    pub(crate) fn new() -> Self {
        PyHistoryIndex {
            inner: IndexedHistory::new(),
        }
    }

    pub(crate) fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Approximate bytes of memory the index holds.
    #[getter]
    pub(crate) fn nbytes(&self) -> usize {
        self.inner.heap_bytes()
    }

    /// Classify and append history items (positions continue from `len(self)`).
    pub(crate) fn extend(&mut self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<()> {
        let items = item_seq(items, "items")?;
        self.classify_into(py, bound(py, &items), usize::MAX)
    }

    /// Keep only the first `length` items.
    pub(crate) fn truncate(&mut self, py: Python<'_>, length: usize) {
        let inner = &mut self.inner;
        py.detach(|| inner.truncate(length));
    }

    /// The index as bytes, token costs and masked costs included, for
    /// `HistoryIndex.from_snapshot` with the same `bound_to` (see `IndexedHistory::snapshot`;
    /// serialised with the GIL released).
    #[pyo3(signature = (*, bound_to=None))]
    pub(crate) fn snapshot<'py>(
        &self,
        py: Python<'py>,
        bound_to: Option<Bound<'py, PyBytes>>,
    ) -> Bound<'py, PyBytes> {
        let binding: &[u8] = bound_to.as_ref().map_or(b"", |b| b.as_bytes());
        let inner = &self.inner;
        let bytes = py.detach(|| inner.snapshot(binding));
        PyBytes::new(py, &bytes)
    }

    /// Load what `snapshot` wrote (by this version of protoprompt, with the same
    /// `bound_to`). Raises `SnapshotError` for anything else; never loads part of one.
    #[staticmethod]
    #[pyo3(signature = (data, *, bound_to=None))]
    pub(crate) fn from_snapshot(
        py: Python<'_>,
        data: &Bound<'_, PyBytes>,
        bound_to: Option<Bound<'_, PyBytes>>,
    ) -> PyResult<Self> {
        let bytes = data.as_bytes();
        let binding: &[u8] = bound_to.as_ref().map_or(b"", |b| b.as_bytes());
        let loaded = py.detach(|| IndexedHistory::from_snapshot(bytes, binding));
        let inner = loaded.map_err(|e| raise::<classes::SnapshotError>(py, (e.to_string(),)))?;
        Ok(PyHistoryIndex { inner })
    }

    /// Positions whose token cost the index holds (for tests and debugging).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn _costs_counted(&self) -> usize {
        self.inner.costs().counted()
    }

    /// Tool outputs whose masked cost the index holds, those with a masked copy's field
    /// kept, and the encoding and excerpt size they are counted under (for tests and
    /// debugging).
    #[cfg(feature = "test-hooks")]
    #[allow(clippy::type_complexity)]
    pub(crate) fn _masked_counted(&self) -> (usize, usize, Option<(&'static str, u64)>) {
        let masked = self.inner.masked_costs();
        let (costs, fields) = masked.counted();
        (costs, fields, masked.key().map(|(e, x)| (e.name(), x)))
    }

    /// Why the costs of the snapshot this index was loaded from were not reused (`None`:
    /// they were, or it was not loaded from one).
    #[getter]
    pub(crate) fn snapshot_costs_dropped(&self) -> Option<&'static str> {
        self.inner.snapshot_costs_dropped()
    }

    /// How many times a change to this index copied its whole graph because a result still
    /// shared it (for tests).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn _graph_copies(&self) -> usize {
        self.inner.graph_copies()
    }

    /// Forget every item.
    pub(crate) fn clear(&mut self) {
        self.inner.clear();
    }

    /// Like `pack`, for a `history` whose first `len(self)` items are the ones indexed
    /// (`IndexedHistory::pack_call`, which says what `options` and `count_store` do).
    #[pyo3(signature = (history, new_input, options, count_store=None))]
    pub(crate) fn pack<'py>(
        &mut self,
        py: Python<'py>,
        history: &Bound<'py, PyList>,
        new_input: &Bound<'py, PyAny>,
        options: &Bound<'py, PyPackOptions>,
        count_store: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let o = options.get();
        let (indexed, offset) = (self.inner.len(), o.core.history_offset);
        let (listed, n_history) = pack_span(
            indexed,
            history.len(),
            o.core.history_len,
            offset,
            &o.core.pinned,
        )
        .map_err(|e| span_error(py, e))?;
        let store = PyCountStore::given(count_store)?;
        // The items this call reads for the first time, taken in one step: nothing else
        // runs while the slice is made, so whatever another thread or an item's own code
        // does to `history` from now on cannot shift what is classified, counted or sent.
        let fresh = history.get_slice(indexed - offset, listed);
        let new_items = item_seq(new_input, "new_input")?;
        let preload = o.core.basis.encoding.load_in_background();
        // new_input first: a bad new item must leave the index unchanged.
        let new_metas = classify_items(py, bound(py, &new_items), n_history, n_history)?;
        let blocking = |f: &mut (dyn FnMut() + Send)| py.detach(f);
        // The fresh items classified and appended, one core call (without the GIL; it calls
        // back for items, stored counts and the context), the result converted.
        self.inner.within_call(&o.core, &blocking, |inner| {
            let n_history = indexed + fresh.len();
            let classify = chunks(py, fresh.iter(), n_history);
            let appended = inner.append_fresh(fresh.len(), classify, &blocking)?;
            let items = PyItems::new(history, offset, &fresh, indexed, new_items);
            let (end, hook_error) = run_pack(py, o.context(py), |hook| {
                inner.pack_call(items, store, &o.core, &new_metas, appended, preload, hook)
            });
            let (call, mut items, link) = settle(py, end, hook_error)?;
            let request = items.request(py, &call.packed.result.kept_history)?;
            let masked = apply_edits(py, &request, &call.packed.request_edits(), n_history)?;
            let out = PyDict::new(py);
            for (name, value) in call.report(&o.core) {
                out.set_item(name, report_value(py, value)?)?;
            }
            out.set_item("decisions", Bound::new(py, DecisionTable(call.decisions))?)?;
            out.set_item("items", request)?;
            out.set_item("masked", masked)?;
            store_outcome(py, &out, link)?;
            Ok(out)
        })
    }

    /// The first history position a contiguous `pack` with `budget` can cost or keep, for the
    /// indexed history followed by `new_items`, the last `new_input` of them new input
    /// (`IndexedHistory::window_call`): `(start, fits, tie, why, reach)`.
    #[pyo3(signature = (new_items, budget, options, new_input=0))]
    pub(crate) fn window(
        &self,
        py: Python<'_>,
        new_items: &Bound<'_, PyAny>,
        budget: u64,
        options: &Bound<'_, PyPackOptions>,
        new_input: usize,
    ) -> PyResult<WindowTuple> {
        let items = item_seq(new_items, "new_items")?;
        let n = self.inner.len();
        let n_history = n + items.len().saturating_sub(new_input);
        let metas = classify_items(py, bound(py, &items), n, n_history)?;
        let (inner, o) = (&self.inner, &options.get().core);
        let w = py.detach(|| inner.window_call(&metas, budget, o, n_history));
        Ok((w.start, w.fits, w.tie, w.why, w.reach))
    }

    /// Positions of the user messages (turn boundaries) among the indexed positions
    /// `start..end` (clamped to the index).
    pub(crate) fn user_positions(&self, py: Python<'_>, start: usize, end: usize) -> Vec<usize> {
        let inner = &self.inner;
        py.detach(|| inner.user_positions(start, end))
    }

    /// Whether the indexed history (`history`, exactly its items) followed by `appended`
    /// costs more than `limit` tokens (`IndexedHistory::cost_over_call`).
    #[pyo3(signature = (history, appended, limit, options))]
    pub(crate) fn cost_over<'py>(
        &mut self,
        py: Python<'py>,
        history: &Bound<'py, PyList>,
        appended: &Bound<'py, PyAny>,
        limit: u64,
        options: &Bound<'py, PyPackOptions>,
    ) -> PyResult<(u64, bool)> {
        let n = self.inner.len();
        indexed_span(n, history.len(), 0).map_err(|e| span_error(py, e))?;
        let tail = item_seq(appended, "appended")?;
        let appended = tail.len();
        let items = PyItems::new(history, 0, &PyList::empty(py), n, tail);
        let (basis, inner) = (options.get().core.basis, &mut self.inner);
        let end =
            py.detach(|| inner.cost_over_call::<_, PyCountStore>(items, basis, appended, limit));
        settle(py, end, None).map(|(sum, _, _)| sum)
    }

    /// Count the costs a later `window` with `budget` walks over
    /// (`IndexedHistory::count_window_call`): the window start and, with `count_store`, the
    /// `new_counts` to write to it (else `None`).
    #[pyo3(signature = (history, budget, options, count_store=None))]
    pub(crate) fn count_window<'py>(
        &mut self,
        py: Python<'py>,
        history: &Bound<'py, PyList>,
        budget: u64,
        options: &Bound<'py, PyPackOptions>,
        count_store: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(usize, Option<NewCounts<'py>>)> {
        let o = &options.get().core;
        let n = self.inner.len();
        indexed_span(n, history.len(), o.history_offset).map_err(|e| span_error(py, e))?;
        let store = PyCountStore::given(count_store)?;
        let items = PyItems::new(history, o.history_offset, &PyList::empty(py), n, Vec::new());
        let inner = &mut self.inner;
        let end = py.detach(|| inner.count_window_call(items, store, o, budget));
        let (start, _, link) = settle(py, end, None)?;
        Ok((start, link.map(|(_, tally)| new_counts(py, &tally))))
    }
}

/// The end of a core call ([`CallEnd::finish`]): its value with the items it read and what
/// it did with its count store, or the exception it ends with ([`Ending`]; `hook_error`: a
/// failed context hook's exception).
fn settle<T>(
    py: Python<'_>,
    end: CallEnd<T, PyItems, PyCountStore>,
    hook_error: Option<PyErr>,
) -> PyResult<Finished<T, PyItems, PyCountStore>> {
    let ending = end.finish(|s| s.error.take(), |i| i.cause.take(), hook_error);
    ending.map_err(|ending| {
        let (error, cause) = match ending {
            Ending::Store(e) => return e,
            Ending::Tokenizer(m) => return raise::<classes::TokenizerError>(py, (m,)),
            Ending::Raised { error, cause } => (error, cause),
            Ending::Pack { error, cause } => (pack_error(py, error), cause),
        };
        if let Some(cause) = cause {
            error.set_cause(py, Some(cause));
        }
        error
    })
}

/// Apply a pack's edits ([`Packed::request_edits`]) to `request` (the kept history, then the
/// new input): each edited item is replaced by a new dict, its masked copy
/// ([`crate::mask::masked_copy`]) and/or a shallow copy without its `id` (an item without
/// one is left as it is). Returns the positions sent as copies (sorted).
fn apply_edits<'py>(
    py: Python<'py>,
    request: &Bound<'py, PyList>,
    edits: &[RequestEdit],
    n_history: usize,
) -> PyResult<Vec<usize>> {
    let id = pyo3::intern!(py, "id");
    let mut masked = Vec::with_capacity(edits.len());
    for e in edits {
        let original = request.get_item(e.index)?;
        let mut copy = match &e.masked {
            Some(f) => Some(crate::mask::masked_copy(
                py, &original, f, n_history, e.position,
            )?),
            None => None,
        };
        let item = copy.as_ref().unwrap_or(&original);
        if let Some(dict) = item.cast::<PyDict>().ok().filter(|_| e.strip_id) {
            if dict.contains(id)? {
                let stripped = dict.copy()?;
                stripped.del_item(id)?;
                copy = Some(stripped.into_any());
            }
        }
        if let Some(copy) = copy {
            request.set_item(e.index, copy)?;
            masked.push(e.position);
        }
    }
    Ok(masked)
}
