//! An append-only index of a session's history, so that the next turn's pack costs what is
//! new and what is kept, not the length of the history.
//!
//! # Design note
//!
//! * **What is kept.** The classified items ([`ItemMeta`]) of the history, the graph of the
//!   history alone, and for every *relation string* (the `call_id`, `id`,
//!   `approval_request_id` and `caller.caller_id` values: every edge and every cross-item rule
//!   of [`crate::graph`] compares one of these) a 64-bit hash mapped to the first position
//!   holding it.
//! * **The cut.** For a block of items `T` placed after the history (the next turn's
//!   `new_input`, or items appended to the history), the *cut* `c` is the smallest position
//!   such that nothing in `c..` is related to anything before `c`: no relation string of an
//!   item at or after `c` occurs before `c`, no reasoning run (reasoning with the model
//!   items that follow it) crosses `c`, and anonymous tool searches after `c` pair up among
//!   themselves. It is found by a fixpoint that only reads items after the cut. Then the
//!   units of `history ++ T` are the cached units wholly before `c` plus the units of a
//!   small graph built over `c..` — the same units, problems and order as building the whole
//!   graph (tested for random histories against [`crate::graph::build_graph`]). A hash
//!   collision can only move the cut earlier (more work, same result).
//! * **What is linear.** Nothing per turn: appending `k` items and packing cost
//!   O(k + items after the cut + units visited by the fill), plus a linear but allocation
//!   free pass over the unit list when the per-unit decisions are reported. Removing items
//!   ([`HistoryIndex::truncate`]) rebuilds the index.
//! * **What the caller promises.** The positions the index has seen are not changed behind
//!   its back (the SDK's `SQLiteSession` only appends, pops the last item or clears, and
//!   [`HistoryIndex::truncate`] / [`HistoryIndex::clear`] cover those).

use std::hash::Hasher;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHasher};

use crate::graph::{build_graph, Graph, GraphView};
use crate::items::{ItemKind, ItemMeta};

fn relation_hash(s: &str) -> u64 {
    let mut h = FxHasher::default();
    h.write(s.as_bytes());
    h.write_u8(0xff);
    h.finish()
}

/// Hashes of the relation strings of one item.
fn relation_keys(m: &ItemMeta) -> impl Iterator<Item = u64> + '_ {
    let r = &m.raw;
    [
        r.call_id.as_deref(),
        r.id.as_deref(),
        r.approval_request_id.as_deref(),
        r.caller.as_ref().and_then(|c| c.caller_id.as_deref()),
    ]
    .into_iter()
    .flatten()
    .map(relation_hash)
}

/// Member of a reasoning run (graph rule E4).
fn continues(m: &ItemMeta) -> bool {
    m.is_reasoning() || m.is_model_emitted() || m.is_server_output()
}

/// Make room for `needed` more elements; when growing, leave `headroom` free.
pub fn reserve_ahead<T>(v: &mut Vec<T>, needed: usize, headroom: usize) {
    if v.capacity() - v.len() < needed {
        v.reserve_exact(headroom.max(needed));
    }
}

/// The graph over the positions after a cut, built for one pack (see [`HistoryIndex::tail`]).
#[derive(Debug, Clone)]
pub struct TailGraph {
    /// First position of the tail.
    pub cut: usize,
    /// Units over `cut..` (history after the cut, then the new items), members global.
    pub graph: Graph,
}

/// The classified history of one session and its graph, extended item by item.
#[derive(Debug, Clone, Default)]
pub struct HistoryIndex {
    metas: Vec<ItemMeta>,
    first: FxHashMap<u64, usize>,
    /// Shared with the reports of earlier packs; copied on write only while one is alive.
    graph: Arc<Graph>,
}

impl HistoryIndex {
    pub fn new() -> HistoryIndex {
        HistoryIndex::default()
    }

    /// Number of indexed history items.
    pub fn len(&self) -> usize {
        self.metas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// The indexed items.
    pub fn metas(&self) -> &[ItemMeta] {
        &self.metas
    }

    /// The graph of the indexed history alone.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The same graph, shared (for reports that outlive this borrow).
    pub fn shared_graph(&self) -> Arc<Graph> {
        Arc::clone(&self.graph)
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        *self = HistoryIndex::default();
    }

    /// Keep only the first `len` items (rebuilds the index).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.metas.len() {
            return;
        }
        let mut metas = std::mem::take(&mut self.metas);
        metas.truncate(len);
        self.clear();
        self.extend(metas);
    }

    /// The smallest cut for a block `tail` placed after the history (see the module note).
    pub fn cut(&self, tail: &[ItemMeta]) -> usize {
        let n = self.metas.len();
        let total = n + tail.len();
        let item = |q: usize| -> &ItemMeta {
            if q < n {
                &self.metas[q]
            } else {
                &tail[q - n]
            }
        };
        let mut c = n;
        let mut folded = total; // relation keys of `folded..` are accounted for
        loop {
            let mut next = c;
            for q in c..folded {
                for k in relation_keys(item(q)) {
                    if let Some(&f) = self.first.get(&k) {
                        next = next.min(f);
                    }
                }
            }
            folded = c;
            if next > 0 && next < total && continues(item(next - 1)) && continues(item(next)) {
                next -= 1;
                while next > 0 && continues(item(next - 1)) {
                    next -= 1;
                }
            }
            if next == c {
                break;
            }
            c = next;
        }
        // Anonymous tool searches pair right to left; an output left over after the tail
        // would pair with (or depend on) a call before the cut: fall back to everything.
        let mut open_outputs = 0usize;
        for q in (c..total).rev() {
            match item(q).kind {
                ItemKind::AnonToolSearchOutput => open_outputs += 1,
                ItemKind::AnonToolSearchCall => open_outputs = open_outputs.saturating_sub(1),
                _ => {}
            }
        }
        if open_outputs > 0 {
            0
        } else {
            c
        }
    }

    /// Append history items.
    pub fn extend(&mut self, items: Vec<ItemMeta>) {
        if items.is_empty() {
            return;
        }
        let n = self.metas.len();
        let c = self.cut(&items);
        let keys = 4 * items.len();
        if self.first.capacity() - self.first.len() < keys {
            self.first.reserve(keys + self.first.len() / 2 + 64);
        }
        for (i, m) in items.iter().enumerate() {
            for k in relation_keys(m) {
                self.first.entry(k).or_insert(n + i);
            }
        }
        // Headroom, so that the appends of the next turns do not move the whole index.
        let headroom = items.len() + self.metas.len() / 4 + 64;
        reserve_ahead(&mut self.metas, items.len(), headroom);
        let g = Arc::make_mut(&mut self.graph);
        reserve_ahead(&mut g.unit_of, items.len(), headroom);
        reserve_ahead(&mut g.units, items.len(), headroom);
        self.metas.extend(items);
        let mut tail = build_graph(&self.metas[c..], &[]);
        tail.shift_positions(c);
        let g = Arc::make_mut(&mut self.graph);
        let k = if c < n { g.unit_of[c] } else { g.units.len() };
        g.units.truncate(k);
        g.unit_of.truncate(c);
        g.unit_of.extend(tail.unit_of.iter().map(|u| u + k));
        g.units.extend(tail.units);
        g.n_history = self.metas.len();
    }

    /// The graph of the positions after the cut for `new_input` placed after the history.
    pub fn tail(&self, new_input: &[ItemMeta]) -> TailGraph {
        let cut = self.cut(new_input);
        let mut graph = build_graph(&self.metas[cut..], new_input);
        graph.shift_positions(cut);
        TailGraph { cut, graph }
    }

    /// The units of `history ++ new_input`: cached units before the cut, then `tail`'s.
    pub fn view<'a>(&'a self, tail: &'a TailGraph) -> GraphView<'a> {
        GraphView::split(&self.graph, tail.cut, &tail.graph)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn metas(v: Value) -> Vec<ItemMeta> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| ItemMeta::from_json(x).unwrap())
            .collect()
    }

    fn units_of(view: GraphView<'_>) -> Vec<(Vec<usize>, Vec<&'static str>, bool)> {
        (0..view.unit_count())
            .map(|u| {
                let unit = view.unit(u);
                (
                    unit.members.clone(),
                    unit.reasons().map(|r| r.code()).collect(),
                    unit.contains_new,
                )
            })
            .collect()
    }

    #[test]
    fn appended_turns_and_a_completing_output_match_the_full_graph() {
        let h = metas(json!([
            {"role":"user","content":"a"},
            {"type":"reasoning","id":"rs_1","summary":[]},
            {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"x"},
            {"role":"user","content":"b"},
            {"type":"reasoning","id":"rs_2","summary":[]},
            {"type":"function_call","call_id":"c2","name":"f","arguments":"{}"}
        ]));
        let n = metas(json!([{"type":"function_call_output","call_id":"c2","output":"y"}]));
        for split in 0..=h.len() {
            let mut idx = HistoryIndex::new();
            idx.extend(h[..split].to_vec());
            idx.extend(h[split..].to_vec());
            let full_h = build_graph(&h, &[]);
            assert_eq!(idx.graph(), &full_h, "split {split}");
            let tail = idx.tail(&n);
            assert_eq!(tail.cut, 5, "the pending call and its reasoning");
            let full = build_graph(&h, &n);
            assert_eq!(units_of(idx.view(&tail)), units_of(GraphView::whole(&full)));
        }
    }

    #[test]
    fn a_new_user_message_cuts_at_the_end() {
        let h = metas(json!([
            {"role":"user","content":"a"},
            {"type":"message","role":"assistant","id":"m1","status":"completed","content":[]}
        ]));
        let mut idx = HistoryIndex::new();
        idx.extend(h);
        assert_eq!(
            idx.tail(&metas(json!([{"role":"user","content":"b"}]))).cut,
            2
        );
        idx.truncate(1);
        assert_eq!(idx.len(), 1);
        assert_eq!(idx.graph().units.len(), 1);
    }
}
