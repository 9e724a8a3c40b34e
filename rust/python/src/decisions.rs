//! The `DecisionTable` pyclass: the per-unit decisions of one pack, read lazily.

use crate::convert::label;
use protoprompt_core::decisions::DecisionRows;
use protoprompt_core::graph::Graph;
use protoprompt_core::incremental::TailGraph;
use protoprompt_core::pack::{Decision, PackResult, UnitDecision};
use pyo3::prelude::*;
use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex};

/// Small table of the kind names met so far: positions store a one-byte code.
#[derive(Default, Clone)]
pub(crate) struct KindNames(Vec<&'static str>);

impl KindNames {
    pub(crate) fn code(&mut self, name: &'static str) -> u8 {
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
pub(crate) struct DecisionTable {
    pub(crate) rows: usize,
    pub(crate) source: Arc<Mutex<DecisionRows>>,
    pub(crate) touched: FxHashMap<usize, UnitDecision>,
    pub(crate) kind_names: Vec<&'static str>,
}

impl DecisionTable {
    pub(crate) fn new(
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

    pub(crate) fn source(&self) -> std::sync::MutexGuard<'_, DecisionRows> {
        lock(&self.source)
    }

    pub(crate) fn decision(&self, u: usize, untouched: Decision) -> UnitDecision {
        self.touched.get(&u).copied().unwrap_or(UnitDecision {
            unit: u,
            decision: untouched,
            tokens: None,
        })
    }
}

/// A decision table's rows, locked (a panic while they were locked cannot leave them torn:
/// a detach replaces them whole).
pub(crate) fn lock(rows: &Mutex<DecisionRows>) -> std::sync::MutexGuard<'_, DecisionRows> {
    rows.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) type DecisionRow = (
    usize,
    Vec<usize>,
    Vec<&'static str>,
    &'static str,
    Option<u64>,
    Vec<(&'static str, &'static str, String)>,
);

#[pymethods]
impl DecisionTable {
    pub(crate) fn __len__(&self) -> usize {
        self.rows
    }

    /// `(unit, positions, kinds, code, tokens, problems)` of one row.
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
        ))
    }

    /// Number of history items per decision code.
    pub(crate) fn item_counts(&self) -> FxHashMap<&'static str, usize> {
        self.tally(|n| n)
    }

    /// Number of units (with history items) per decision code.
    pub(crate) fn unit_counts(&self) -> FxHashMap<&'static str, usize> {
        self.tally(|n| usize::from(n > 0))
    }
}

impl DecisionTable {
    /// Sum of `weight(history items of the unit)` per decision code.
    pub(crate) fn tally(&self, weight: impl Fn(usize) -> usize) -> FxHashMap<&'static str, usize> {
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
