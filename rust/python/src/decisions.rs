//! The `DecisionTable` pyclass: the per-unit decisions of one pack, read lazily (the rows
//! and their rules are the core's [`DecisionReport`]).

use protoprompt_core::facade::DecisionReport;
use pyo3::prelude::*;
use rustc_hash::FxHashMap;

/// The per-unit decisions of one pack. Only what the fill touched is stored; a row is
/// derived from the (shared) graph when Python reads it, so a pack over a long history
/// allocates nothing per unit. The index it came from detaches it before it changes
/// ([`protoprompt_core::indexed::IndexedHistory::release_results`]), so a kept table never
/// makes the index copy its graph.
#[pyclass(frozen, module = "protoprompt._core")]
pub(crate) struct DecisionTable(pub(crate) DecisionReport);

pub(crate) type DecisionRow = (
    usize,
    Vec<usize>,
    Vec<&'static str>,
    &'static str,
    Option<u64>,
    Vec<(&'static str, &'static str, String)>,
    Option<u64>,
);

#[pymethods]
impl DecisionTable {
    pub(crate) fn __len__(&self) -> usize {
        self.0.len()
    }

    /// `(unit, positions, kinds, code, tokens, problems, masked_tokens)` of one row.
    pub(crate) fn row(&self, i: usize) -> PyResult<DecisionRow> {
        let r = self.0.row(i).ok_or_else(|| {
            pyo3::exceptions::PyIndexError::new_err("decision index out of range")
        })?;
        let (unit, positions, kinds, problems) = (r.unit, r.positions, r.kinds, r.problems);
        Ok((
            unit,
            positions,
            kinds,
            r.code,
            r.tokens,
            problems,
            r.masked_tokens,
        ))
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
