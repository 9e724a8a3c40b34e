//! A session's indexed history with its bookkeeping ([`IndexedHistory`]): the graph side
//! ([`GraphIndex`]), the kind of every position (for decision reports), the token costs
//! counted so far ([`CostMemo`]) and the decision reports of earlier packs that may still
//! share the graph.
//!
//! What it keeps true, whatever the caller does between calls:
//!
//! * the graph, the kinds and the costs always cover the same positions;
//! * a change first detaches the reports still alive ([`DecisionRows::detach`]), so a kept
//!   report never makes the change copy the graph, and reads the same rows after it;
//! * a failed call can be undone ([`IndexedHistory::mark`], [`IndexedHistory::undo`]) to
//!   exactly what was there, memory included: a snapshot afterwards is byte for byte the one
//!   of before, with the same costs under the same encoding.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::costs::{
    CostEngine, CostMemo, CostPayload, CountStore, ItemSource, LegacyCostPayload, SwitchedCosts,
};
use crate::decisions::DecisionRows;
use crate::incremental::{reserve_ahead, Cut, GraphIndex, Mark, SnapshotError, TailGraph, Window};
use crate::items::ItemMeta;
use crate::mask::{maskable, MaskMemo, MaskSection, MaskedCosts, Masking, SwitchedMasks};
use crate::pack::{CostFailure, CostSource};
use crate::tokens::{CostBasis, ITEM_OVERHEAD};

/// Small table of the kind names met so far: positions store a one-byte code.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KindNames(Vec<&'static str>);

impl KindNames {
    /// The code of `name`, given a new one the first time it is met.
    pub fn code(&mut self, name: &'static str) -> u8 {
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

    /// The names, by code.
    pub fn names(&self) -> &[&'static str] {
        &self.0
    }
}

/// A decision report's rows, locked (a panic while they were locked cannot leave them torn:
/// a detach replaces them whole).
pub fn lock(rows: &Mutex<DecisionRows>) -> MutexGuard<'_, DecisionRows> {
    rows.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Where [`IndexedHistory::undo`] goes back to (from [`IndexedHistory::mark`]).
#[derive(Debug)]
pub struct HistoryMark {
    graph: Mark,
    len: usize,
    /// Kind names known at the mark (names met later are forgotten by the undo).
    names: usize,
    kinds_capacity: usize,
    costs_capacity: usize,
    masked_capacity: usize,
    /// The costs a [`IndexedHistory::switch_costs`] replaced since the mark.
    switched: Option<SwitchedCosts>,
    /// The masked costs a [`IndexedHistory::switch_masks`] replaced since the mark.
    switched_masks: Option<SwitchedMasks>,
}

/// The classified history of one session with its kinds, costs and live decision reports
/// (see the module notes).
#[derive(Debug, Default)]
pub struct IndexedHistory {
    graph: GraphIndex,
    /// Kind of every indexed position (a code into `kind_names`, for decision reports).
    kinds: Arc<Vec<u8>>,
    kind_names: KindNames,
    /// Cost of every indexed position under one basis (counted when needed).
    costs: CostMemo,
    /// Why the costs (or masked costs) of the snapshot this index was loaded from were not
    /// reused, if they were not (counted under another cost or masking rule).
    snapshot_costs_dropped: Option<&'static str>,
    /// Masked cost of the tool outputs counted masked (one encoding and excerpt size).
    masked: MaskMemo,
    /// The decision reports of earlier packs that may still share the graph and kinds.
    live: Vec<Weak<Mutex<DecisionRows>>>,
}

/// Records the kinds (and room for the costs) of appended items while the graph side is
/// extended elsewhere (see [`IndexedHistory::appender`]).
#[derive(Debug)]
pub struct KindNotes<'a> {
    kinds: &'a mut Arc<Vec<u8>>,
    names: &'a mut KindNames,
    costs: &'a mut CostMemo,
}

impl KindNotes<'_> {
    /// Record the kinds of `metas`, appended after what was noted so far; `rest` more
    /// items are coming (room is made for them too).
    pub fn note(&mut self, metas: &[ItemMeta], rest: usize) {
        let kinds = Arc::make_mut(self.kinds);
        let needed = metas.len() + rest;
        let headroom = needed + (kinds.len() + needed) / 8 + 64;
        reserve_ahead(kinds, needed, headroom);
        kinds.extend(metas.iter().map(|m| self.names.code(m.kind_name())));
        self.costs.grow(kinds.len(), needed, headroom);
    }
}

impl IndexedHistory {
    pub fn new() -> IndexedHistory {
        IndexedHistory::default()
    }

    pub fn len(&self) -> usize {
        self.graph.len()
    }

    pub fn is_empty(&self) -> bool {
        self.graph.is_empty()
    }

    /// The graph side.
    pub fn graph(&self) -> &GraphIndex {
        &self.graph
    }

    /// The kind code of every position (codes into [`IndexedHistory::kind_names`]).
    pub fn kinds(&self) -> &[u8] {
        &self.kinds
    }

    pub fn kind_names(&self) -> &KindNames {
        &self.kind_names
    }

    /// The costs counted so far.
    pub fn costs(&self) -> &CostMemo {
        &self.costs
    }

    /// The graph to pack over, with the memo a call's cost engine fills.
    pub fn graph_and_costs(&mut self) -> (&GraphIndex, &mut CostMemo) {
        (&self.graph, &mut self.costs)
    }

    /// [`IndexedHistory::graph_and_costs`] with the memo of masked costs too.
    pub fn graph_costs_and_masks(&mut self) -> (&GraphIndex, &mut CostMemo, &mut MaskMemo) {
        (&self.graph, &mut self.costs, &mut self.masked)
    }

    /// The masked costs counted so far.
    pub fn masked_costs(&self) -> &MaskMemo {
        &self.masked
    }

    /// A lower bound of what position `p` costs in a pack under `basis`, with `masking`:
    /// its known cost (else an item's overhead), and for a tool output with masking its known
    /// masked cost (else an item's overhead), which is never above either form's cost. (Tool
    /// outputs carry no opaque payload, so their masked cost depends on the encoding alone.)
    fn lower_bound(&self, p: usize, basis: CostBasis, masking: Option<Masking>) -> u64 {
        match masking {
            Some(m) if maskable(self.graph.kind(p)) => self
                .masked
                .get(p, basis, m.excerpt_tokens)
                .unwrap_or(ITEM_OVERHEAD),
            _ => self.costs.lower_bound(p, basis),
        }
    }

    /// Where a pack of `budget` over this history with `tail` appended can start reading:
    /// [`GraphIndex::window_start`] with each unit at the lower bound of its known costs
    /// under `basis` ([`CostMemo::lower_bound`]: never above the truth, so the window is
    /// never too short).
    pub fn window_start(
        &self,
        tail: &[ItemMeta],
        budget: u64,
        basis: impl Into<CostBasis>,
    ) -> usize {
        self.window_masked(tail, budget, basis, None).start
    }

    /// [`IndexedHistory::window_start`] for a pack with `masking`: a tool output counts at
    /// most its masked cost, so the walk adds up what the fill could take at the least (a
    /// unit whole or masked) and the proof at [`GraphIndex::window_start`] holds unchanged
    /// for a masked pack.
    pub fn window_start_masked(
        &self,
        tail: &[ItemMeta],
        budget: u64,
        basis: impl Into<CostBasis>,
        masking: Option<Masking>,
    ) -> usize {
        self.window_masked(tail, budget, basis, masking).start
    }

    /// [`IndexedHistory::window_start`] with why it is not later ([`GraphIndex::window`]).
    pub fn window(&self, tail: &[ItemMeta], budget: u64, basis: impl Into<CostBasis>) -> Window {
        self.window_masked(tail, budget, basis, None)
    }

    /// [`IndexedHistory::window_start_masked`] with why it is not later.
    pub fn window_masked(
        &self,
        tail: &[ItemMeta],
        budget: u64,
        basis: impl Into<CostBasis>,
        masking: Option<Masking>,
    ) -> Window {
        let basis = basis.into();
        let lower = |members: &[usize]| {
            Ok::<u64, Infallible>(members.iter().fold(0u64, |sum, &p| {
                sum.saturating_add(self.lower_bound(p, basis, masking))
            }))
        };
        let window = match masking {
            None => self.graph.window(tail, budget, lower),
            // A masked floor counts a tool output at an item's overhead, the rest whole.
            Some(_) => self.graph.window_masked(tail, budget, lower, |members| {
                Ok(members.iter().fold(0u64, |sum, &p| {
                    sum.saturating_add(if maskable(self.graph.kind(p)) {
                        ITEM_OVERHEAD
                    } else {
                        self.costs.lower_bound(p, basis)
                    })
                }))
            }),
        };
        window.unwrap_or_else(|never| match never {})
    }

    /// The earliest regrouping of the appends since the last call ([`GraphIndex::take_regrouped`]).
    pub fn take_regrouped(&mut self) -> Option<Cut> {
        self.graph.take_regrouped()
    }

    /// Approximate bytes of memory held.
    pub fn heap_bytes(&self) -> usize {
        self.graph.heap_bytes()
            + self.kinds.capacity()
            + self.costs.heap_bytes()
            + self.masked.heap_bytes()
    }

    /// How many times a change copied the whole graph because a report still shared it.
    pub fn graph_copies(&self) -> usize {
        self.graph.graph_copies()
    }

    /// Append classified items (positions continue from `len()`).
    pub fn append(&mut self, metas: Vec<ItemMeta>) {
        let (graph, mut notes) = self.appender();
        notes.note(&metas, 0);
        graph.extend(metas);
    }

    /// For an append done in steps on two threads: the graph side (to
    /// [`GraphIndex::extend`] and [`GraphIndex::reserve`]) and the notes of the kinds (to
    /// [`KindNotes::note`] for the same items, in the same order). Detaches the live
    /// reports first. Once the borrow ends, both must have seen the same items (else undo to
    /// a mark taken before).
    pub fn appender(&mut self) -> (&mut GraphIndex, KindNotes<'_>) {
        self.release_results();
        let notes = KindNotes {
            kinds: &mut self.kinds,
            names: &mut self.kind_names,
            costs: &mut self.costs,
        };
        (&mut self.graph, notes)
    }

    /// A point to come back to with [`IndexedHistory::undo`], before a call that appends
    /// items or switches the costs' encoding and may fail.
    pub fn mark(&self) -> HistoryMark {
        HistoryMark {
            graph: self.graph.mark(),
            len: self.graph.len(),
            names: self.kind_names.0.len(),
            kinds_capacity: self.kinds.capacity(),
            costs_capacity: self.costs.capacity(),
            masked_capacity: self.masked.capacity(),
            switched: None,
            switched_masks: None,
        }
    }

    /// Count under `basis` from now on (the costs start uncounted if they were counted
    /// under another one); an undo to `mark` puts back what they were.
    pub fn switch_costs(&mut self, basis: impl Into<CostBasis>, mark: &mut HistoryMark) {
        let switched = self.costs.switch(basis, self.graph.len());
        if mark.switched.is_none() {
            mark.switched = switched;
        }
    }

    /// Count masked costs under `encoding` and `excerpt_tokens` from now on (they start
    /// uncounted if they were counted under others); an undo to `mark` puts back what they
    /// were.
    pub fn switch_masks(
        &mut self,
        basis: impl Into<CostBasis>,
        excerpt_tokens: u64,
        mark: &mut HistoryMark,
    ) {
        let switched = self.masked.switch(basis, excerpt_tokens);
        if mark.switched_masks.is_none() {
            mark.switched_masks = switched;
        }
    }

    /// Put everything back as it was at `mark` (when only appends, cost counting and cost
    /// switches happened since): items, graph, kinds and kind names, costs and masked costs
    /// with what they are counted under, and the memory held.
    pub fn undo(&mut self, mark: HistoryMark) {
        self.release_results();
        self.graph.undo_to(mark.graph);
        if self.kinds.len() > mark.len || self.kinds.capacity() > mark.kinds_capacity {
            let kinds = Arc::make_mut(&mut self.kinds);
            kinds.truncate(mark.len);
            kinds.shrink_to(mark.kinds_capacity);
        }
        self.kind_names.0.truncate(mark.names);
        self.costs.restore(mark.switched, mark.len);
        self.costs.shrink_back(mark.len, mark.costs_capacity);
        self.masked.restore(mark.switched_masks);
        self.masked.shrink_back(mark.len, mark.masked_capacity);
    }

    /// The decision report of a pack over the indexed history (split at `tail.cut` when
    /// given), kept alive by the caller and detached before the next change.
    pub fn decision_rows(&mut self, tail: Option<TailGraph>) -> Arc<Mutex<DecisionRows>> {
        let rows = Arc::new(Mutex::new(DecisionRows::new(
            self.graph.shared_graph(),
            tail,
            Arc::clone(&self.kinds),
        )));
        self.live.retain(|t| t.strong_count() > 0);
        self.live.push(Arc::downgrade(&rows));
        rows
    }

    /// Detach the decision reports of earlier packs, so that a kept one never makes a change
    /// copy the graph or kinds. Only reports still alive copy anything (their own rows,
    /// compactly).
    pub fn release_results(&mut self) {
        for table in self.live.drain(..) {
            if let Some(rows) = table.upgrade() {
                lock(&rows).detach();
            }
        }
    }

    /// Keep only the first `len` items.
    pub fn truncate(&mut self, len: usize) {
        self.release_results();
        if self.kinds.len() > len {
            Arc::make_mut(&mut self.kinds).truncate(len);
        }
        self.costs.truncate(len);
        self.masked.truncate(len);
        self.graph.truncate(len);
    }

    /// Forget every item.
    pub fn clear(&mut self) {
        self.release_results();
        self.graph.clear();
        Arc::make_mut(&mut self.kinds).clear();
        self.costs.clear();
        self.masked.clear();
    }

    /// The index as bytes, costs and masked costs included, for
    /// [`IndexedHistory::from_snapshot`] with the same `binding` (see
    /// [`GraphIndex::to_snapshot`]): the whole costs ([`CostPayload`]) are the payload's
    /// attached data, the masked costs ([`crate::mask::MaskPayload`]) its extension, which
    /// a protoprompt that does not know it ignores
    /// ([`GraphIndex::to_snapshot_extended`]).
    pub fn snapshot(&self, binding: &[u8]) -> Vec<u8> {
        // Serialising a struct of vectors and strings into a Vec cannot fail (if it ever did,
        // the empty section would load as no masked cost).
        let masked = postcard::to_stdvec(&self.masked.payload()).unwrap_or_default();
        self.graph
            .to_snapshot_extended(&self.costs.payload(), &masked, binding)
    }

    /// Load what [`IndexedHistory::snapshot`] wrote for `binding`; a damaged cost or masked
    /// cost payload is [`SnapshotError::Damaged`]. Nothing is ever loaded in part. The costs
    /// of a snapshot counted under another cost rule ([`crate::tokens::COST_RULE`]; rule 1
    /// snapshots carry no rule) are not reused: the items and graph are, and every cost is
    /// counted again ([`IndexedHistory::snapshot_costs_dropped`] says why); nor are masked
    /// costs of another masking or cost rule ([`crate::mask::MASK_RULE`]). A snapshot
    /// written before masked costs were stored loads with none.
    pub fn from_snapshot(bytes: &[u8], binding: &[u8]) -> Result<IndexedHistory, SnapshotError> {
        let current = GraphIndex::from_snapshot_extended::<CostPayload>(bytes, binding);
        let (graph, costs, dropped, extension) = match current {
            Ok((graph, payload, extension)) if payload.is_current_rule() => {
                let costs =
                    CostMemo::from_payload(payload, graph.len()).map_err(SnapshotError::Damaged)?;
                (graph, costs, None, extension)
            }
            other => match GraphIndex::from_snapshot::<LegacyCostPayload>(bytes, binding) {
                // A rule 1 snapshot (its payload begins with the encoding).
                Ok((graph, legacy)) => {
                    let costs = CostMemo::from_legacy_payload(legacy, graph.len())
                        .map_err(SnapshotError::Damaged)?;
                    (graph, costs, Some(RULE_1), &[][..])
                }
                Err(_) => match other {
                    // A later rule's snapshot: its items and graph, none of its costs (nor
                    // masked costs, counted under that rule).
                    Ok((graph, payload, _)) => {
                        let costs = CostMemo::from_payload(payload, graph.len())
                            .map_err(SnapshotError::Damaged)?;
                        (graph, costs, Some(OTHER_RULE), &[][..])
                    }
                    Err(error) => return Err(error),
                },
            },
        };
        let kind = |p: usize| graph.kind(p);
        let (masked, dropped) = match MaskMemo::from_section(extension, &kind, graph.len(), &costs)
            .map_err(SnapshotError::Damaged)?
        {
            MaskSection::Loaded(masked) => (masked, dropped),
            MaskSection::Dropped(why) => (MaskMemo::new(), dropped.or(Some(why))),
        };
        let mut kind_names = KindNames::default();
        let kinds = (0..graph.len())
            .map(|p| kind_names.code(graph.kind(p).name()))
            .collect();
        Ok(IndexedHistory {
            graph,
            kinds: Arc::new(kinds),
            kind_names,
            costs,
            snapshot_costs_dropped: dropped,
            masked,
            live: Vec::new(),
        })
    }

    /// Why the costs or masked costs of the snapshot this index was loaded from were not
    /// reused (`None`: they were, or the index was not loaded from a snapshot).
    pub fn snapshot_costs_dropped(&self) -> Option<&'static str> {
        self.snapshot_costs_dropped
    }
}

const RULE_1: &str = "counted under cost rule 1 (opaque payloads as text): counted again";
const OTHER_RULE: &str = "counted under another cost rule: counted again";

/// Where a pack of `budget` over `graph`'s history can start reading, with the units counted
/// exactly: positions from `offset` on (those the caller's list holds) by `engine`, earlier
/// ones at their known cost, else the item overhead (a lower bound, so the window is never
/// too short). The budget is that of the history alone: no items are appended.
pub fn counted_window_start<F: ItemSource, S: CountStore>(
    graph: &GraphIndex,
    engine: &mut CostEngine<'_, F, S>,
    budget: u64,
    offset: usize,
) -> Result<usize, CostFailure> {
    graph.window_start(&[], budget, |members| {
        let listed: Vec<usize> = members.iter().copied().filter(|&p| p >= offset).collect();
        let counted = engine.costs(&listed)?;
        let earlier = members
            .iter()
            .filter(|&&p| p < offset)
            .map(|&p| engine.known(p).unwrap_or(crate::tokens::ITEM_OVERHEAD));
        Ok(counted
            .into_iter()
            .chain(earlier)
            .fold(0u64, |sum, c| sum.saturating_add(c)))
    })
}

/// [`counted_window_start`] for a masked pack: units whose members the caller's list holds
/// are counted at their masked cost (exactly; with the whole costs, so both are known for
/// the next window), any other at the lower bounds of [`IndexedHistory::window_start`].
pub fn counted_masked_window_start<F: ItemSource, S: CountStore>(
    graph: &GraphIndex,
    masked: &mut MaskedCosts<'_, CostEngine<'_, F, S>>,
    budget: u64,
    offset: usize,
) -> Result<usize, CostFailure> {
    let masked = std::cell::RefCell::new(masked);
    let lower = |members: &[usize]| {
        let mut masked = masked.borrow_mut();
        if members.iter().all(|&p| p >= offset) {
            let costs = masked.masked_costs(members)?;
            return Ok(costs.into_iter().fold(0u64, |sum, c| sum.saturating_add(c)));
        }
        Ok(members.iter().fold(0u64, |sum, &p| {
            let bound = if maskable(graph.kind(p)) {
                masked.known_masked(p).unwrap_or(ITEM_OVERHEAD)
            } else {
                masked.inner().known(p).unwrap_or(ITEM_OVERHEAD)
            };
            sum.saturating_add(bound)
        }))
    };
    // The masked floors of the turn check ([`GraphIndex::window_masked`]): the members other
    // than tool outputs counted exactly when listed, so a later window finds the same start.
    let floor = |members: &[usize]| {
        let mut masked = masked.borrow_mut();
        let engine = masked.inner();
        let (outputs, others): (Vec<usize>, Vec<usize>) =
            members.iter().partition(|&&p| maskable(graph.kind(p)));
        let listed: Vec<usize> = others.iter().copied().filter(|&p| p >= offset).collect();
        let earlier = others
            .iter()
            .filter(|&&p| p < offset)
            .map(|&p| engine.known(p).unwrap_or(ITEM_OVERHEAD))
            .fold(0u64, u64::saturating_add);
        let overheads = (outputs.len() as u64).saturating_mul(ITEM_OVERHEAD);
        Ok(engine
            .costs(&listed)?
            .into_iter()
            .fold(overheads.saturating_add(earlier), u64::saturating_add))
    };
    graph
        .window_masked(&[], budget, lower, floor)
        .map(|w| w.start)
}

/// What the history of `total` positions costs, summed newest first from `source`, stopping
/// once the sum exceeds `limit`: `(sum so far, whether it exceeds limit)`. Costs the source
/// already knows (an index's memo) are taken as they are; a run of unknown ones is counted
/// in chunks that start small and double (16 to 1024 positions), so a walk that stops early
/// counts little past where it stopped and never counts the older positions. Answers "does
/// the history cost more than `limit`" (a token-aware compaction trigger) without reading
/// every item.
pub fn cost_over(
    source: &mut dyn CostSource,
    total: usize,
    limit: u64,
) -> Result<(u64, bool), CostFailure> {
    let mut sum = 0u64;
    let mut end = total;
    let mut chunk = 16usize;
    while end > 0 {
        while end > 0 {
            let Some(cost) = source.known(end - 1) else {
                break;
            };
            sum = sum.saturating_add(cost);
            end -= 1;
            if sum > limit {
                return Ok((sum, true));
            }
        }
        if end == 0 {
            break;
        }
        let start = end.saturating_sub(chunk);
        let positions: Vec<usize> = (start..end).rev().collect();
        for cost in source.costs(&positions)? {
            sum = sum.saturating_add(cost);
            if sum > limit {
                return Ok((sum, true));
            }
        }
        end = start;
        chunk = (chunk * 2).min(1024);
    }
    Ok((sum, false))
}

impl IndexedHistory {
    /// Positions of the user messages (turn boundaries) in `start..end` of the index.
    pub fn user_positions(&self, start: usize, end: usize) -> Vec<usize> {
        let end = end.min(self.len());
        (start.min(end)..end)
            .filter(|&p| self.graph.is_user_message(p))
            .collect()
    }
}

#[cfg(test)]
mod cost_over_tests {
    use super::*;

    struct Fixed {
        costs: Vec<u64>,
        asked: Vec<usize>,
    }

    impl CostSource for Fixed {
        fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
            self.asked.extend_from_slice(positions);
            Ok(positions.iter().map(|&p| self.costs[p]).collect())
        }
    }

    /// A source that knows the costs of the newest `known` positions.
    struct Memo {
        inner: Fixed,
        known_from: usize,
    }

    impl CostSource for Memo {
        fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
            self.inner.costs(positions)
        }

        fn known(&self, position: usize) -> Option<u64> {
            (position >= self.known_from).then(|| self.inner.costs[position])
        }
    }

    #[test]
    fn known_costs_are_taken_without_counting() {
        let mut source = Memo {
            inner: Fixed {
                costs: vec![10; 100],
                asked: Vec::new(),
            },
            known_from: 90,
        };
        assert_eq!(cost_over(&mut source, 100, 55).unwrap(), (60, true));
        assert!(source.inner.asked.is_empty());
        assert_eq!(cost_over(&mut source, 100, 105).unwrap(), (110, true));
        assert_eq!(source.inner.asked, (74..90).rev().collect::<Vec<_>>());
    }

    #[test]
    fn stops_at_the_first_chunk_that_passes_the_limit() {
        let mut source = Fixed {
            costs: vec![10; 1000],
            asked: Vec::new(),
        };
        assert_eq!(cost_over(&mut source, 1000, 500).unwrap(), (510, true));
        // Newest first, in chunks of 16, 32...: 51 were needed, 16 + 32 + 64 were asked,
        // the older 888 positions never.
        assert_eq!(source.asked.len(), 112);
        assert_eq!(source.asked[0], 999);
        let mut source = Fixed {
            costs: vec![10; 1000],
            asked: Vec::new(),
        };
        assert_eq!(
            cost_over(&mut source, 1000, 10_000).unwrap(),
            (10_000, false)
        );
        assert_eq!(source.asked.len(), 1000);
        assert_eq!(cost_over(&mut source, 0, 0).unwrap(), (0, false));
    }

    #[test]
    fn a_limit_equal_to_the_cost_is_not_exceeded() {
        let mut source = Fixed {
            costs: vec![7, 3],
            asked: Vec::new(),
        };
        assert_eq!(cost_over(&mut source, 2, 10).unwrap(), (10, false));
        assert_eq!(cost_over(&mut source, 2, 9).unwrap(), (10, true));
    }
}
