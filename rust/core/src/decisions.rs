//! The rows of a pack's per-unit decision report ([`DecisionRows`]).
//!
//! A pack through a [`crate::incremental::GraphIndex`] reports one row per unit with
//! history members. Building those rows per pack would cost as much as the pack itself on a
//! long history, so a report reads them from the graph the pack ran on, which it shares with
//! the index (`Arc`). A shared graph would make the index copy it on its next change (copy on
//! write), so the index asks the reports still alive to [`DecisionRows::detach`] first
//! ([`crate::indexed::IndexedHistory::release_results`]): they take a compact copy of just
//! their own rows and stop sharing anything.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::graph::{Graph, GraphView, Problem};
use crate::incremental::TailGraph;
use crate::pack::{untouched_decision, Decision, UnitDecision};

/// The decision of row `u`: what the fill recorded for it (`touched`), else `untouched`.
pub fn decision_of(
    touched: &FxHashMap<usize, UnitDecision>,
    u: usize,
    untouched: Decision,
) -> UnitDecision {
    touched.get(&u).copied().unwrap_or(UnitDecision {
        unit: u,
        decision: untouched,
        tokens: None,
        masked_tokens: None,
    })
}

/// One row of a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The unit's history positions.
    pub positions: Vec<usize>,
    /// The kind code of each of `positions` (codes as given to [`DecisionRows::new`]).
    pub kinds: Vec<u8>,
    /// The decision when the fill did not touch the unit.
    pub untouched: Decision,
    pub problems: Vec<Problem>,
}

#[derive(Debug)]
enum Source {
    Shared {
        prefix: Arc<Graph>,
        /// The units after the cut, for a pack through an index.
        tail: Option<TailGraph>,
        kinds: Arc<Vec<u8>>,
    },
    Own {
        /// History positions of row `u`: `members[starts[u]..starts[u + 1]]`.
        starts: Vec<usize>,
        members: Vec<usize>,
        /// The kind code of each entry of `members`.
        kinds: Vec<u8>,
        untouched: Vec<Decision>,
        /// Rows with problems only.
        problems: FxHashMap<usize, Vec<Problem>>,
    },
}

/// The rows (units `0..rows()`, those with history members) of one pack's report.
#[derive(Debug)]
pub struct DecisionRows {
    rows: usize,
    n_history: usize,
    source: Source,
}

fn view<'a>(prefix: &'a Graph, tail: Option<&'a TailGraph>) -> GraphView<'a> {
    match tail {
        Some(tail) => GraphView::split(prefix, tail.cut, &tail.graph),
        None => GraphView::whole(prefix),
    }
}

impl DecisionRows {
    /// The rows of a pack over `prefix` (split at `tail.cut` when given), whose history
    /// position `p` has kind code `kinds[p]`.
    pub fn new(prefix: Arc<Graph>, tail: Option<TailGraph>, kinds: Arc<Vec<u8>>) -> Self {
        let v = view(&prefix, tail.as_ref());
        let n_history = v.n_history();
        // First unit whose first member is new input (binary search: units are sorted).
        let (mut lo, mut hi) = (0, v.unit_count());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if v.unit(mid).members[0] < n_history {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        DecisionRows {
            rows: lo,
            n_history,
            source: Source::Shared {
                prefix,
                tail,
                kinds,
            },
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of history items of the pack (positions below it are history).
    pub fn n_history(&self) -> usize {
        self.n_history
    }

    /// Whether the rows still read a graph they share.
    pub fn is_shared(&self) -> bool {
        matches!(self.source, Source::Shared { .. })
    }

    /// Stop sharing: keep a compact copy of these rows (nothing if already detached).
    pub fn detach(&mut self) {
        let Source::Shared {
            prefix,
            tail,
            kinds,
        } = &self.source
        else {
            return;
        };
        let v = view(prefix, tail.as_ref());
        let n_history = self.n_history;
        let mut starts = Vec::with_capacity(self.rows + 1);
        let mut members = Vec::with_capacity(n_history);
        let mut untouched = Vec::with_capacity(self.rows);
        let mut problems = FxHashMap::default();
        starts.push(0);
        for u in 0..self.rows {
            let unit = v.unit(u);
            members.extend(unit.members.iter().copied().take_while(|&p| p < n_history));
            starts.push(members.len());
            untouched.push(untouched_decision(unit));
            if !unit.problems.is_empty() {
                problems.insert(u, unit.problems.clone());
            }
        }
        let kinds = members.iter().map(|&p| kinds[p]).collect();
        self.source = Source::Own {
            starts,
            members,
            kinds,
            untouched,
            problems,
        };
    }

    /// Number of history items of row `u` and its untouched decision (no allocation).
    pub fn size_and_untouched(&self, u: usize) -> (usize, Decision) {
        match &self.source {
            Source::Shared { prefix, tail, .. } => {
                let unit = view(prefix, tail.as_ref()).unit(u);
                let n = unit.members.partition_point(|&p| p < self.n_history);
                (n, untouched_decision(unit))
            }
            Source::Own {
                starts, untouched, ..
            } => (starts[u + 1] - starts[u], untouched[u]),
        }
    }

    /// Sum of `weight(history items of the unit)` per decision code over every row, the
    /// decisions being what the fill recorded (`touched`) or else the untouched ones.
    pub fn tally(
        &self,
        touched: &FxHashMap<usize, UnitDecision>,
        weight: impl Fn(usize) -> usize,
    ) -> FxHashMap<&'static str, usize> {
        let mut counts = FxHashMap::default();
        for u in 0..self.rows() {
            let (n, untouched) = self.size_and_untouched(u);
            *counts
                .entry(decision_of(touched, u, untouched).decision.code())
                .or_insert(0) += weight(n);
        }
        counts
    }

    /// Row `u` (`u < rows()`).
    pub fn row(&self, u: usize) -> Row {
        match &self.source {
            Source::Shared {
                prefix,
                tail,
                kinds,
            } => {
                let unit = view(prefix, tail.as_ref()).unit(u);
                let positions: Vec<usize> = unit
                    .members
                    .iter()
                    .copied()
                    .take_while(|&p| p < self.n_history)
                    .collect();
                Row {
                    kinds: positions.iter().map(|&p| kinds[p]).collect(),
                    positions,
                    untouched: untouched_decision(unit),
                    problems: unit.problems.clone(),
                }
            }
            Source::Own {
                starts,
                members,
                kinds,
                untouched,
                problems,
            } => {
                let span = starts[u]..starts[u + 1];
                Row {
                    positions: members[span.clone()].to_vec(),
                    kinds: kinds[span].to_vec(),
                    untouched: untouched[u],
                    problems: problems.get(&u).cloned().unwrap_or_default(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::build_graph;
    use crate::incremental::GraphIndex;
    use crate::items::ItemMeta;
    use serde_json::json;

    fn metas(items: &[serde_json::Value]) -> Vec<ItemMeta> {
        items
            .iter()
            .map(|v| ItemMeta::from_json(v).unwrap())
            .collect()
    }

    fn all_rows(r: &DecisionRows) -> Vec<(Row, (usize, Decision))> {
        (0..r.rows())
            .map(|u| (r.row(u), r.size_and_untouched(u)))
            .collect()
    }

    /// Detached rows read exactly as the shared ones did, and a detached report no longer
    /// makes the index copy its graph when it changes.
    #[test]
    fn detached_rows_equal_shared_rows_and_release_the_graph() {
        let mut history = Vec::new();
        for i in 0..30 {
            history.push(json!({"role":"user","content":format!("q{i}")}));
            history.push(json!({"type":"function_call","call_id":format!("c{i}"),"name":"f"}));
            if i % 4 != 0 {
                history.push(json!({"type":"function_call_output","call_id":format!("c{i}")}));
            }
            if i % 5 == 0 {
                history.push(json!({"type":"function_call_output","call_id":format!("x{i}")}));
            }
        }
        let hm = metas(&history);
        let nm = metas(&[json!({"role":"user","content":"next"})]);
        let kinds: Arc<Vec<u8>> = Arc::new((0..hm.len()).map(|p| (p % 5) as u8).collect());

        let whole = Arc::new(build_graph(&hm, &nm));
        let mut plain = DecisionRows::new(whole, None, Arc::clone(&kinds));
        let mut index = GraphIndex::new();
        index.extend(hm.clone());
        let tail = index.tail(&nm);
        let mut split = DecisionRows::new(index.shared_graph(), Some(tail), Arc::clone(&kinds));
        let before = all_rows(&plain);
        assert_eq!(all_rows(&split), before);
        assert!(before.iter().any(|(r, _)| !r.problems.is_empty()));
        assert!(split.is_shared());
        split.detach();
        plain.detach();
        assert!(!split.is_shared());
        assert_eq!(all_rows(&split), before);
        assert_eq!(all_rows(&plain), before);
        index.extend(metas(&[json!({"role":"user","content":"later"})]));
        assert_eq!(index.graph_copies(), 0);
        assert_eq!(all_rows(&split), before);
    }

    /// The tally counts every row once, under the fill's decision where it touched the row.
    #[test]
    fn tallies_count_rows_by_their_decision() {
        let hm = metas(&[
            json!({"role":"user","content":"a"}),
            json!({"type":"function_call","call_id":"c","name":"f"}),
            json!({"type":"function_call_output","call_id":"c"}),
            json!({"role":"user","content":"b"}),
            json!({"type":"function_call_output","call_id":"orphan"}),
        ]);
        let nm = metas(&[json!({"role":"user","content":"next"})]);
        let kinds = Arc::new(vec![0u8; hm.len()]);
        let rows = DecisionRows::new(Arc::new(build_graph(&hm, &nm)), None, kinds);
        let mut touched = FxHashMap::default();
        touched.insert(
            0,
            UnitDecision {
                unit: 0,
                decision: Decision::Kept,
                tokens: Some(9),
                masked_tokens: None,
            },
        );
        let items = rows.tally(&touched, |n| n);
        let units = rows.tally(&touched, |n| usize::from(n > 0));
        let mut want_items: FxHashMap<&'static str, usize> = FxHashMap::default();
        let mut want_units: FxHashMap<&'static str, usize> = FxHashMap::default();
        for u in 0..rows.rows() {
            let row = rows.row(u);
            let code = decision_of(&touched, u, row.untouched).decision.code();
            *want_items.entry(code).or_insert(0) += row.positions.len();
            *want_units.entry(code).or_insert(0) += usize::from(!row.positions.is_empty());
        }
        assert_eq!(items, want_items);
        assert_eq!(units, want_units);
        assert_eq!(items.values().sum::<usize>(), hm.len());
        assert_eq!(
            items.get(Decision::Kept.code()),
            Some(&rows.row(0).positions.len())
        );
    }
}
