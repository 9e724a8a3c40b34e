//! The `protoprompt._core.HistoryIndex` pyclass (`PyHistoryIndex`): one core
//! [`IndexedHistory`] (graph, kinds, token costs, live decision tables), extended between
//! calls. This module only reads the Python arguments, releases the GIL and maps errors.

use crate::convert::{bound, classify_items, item_seq, label, resolve_encoding};
use crate::costs::{store_outcome, tokenizer_failure, PyCosts, PyCountStore, PyItems};
use crate::decisions::DecisionTable;
use crate::errors::{classes, pack_error, raise, token_error};
use crate::pack::{result_dict, run_pack, CallOptions, Preload};
use protoprompt_core::indexed::{counted_window_start, IndexedHistory};
use protoprompt_core::items::ItemMeta;
use protoprompt_core::pack::{pack_view, CostFailure, PackError, PackOptions};
use protoprompt_core::tokens::Encoding;
use pyo3::exceptions::PyValueError;
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

/// Items classified per step when appending to an index (bounds the full-size copies: up to
/// three chunks are alive while pipelined). At 100k items, 2048 gave the speed of 4096 with
/// a peak 6-8 MB lower (4096: +13-19 MB over the unpipelined path, 1024: slower).
pub(crate) const CLASSIFY_CHUNK: usize = 2048;

impl PyHistoryIndex {
    /// Classify `items` and append them, one chunk at a time, so that only a few chunks of
    /// full-size classified items exist at once. Positions continue from `len(self)`; labels
    /// treat positions from `n_history` on as `new_input`. On a bad item the index is put back
    /// as it was and the error names the item and field.
    ///
    /// A long history is pipelined: this thread reads the Python items (it needs the GIL)
    /// while a scoped helper thread appends the previous chunk to the core index (no GIL), so
    /// a cold start costs about the larger of the two instead of their sum.
    pub(crate) fn classify_into<'py>(
        &mut self,
        py: Python<'py>,
        items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
        n_history: usize,
    ) -> PyResult<()> {
        let start = self.inner.len();
        let mark = self.inner.mark();
        let outcome = if items.len() <= CLASSIFY_CHUNK {
            classify_items(py, items, start, n_history).map(|metas| {
                let inner = &mut self.inner;
                py.detach(|| inner.append(metas));
            })
        } else {
            self.classify_pipelined(py, items, n_history)
        };
        if outcome.is_err() {
            // Back to exactly what it was, memory included.
            let inner = &mut self.inner;
            py.detach(|| inner.undo(mark));
        }
        outcome
    }

    pub(crate) fn classify_pipelined<'py>(
        &mut self,
        py: Python<'py>,
        mut items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
        n_history: usize,
    ) -> PyResult<()> {
        let mut position = self.inner.len();
        let (index, mut notes) = self.inner.appender();
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
                        notes.note(&metas, rest);
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

    /// The index as bytes, token costs included, for `HistoryIndex.from_snapshot` with the
    /// same `bound_to` (see `IndexedHistory::snapshot`; serialised with the GIL released).
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

    /// How many times a change to this index copied its whole graph because a result still
    /// shared it (for tests).
    pub(crate) fn _graph_copies(&self) -> usize {
        self.inner.graph_copies()
    }

    /// Forget every item.
    pub(crate) fn clear(&mut self) {
        self.inner.clear();
    }

    /// Like `pack`, for a `history` whose first `len(self)` items are the ones indexed
    /// (unchanged); the rest is classified and appended first. `options` is the one options
    /// value of the call (`protoprompt.packing._PackOptions`, read by [`CallOptions`]).
    ///
    /// With `count_store` (see `PyCountStore`), long texts' counts are looked up in it before
    /// they are tokenised; the result then has `new_counts` (`(key, tokens)` pairs to write
    /// to it) and `store_hits`.
    ///
    /// `history_offset`: the list holds the history from that position on (a windowed read,
    /// see `window_start`); the positions before it must be indexed, and the pack must not
    /// need their items (an `InvalidItemError` names the first one it would need).
    #[pyo3(signature = (history, new_input, options, count_store=None))]
    pub(crate) fn pack<'py>(
        &mut self,
        py: Python<'py>,
        history: &Bound<'py, PyList>,
        new_input: &Bound<'py, PyAny>,
        options: &Bound<'py, PyAny>,
        count_store: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let CallOptions {
            core: opts,
            encoding: enc,
            context,
            pinned,
            history_len,
            history_offset,
        } = CallOptions::from_py(options)?;
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
        let indexed = self.inner.len();
        if n_history < indexed {
            return Err(raise::<classes::HistoryMismatchError>(
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
        let mut mark = self.inner.mark();
        self.inner.switch_costs(enc, &mut mark);
        let outcome = self.pack_read(
            py, history, offset, &fresh, new_items, new_metas, enc, &opts, &pinned, context, store,
            preload,
        );
        if outcome.is_err() {
            let inner = &mut self.inner;
            py.detach(|| inner.undo(mark));
        }
        outcome
    }

    /// The first history position a contiguous `pack` with `budget` can cost or keep, for the
    /// indexed history followed by `new_items` (items appended since it was indexed, then the
    /// new input): a read of the history from there on packs to the same request
    /// (`GraphIndex::window`). A cost not counted yet, or counted under another encoding,
    /// counts as an item's overhead, which only moves the start earlier. Returns `(start,
    /// fits, tie, why, reach)`: whether the budget reaches the oldest unit, the relation that
    /// moved the start back last (its code and a sentence), and how far back the budget
    /// alone reaches (`GraphIndex::window`; positions in `why` from `len(self) +
    /// len(new_items) - new_input` on are labelled as new input, `new_input` counting from
    /// the end of `new_items`).
    #[pyo3(signature = (new_items, budget, *, model=None, encoding=None, new_input=0))]
    pub(crate) fn window(
        &self,
        py: Python<'_>,
        new_items: &Bound<'_, PyAny>,
        budget: u64,
        model: Option<&str>,
        encoding: Option<&str>,
        new_input: usize,
    ) -> PyResult<WindowTuple> {
        let enc = resolve_encoding(model, encoding).map_err(|e| token_error(py, e))?;
        let items = item_seq(new_items, "new_items")?;
        let n = self.inner.len();
        let n_history = n + items.len().saturating_sub(new_input);
        let metas = classify_items(py, bound(py, &items), n, n_history)?;
        let inner = &self.inner;
        let w = py.detach(|| inner.window(&metas, budget, enc));
        let tie = w.pull.map(|p| p.tie.code());
        let why = w.pull.map(|p| p.describe(n_history));
        Ok((w.start, w.fits, tie, why, w.reach))
    }

    /// Count the costs a later `window_start` with `budget` walks over, so that it finds the
    /// window from exact costs rather than lower bounds. `history` holds the indexed history
    /// from `history_offset` on (positions before it keep their lower bound); returns the
    /// window start for this history, and with `count_store`, `new_counts` and `store_hits`
    /// as `pack` does.
    #[pyo3(signature = (history, budget, *, model=None, encoding=None, history_offset=0, count_store=None))]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn count_window<'py>(
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
        let n = self.inner.len();
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
        let (index, costs) = self.inner.graph_and_costs();
        let mut source = PyCosts::new(items, enc)
            .with_memo(costs, n)
            .with_store(store);
        let walked = py.detach(|| counted_window_start(index, &mut source, budget, offset));
        let tokenizer_failed = tokenizer_failure(py, n, &source);
        let (mut items, link) = source.finish();
        if let Some(e) = link.as_ref().and_then(|(s, _)| s.error.as_ref()) {
            return Err(e.clone_ref(py));
        }
        if let (Err(_), Some(e)) = (&walked, tokenizer_failed) {
            return Err(e);
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

impl PyHistoryIndex {
    /// The part of `pack` after the arguments are checked and the items taken (see there).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pack_read<'py>(
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
        let indexed = self.inner.len();
        let n_history = indexed + fresh.len();
        self.inner.take_regrouped();
        self.classify_into(py, fresh.iter(), n_history)?;
        let appended = self.inner.take_regrouped();
        let items = PyItems::new(
            history.clone().unbind(),
            fresh.clone().unbind(),
            indexed,
            n_history,
            new_items,
        )
        .with_offset(offset);
        let (index, costs) = self.inner.graph_and_costs();
        let mut source = PyCosts::new(items, enc)
            .with_memo(costs, n_history)
            .with_store(store);
        let tail = py.detach(|| index.tail(&new_metas));
        preload.finish(py);
        let view = index.view(&tail);
        let is_user = |p: usize| index.is_user_message(p);
        let packed = run_pack(py, context, |hook| {
            pack_view(view, &is_user, &mut source, opts, pinned, hook)
        });
        let tokenizer_failed = tokenizer_failure(py, n_history, &source);
        let (mut items, link) = source.finish();
        if let Some(e) = link.as_ref().and_then(|(s, _)| s.error.as_ref()) {
            return Err(e.clone_ref(py));
        }
        if let (Err(_), Some(e)) = (&packed, tokenizer_failed) {
            return Err(e);
        }
        let mut result = packed.inspect_err(|e| {
            if let Some(cause) = items.cause.take() {
                e.set_cause(py, Some(cause));
            }
        })?;
        let items = items.request(py, &result.kept_history)?;
        // Where this pack rebuilt units from: the appends' regrouping or the new input's.
        let regrouped = match appended {
            Some(a) if a.position < tail.cut => (a.position, a.pull),
            _ => (tail.cut, tail.pull),
        };
        let index_use = (
            indexed,
            fresh.len(),
            regrouped.0,
            regrouped.1.map(|p| p.describe(n_history)),
        );
        let rows = self.inner.decision_rows(Some(tail));
        let table = DecisionTable::new(rows, &mut result, self.inner.kind_names());
        let out = result_dict(py, &result, enc, opts.policy, table)?;
        out.set_item("index", index_use)?;
        out.set_item("items", items)?;
        store_outcome(py, &out, link)?;
        Ok(out)
    }
}
