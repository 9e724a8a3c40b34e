//! The `DecisionTable` pyclass: the per-unit decisions of one pack, read lazily (the rows
//! and their rules are the core's [`DecisionReport`]).

use protoprompt_core::facade::{DecisionReport, ReportRow, RowTuple};
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use rustc_hash::FxHashMap;

/// The per-unit decisions of one pack. Only what the fill touched is stored; a row is
/// derived from the (shared) graph when Python reads it, so a pack over a long history
/// allocates nothing per unit. The index it came from detaches it before it changes
/// ([`protoprompt_core::indexed::IndexedHistory::release_results`]), so a kept table never
/// makes the index copy its graph.
#[pyclass(frozen, module = "protoprompt._core")]
pub(crate) struct DecisionTable(pub(crate) DecisionReport);

#[pymethods]
impl DecisionTable {
    pub(crate) fn __len__(&self) -> usize {
        self.0.len()
    }

    /// `(unit, positions, kinds, code, tokens, problems, masked_tokens)` of one row.
    pub(crate) fn row(&self, i: usize) -> PyResult<RowTuple> {
        let row = self.0.row(i).map(ReportRow::into_tuple);
        row.ok_or_else(|| PyIndexError::new_err("decision index out of range"))
    }

    /// Number of history items per decision code.
    pub(crate) fn item_counts(&self) -> FxHashMap<&'static str, usize> {
        self.0.item_counts()
    }

    /// Number of units (with history members) per decision code.
    pub(crate) fn unit_counts(&self) -> FxHashMap<&'static str, usize> {
        self.0.unit_counts()
    }
}
