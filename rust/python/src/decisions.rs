//! The `DecisionTable` pyclass: the per-unit decisions of one pack, read lazily.

use crate::convert::label;
use protoprompt_core::decisions::{decision_of, DecisionRows};
use protoprompt_core::indexed::{lock, KindNames};
use protoprompt_core::pack::{Decision, PackResult, UnitDecision};
use pyo3::prelude::*;
use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex};

/// The per-unit decisions of one pack. Only what the fill touched is stored; a row is
/// derived from the (shared) graph when Python reads it, so a pack over a long history
/// allocates nothing per unit. The index it came from detaches it before it changes
/// ([`protoprompt_core::indexed::IndexedHistory::release_results`]), so a kept table never
/// makes the index copy its graph.
#[pyclass(frozen, module = "protoprompt._core")]
pub(crate) struct DecisionTable {
    pub(crate) rows: usize,
    pub(crate) source: Arc<Mutex<DecisionRows>>,
    pub(crate) touched: FxHashMap<usize, UnitDecision>,
    pub(crate) kind_names: Vec<&'static str>,
}

impl DecisionTable {
    /// The table of `result`, reading its rows from `source` (from
    /// [`protoprompt_core::indexed::IndexedHistory::decision_rows`], which detaches them
    /// before the index changes).
    pub(crate) fn new(
        source: Arc<Mutex<DecisionRows>>,
        result: &mut PackResult,
        kind_names: &KindNames,
    ) -> Self {
        let rows = lock(&source).rows();
        DecisionTable {
            rows,
            source,
            touched: std::mem::take(&mut result.touched),
            kind_names: kind_names.names().to_vec(),
        }
    }

    pub(crate) fn source(&self) -> std::sync::MutexGuard<'_, DecisionRows> {
        lock(&self.source)
    }

    pub(crate) fn decision(&self, u: usize, untouched: Decision) -> UnitDecision {
        decision_of(&self.touched, u, untouched)
    }
}

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
        self.rows
    }

    /// `(unit, positions, kinds, code, tokens, problems, masked_tokens)` of one row.
    pub(crate) fn row(&self, i: usize) -> PyResult<DecisionRow> {
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
            d.masked_tokens,
        ))
    }

    /// Number of history items per decision code.
    pub(crate) fn item_counts(&self) -> FxHashMap<&'static str, usize> {
        self.source().tally(&self.touched, |n| n)
    }

    /// Number of units (with history items) per decision code.
    pub(crate) fn unit_counts(&self) -> FxHashMap<&'static str, usize> {
        self.source().tally(&self.touched, |n| usize::from(n > 0))
    }
}
