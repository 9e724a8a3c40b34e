//! An append-only index of a session's history, so that the next turn's pack costs what is
//! new and what is kept, not the length of the history.
//!
//! # Design note
//!
//! * **What is kept.** The classified items ([`ItemMeta`]) of the history, the graph of the
//!   history alone, and for every *relation string* (the `call_id`, `id`,
//!   `approval_request_id` and `caller.caller_id` values: every edge and every cross-item rule
//!   of [`crate::graph`] compares one of these) a 64-bit hash mapped to the first position
//!   holding it; for every anonymous tool-search item, the pairing state after it.
//! * **The cut.** For a block of items `T` placed after the history (the next turn's
//!   `new_input`, or items appended to the history), the *cut* `c` is the smallest position
//!   such that nothing in `c..` is related to anything before `c`: no relation string of an
//!   item at or after `c` occurs before `c`, no reasoning run (reasoning with the model
//!   items that follow it) crosses `c`, and no anonymous tool-search output from `c` on
//!   pairs with (or continues) a call before `c` under the graph's own pairing rule
//!   ([`crate::graph::AnonState`], replayed from the pairing state the index keeps after
//!   each anonymous item: a streamed search pairs within itself and never moves the cut).
//!   It is found by a fixpoint that only reads items after the cut. Then the
//!   units of `history ++ T` are the cached units wholly before `c` plus the units of a
//!   small graph built over `c..` — the same units, problems and order as building the whole
//!   graph (tested for random histories against [`crate::graph::build_graph`]). A hash
//!   collision can only move the cut earlier (more work, same result).
//! * **What is linear.** Nothing per turn: appending `k` items and packing cost
//!   O(k + items after the cut + units visited by the fill), plus a linear but allocation
//!   free pass over the unit list when the per-unit decisions are reported. Removing the
//!   newest items ([`GraphIndex::truncate`], a `pop_item`) regroups only what the removed
//!   items were related to, the mirror image of an append.
//! * **Memory.** Items are stored compactly (see [`GraphIndex`]); a long history is best
//!   appended in chunks, with [`GraphIndex::reserve`] after the first, so that full-size
//!   [`ItemMeta`]s exist for one chunk at a time and no store regrows (the binding does this,
//!   also for a one-off pack).
//! * **What the caller promises.** The positions the index has seen are not changed behind
//!   its back (the SDK's `SQLiteSession` only appends, pops the last item or clears, and
//!   [`GraphIndex::truncate`] / [`GraphIndex::clear`] cover those).

use std::hash::Hasher;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHasher};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use siphasher::sip128::{Hasher128, SipHasher13};

use crate::graph::{
    build_graph, build_graph_refs, position_label, AnonState, AnonStep, Graph, GraphView,
    InvalidReason, Problem, Unit,
};
use crate::items::{CallType, ItemKind, ItemMeta, RawCaller, RawItem, FAKE_ID};

fn relation_hash(s: &str) -> u64 {
    let mut h = FxHasher::default();
    h.write(s.as_bytes());
    h.write_u8(0xff);
    h.finish()
}

/// Whether an item's `id` can relate it to another item: never a message's `id` (messages are
/// not de-duplicated, paired or checked for duplicates) nor the `__fake_id__` placeholder that
/// Chat Completions models give every item (the SDK ignores it), except where the `id` is the
/// item's call key. Counting those would let one early placeholder pull every cut back to it.
fn id_relates(kind: ItemKind, item_type: Option<&str>, has_role: bool, id: &str) -> bool {
    let call_key = matches!(
        kind,
        ItemKind::Call(CallType::McpApprovalRequest) | ItemKind::Output(CallType::LocalShellCall)
    );
    call_key || (!has_role && item_type != Some("message") && id != FAKE_ID)
}

/// Hashes of the relation strings of one item.
fn relation_keys(m: &ItemMeta) -> impl Iterator<Item = u64> + '_ {
    tied_keys(m).map(|(_, k)| k)
}

/// The relation strings of one item, hashed, with the field each comes from.
fn tied_keys(m: &ItemMeta) -> impl Iterator<Item = (Tie, u64)> + '_ {
    let r = &m.raw;
    let id =
        r.id.as_deref()
            .filter(|id| id_relates(m.kind, r.item_type.as_deref(), r.role.is_some(), id));
    [
        (Tie::CallId, r.call_id.as_deref()),
        (Tie::Id, id),
        (Tie::ApprovalRequestId, r.approval_request_id.as_deref()),
        (
            Tie::CallerId,
            r.caller.as_ref().and_then(|c| c.caller_id.as_deref()),
        ),
    ]
    .into_iter()
    .filter_map(|(tie, s)| s.map(|s| (tie, relation_hash(s))))
}

/// A unit's cost (or a bound of it) from its members' positions.
type UnitCost<'a, E> = dyn FnMut(&[usize]) -> Result<u64, E> + 'a;

/// What ties an item at or after a cut to an earlier one (what moved a cut back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tie {
    /// The same `call_id` (a call and its output, duplicate calls, a program and its output).
    CallId,
    /// The same `id` (duplicate reasoning or hosted items, a local shell output by `id`).
    Id,
    /// An `approval_request_id` naming an earlier approval request.
    ApprovalRequestId,
    /// A program `caller_id` naming an earlier program.
    CallerId,
    /// A run of reasoning and model items (a reasoning block) crosses the position.
    ReasoningRun,
    /// Anonymous tool searches pair across the position (docs/item-graph.md §5).
    AnonymousSearch,
    /// One unit of the history spans both positions.
    Unit,
    /// A masked pack checks the rest of a turn back to its user message (`Fill::turn_cannot_fit`
    /// in [`crate::pack`]): the turn of the unit the budget stops at reaches back there.
    Turn,
}

impl Tie {
    /// Stable snake_case name.
    pub fn code(self) -> &'static str {
        match self {
            Tie::CallId => "call_id",
            Tie::Id => "id",
            Tie::ApprovalRequestId => "approval_request_id",
            Tie::CallerId => "caller_id",
            Tie::ReasoningRun => "reasoning_run",
            Tie::AnonymousSearch => "anonymous_tool_search",
            Tie::Unit => "unit",
            Tie::Turn => "turn",
        }
    }
}

/// A relation that moved a cut (or a window's start) back: the item at `from` is tied to
/// the earlier position `to` by `tie`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pull {
    pub tie: Tie,
    pub from: usize,
    pub to: usize,
}

impl Pull {
    /// A sentence for a person; positions from `n_history` on are new input.
    pub fn describe(&self, n_history: usize) -> String {
        let (from, to) = (
            position_label(n_history, self.from),
            position_label(n_history, self.to),
        );
        match self.tie {
            Tie::CallId | Tie::Id | Tie::ApprovalRequestId | Tie::CallerId => {
                format!("the {} of {from} is that of {to}", self.tie.code())
            }
            Tie::ReasoningRun => format!("a reasoning block runs from {to} to {from}"),
            Tie::AnonymousSearch => {
                format!("the anonymous tool search output {from} pairs with the call {to}")
            }
            Tie::Unit => format!("{to} and {from} are one unit"),
            Tie::Turn => {
                format!("a masked pack checks the turn of {from} back to {to} (whether it can fit)")
            }
        }
    }
}

/// A cut ([`GraphIndex::cut_from`]) with the relation that set it, if one moved it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub position: usize,
    /// The last relation that moved the cut back, to `position` (`None`: it did not move).
    pub pull: Option<Pull>,
}

/// Where a windowed read may start ([`GraphIndex::window`]), and why not later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The first position a pack can cost or keep (0: the whole history).
    pub start: usize,
    /// The budget reaches the oldest unit: the whole history may be needed.
    pub fits: bool,
    /// The relation that moved the start back last (when `start == 0` and not `fits`: why
    /// no window can be proved).
    pub pull: Option<Pull>,
    /// How far back the budget alone reaches: the newest position of the unit whose cost
    /// passed it (`start` is earlier when units or relations span further back; 0 when the
    /// budget is never passed).
    pub reach: usize,
}

/// The anonymous-pairing state after one anonymous item of the index (see [`AnonState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AnonEntry {
    pos: usize,
    after: AnonState,
}

/// Member of a reasoning run (E4, docs/item-graph.md §12.2).
fn continues(m: &ItemMeta) -> bool {
    m.is_reasoning() || m.is_model_emitted() || m.is_server_output() || m.is_chat_model_message()
}

/// Make room for `needed` more elements; when growing, leave `headroom` free.
pub fn reserve_ahead<T>(v: &mut Vec<T>, needed: usize, headroom: usize) {
    if v.capacity() - v.len() < needed {
        v.reserve_exact(headroom.max(needed));
    }
}

/// Where [`GraphIndex::undo_to`] goes back to (from [`GraphIndex::mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    len: usize,
    arena: usize,
    overflow: usize,
    /// Of the items, the arena, the relation-key map, the graph's units and `unit_of`.
    capacity: [usize; 5],
    /// Of the anonymous tool-search records.
    anon_capacity: usize,
}

/// The graph over the positions after a cut, built for one pack (see [`GraphIndex::tail`]).
#[derive(Debug, Clone)]
pub struct TailGraph {
    /// First position of the tail.
    pub cut: usize,
    /// The relation that moved the cut back from the end of the history, if one did.
    pub pull: Option<Pull>,
    /// Units over `cut..` (history after the cut, then the new items), members global.
    pub graph: Graph,
}

/// A string field kept in the index's arena: `arena[offset..offset + len]`; `len ==
/// u32::MAX` = absent; `offset == u32::MAX` = `overflow[len]` (an arena is at most 4 GiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Span {
    offset: u32,
    len: u32,
}

const ABSENT: Span = Span {
    offset: 0,
    len: u32::MAX,
};

/// The string fields of [`crate::items::RawItem`], in this order.
const STRING_FIELDS: usize = 10;

/// One indexed item, compact: its kind, flags and string fields as arena spans (an
/// [`ItemMeta`] with its own heap strings is about four times larger).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Stored {
    kind: ItemKind,
    flags: u8,
    spans: [Span; STRING_FIELDS],
}

const HAS_CALLER: u8 = 1;
const ENCRYPTED: u8 = 2;
const PROVIDER_DATA: u8 = 4;
const TOOL_CALLS: u8 = 8;
const TOOL_CALL_ID: u8 = 16;
const CONTINUES: u8 = 32;
const ALL_FLAGS: u8 =
    HAS_CALLER | ENCRYPTED | PROVIDER_DATA | TOOL_CALLS | TOOL_CALL_ID | CONTINUES;

/// The classified history of one session and its graph, extended item by item: the graph
/// side of an index (no costs, no Python). [`crate::indexed::IndexedHistory`] adds the
/// kinds, costs and decision reports; the Python `protoprompt.HistoryIndex` wraps one.
#[derive(Debug, Clone, Default)]
pub struct GraphIndex {
    items: Vec<Stored>,
    /// The string fields of every item, back to back.
    arena: String,
    /// Fields that no longer fit in the arena's 32-bit offsets.
    overflow: Vec<String>,
    /// Low-cardinality values (types, roles, statuses) stored once.
    common: FxHashMap<String, Span>,
    first: FxHashMap<u64, usize>,
    /// Shared with the reports of earlier packs; copied on write only while one is alive.
    graph: Arc<Graph>,
    /// How many times a mutation had to copy the graph because something else shared it.
    graph_copies: usize,
    /// Every anonymous tool-search item, with the pairing state after it (positions sorted).
    anon: Vec<AnonEntry>,
    /// The earliest regrouping of the appends since [`GraphIndex::take_regrouped`].
    regrouped: Option<Cut>,
}

impl GraphIndex {
    pub fn new() -> GraphIndex {
        GraphIndex::default()
    }

    /// The graph, to change: copied first if a report of an earlier pack still shares it.
    fn graph_mut(&mut self) -> &mut Graph {
        if Arc::get_mut(&mut self.graph).is_none() {
            self.graph_copies += 1;
        }
        Arc::make_mut(&mut self.graph)
    }

    /// How many times a change to the index had to copy its whole graph because a kept
    /// report still shared it (for tests: a caller releasing its reports keeps this 0).
    pub fn graph_copies(&self) -> usize {
        self.graph_copies
    }

    /// Number of indexed history items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The kind of the indexed item at `pos`.
    pub fn kind(&self, pos: usize) -> ItemKind {
        self.items[pos].kind
    }

    /// Whether the item at `pos` carries `provider_data` (non-null).
    pub fn has_provider_data(&self, pos: usize) -> bool {
        self.items[pos].flags & PROVIDER_DATA != 0
    }

    /// Whether the item at `pos` is a user message (a turn boundary).
    pub fn is_user_message(&self, pos: usize) -> bool {
        self.items[pos].kind == ItemKind::UserMessage
    }

    /// The classified item at `pos`, rebuilt from the compact store.
    pub fn meta(&self, pos: usize) -> ItemMeta {
        let st = &self.items[pos];
        let f = |i: usize| self.text(st.spans[i]).map(str::to_string);
        let raw = RawItem {
            item_type: f(0),
            role: f(1),
            id: f(2),
            call_id: f(3),
            status: f(4),
            execution: f(5),
            approval_request_id: f(6),
            caller: (st.flags & HAS_CALLER != 0).then(|| RawCaller {
                caller_type: f(7),
                caller_id: f(8),
            }),
            has_encrypted_content: st.flags & ENCRYPTED != 0,
            has_provider_data: st.flags & PROVIDER_DATA != 0,
            has_tool_calls: st.flags & TOOL_CALLS != 0,
            has_tool_call_id: st.flags & TOOL_CALL_ID != 0,
            provider_data_type: f(9),
        };
        ItemMeta { kind: st.kind, raw }
    }

    /// Approximate heap bytes held by the index.
    pub fn heap_bytes(&self) -> usize {
        self.items.capacity() * std::mem::size_of::<Stored>()
            + self.arena.capacity()
            + self.first.capacity() * 24
            + self.anon.capacity() * std::mem::size_of::<AnonEntry>()
            + self.graph.unit_of.capacity() * std::mem::size_of::<usize>()
            + self
                .graph
                .units
                .iter()
                .map(|u| {
                    std::mem::size_of_val(u)
                        + u.members.capacity() * std::mem::size_of::<usize>()
                        + u.problems.capacity() * std::mem::size_of::<crate::graph::Problem>()
                })
                .sum::<usize>()
    }

    fn text(&self, span: Span) -> Option<&str> {
        if span == ABSENT {
            return None;
        }
        if span.offset == u32::MAX {
            return self.overflow.get(span.len as usize).map(String::as_str);
        }
        let start = span.offset as usize;
        self.arena.get(start..start + span.len as usize)
    }

    fn store_text(&mut self, value: Option<&str>, common: bool) -> Span {
        let Some(v) = value else {
            return ABSENT;
        };
        if common && v.len() <= 32 {
            if let Some(&span) = self.common.get(v) {
                return span;
            }
        }
        let end = self.arena.len() + v.len();
        let span = if end < u32::MAX as usize {
            let span = Span {
                offset: self.arena.len() as u32,
                len: v.len() as u32,
            };
            self.arena.push_str(v);
            span
        } else {
            self.overflow.push(v.to_string());
            Span {
                offset: u32::MAX,
                len: (self.overflow.len() - 1) as u32,
            }
        };
        if common && v.len() <= 32 {
            self.common.insert(v.to_string(), span);
        }
        span
    }

    fn store(&mut self, m: &ItemMeta) {
        let r = &m.raw;
        let caller = r.caller.as_ref();
        let mut flags = 0u8;
        for (on, bit) in [
            (caller.is_some(), HAS_CALLER),
            (r.has_encrypted_content, ENCRYPTED),
            (r.has_provider_data, PROVIDER_DATA),
            (r.has_tool_calls, TOOL_CALLS),
            (r.has_tool_call_id, TOOL_CALL_ID),
            (continues(m), CONTINUES),
        ] {
            if on {
                flags |= bit;
            }
        }
        let spans = [
            self.store_text(r.item_type.as_deref(), true),
            self.store_text(r.role.as_deref(), true),
            self.store_text(r.id.as_deref(), r.id.as_deref() == Some(FAKE_ID)),
            self.store_text(r.call_id.as_deref(), false),
            self.store_text(r.status.as_deref(), true),
            self.store_text(r.execution.as_deref(), true),
            self.store_text(r.approval_request_id.as_deref(), false),
            self.store_text(caller.and_then(|c| c.caller_type.as_deref()), true),
            self.store_text(caller.and_then(|c| c.caller_id.as_deref()), false),
            self.store_text(r.provider_data_type.as_deref(), true),
        ];
        self.items.push(Stored {
            kind: m.kind,
            flags,
            spans,
        });
    }

    /// Relation keys of the indexed item at `pos` (same as [`relation_keys`] of its meta).
    fn stored_keys(&self, pos: usize) -> impl Iterator<Item = u64> + '_ {
        self.stored_tied_keys(pos).map(|(_, k)| k)
    }

    /// [`Self::stored_keys`] with the field each comes from (as [`tied_keys`]).
    fn stored_tied_keys(&self, pos: usize) -> impl Iterator<Item = (Tie, u64)> + '_ {
        let st = &self.items[pos];
        let id = self
            .text(st.spans[2])
            .filter(|id| id_relates(st.kind, self.text(st.spans[0]), st.spans[1] != ABSENT, id));
        [
            (Tie::CallId, self.text(st.spans[3])),
            (Tie::Id, id),
            (Tie::ApprovalRequestId, self.text(st.spans[6])),
            (Tie::CallerId, self.text(st.spans[8])),
        ]
        .into_iter()
        .filter_map(|(tie, s)| s.map(|s| (tie, relation_hash(s))))
    }

    /// Record the anonymous tool-search items among the items from `from` on (appended),
    /// continuing the pairing state of the items before them.
    fn note_anonymous(&mut self, from: usize) {
        let mut state = self.anon.last().map_or(AnonState::default(), |e| e.after);
        for pos in from..self.items.len() {
            let kind = self.items[pos].kind;
            if !matches!(
                kind,
                ItemKind::AnonToolSearchCall | ItemKind::AnonToolSearchOutput
            ) {
                continue;
            }
            let anon = &self.anon;
            state.step(pos, kind, |c| Self::below_in(anon, c));
            self.anon.push(AnonEntry { pos, after: state });
        }
    }

    /// The open anonymous call under the indexed anonymous call `call` (the open one before
    /// it was made), from the recorded states.
    fn below_in(anon: &[AnonEntry], call: usize) -> Option<usize> {
        let i = anon.partition_point(|e| e.pos < call);
        i.checked_sub(1).and_then(|i| anon[i].after.open)
    }

    /// The anonymous pairing state after the indexed items before `pos`.
    fn anon_state_at(&self, pos: usize) -> AnonState {
        let i = self.anon.partition_point(|e| e.pos < pos);
        i.checked_sub(1)
            .map_or(AnonState::default(), |i| self.anon[i].after)
    }

    /// Replays the anonymous pairing of the items from `c` on (the indexed ones, then
    /// `tail`) from the true state before `c`: the earliest anonymous call before `c` that an
    /// output from `c` on pairs with or continues, if any. Without one, the anonymous items
    /// from `c` on pair exactly as in a graph built over `c..` alone, and nothing before `c`
    /// pairs with them (an output only ever pairs with a call to its left).
    fn anon_pull(&self, c: usize, tail: &[ItemMeta]) -> Option<Pull> {
        let mut state = self.anon_state_at(c);
        state.last_call?; // no anonymous call before `c`: nothing to pair with
        let n = self.items.len();
        let start = self.anon.partition_point(|e| e.pos < c);
        let indexed = self.anon[start..]
            .iter()
            .map(|e| (e.pos, self.items[e.pos].kind));
        let appended = tail.iter().enumerate().map(|(j, m)| (n + j, m.kind));
        let mut below: FxHashMap<usize, Option<usize>> = FxHashMap::default();
        let mut pull: Option<Pull> = None;
        for (pos, kind) in indexed.chain(appended) {
            let anon = &self.anon;
            let step = state.step(pos, kind, |q| {
                if q >= c {
                    below.get(&q).copied().flatten()
                } else {
                    Self::below_in(anon, q)
                }
            });
            match step {
                AnonStep::Opened { below: under } => {
                    below.insert(pos, under);
                }
                AnonStep::Paired(q) | AnonStep::Chunk(q)
                    if q < c && pull.is_none_or(|p| q < p.to) =>
                {
                    pull = Some(Pull {
                        tie: Tie::AnonymousSearch,
                        from: pos,
                        to: q,
                    });
                }
                _ => {}
            }
        }
        pull
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
        *self = GraphIndex::default();
    }

    /// Keep only the first `len` items, rebuilt compactly from scratch (capacity and arena
    /// sized for them alone: what undoing a failed append needs). See [`GraphIndex::truncate`].
    pub fn rebuild(&mut self, len: usize) {
        let metas: Vec<ItemMeta> = (0..len.min(self.items.len()))
            .map(|p| self.meta(p))
            .collect();
        self.clear();
        self.extend(metas);
    }

    /// A point to come back to with [`GraphIndex::undo_to`] (e.g. before a call that
    /// appends items and may fail).
    pub fn mark(&self) -> Mark {
        Mark {
            len: self.items.len(),
            arena: self.arena.len(),
            overflow: self.overflow.len(),
            capacity: [
                self.items.capacity(),
                self.arena.capacity(),
                self.first.capacity(),
                self.graph.units.capacity(),
                self.graph.unit_of.capacity(),
            ],
            anon_capacity: self.anon.capacity(),
        }
    }

    /// Put the index back exactly as it was at `mark`, when only appends happened since:
    /// the appended items, their relation keys, their units and the strings they added to
    /// the arena are gone (a snapshot is then byte for byte the one of that time), and
    /// memory reserved for them is given back.
    pub fn undo_to(&mut self, mark: Mark) {
        if mark.len < self.items.len() {
            self.truncate(mark.len);
        }
        self.arena.truncate(mark.arena);
        self.overflow.truncate(mark.overflow);
        self.common.retain(|_, span| {
            if span.offset == u32::MAX {
                (span.len as usize) < mark.overflow
            } else {
                span.offset as usize + span.len as usize <= mark.arena
            }
        });
        let [items, arena, first, units, unit_of] = mark.capacity;
        self.items.shrink_to(items);
        self.arena.shrink_to(arena);
        self.first.shrink_to(first);
        self.anon.shrink_to(mark.anon_capacity);
        if self.graph.units.capacity() > units || self.graph.unit_of.capacity() > unit_of {
            let g = self.graph_mut();
            g.units.shrink_to(units);
            g.unit_of.shrink_to(unit_of);
        }
    }

    /// Keep only the first `len` items (what a `pop_item` does to the session).
    ///
    /// The mirror image of [`GraphIndex::extend`]: the removed items are the block after
    /// the kept ones, so with the cut `c` of that block the units wholly before `c` are the
    /// same with or without it, and only `c..len` is regrouped. Relation keys first seen in
    /// the removed items are forgotten; their strings stay in the arena (a few bytes per
    /// popped item, reclaimed by [`GraphIndex::clear`]).
    pub fn truncate(&mut self, len: usize) {
        let n = self.items.len();
        if len >= n {
            return;
        }
        if len == 0 {
            self.clear();
            return;
        }
        let removed: Vec<ItemMeta> = (len..n).map(|p| self.meta(p)).collect();
        for m in &removed {
            for k in relation_keys(m) {
                if self.first.get(&k).is_some_and(|&f| f >= len) {
                    self.first.remove(&k);
                }
            }
        }
        self.items.truncate(len);
        let kept = self.anon.partition_point(|e| e.pos < len);
        self.anon.truncate(kept);
        let c = self.cut(&removed);
        let region: Vec<ItemMeta> = (c..len).map(|p| self.meta(p)).collect();
        let mut tail = build_graph(&region, &[]);
        tail.shift_positions(c);
        let g = self.graph_mut();
        let k = g.unit_of[c];
        g.units.truncate(k);
        g.unit_of.truncate(c);
        g.unit_of.extend(tail.unit_of.iter().map(|u| u + k));
        g.units.extend(tail.units);
        g.n_history = len;
    }

    /// The smallest cut for a block `tail` placed after the history (see the module note).
    pub fn cut(&self, tail: &[ItemMeta]) -> usize {
        self.cut_from(self.items.len(), tail)
    }

    /// The smallest cut at or before `from` for the indexed items from `from` on followed by
    /// `tail`: nothing in `c..` (history, then `tail`) is related to anything before `c`, so
    /// the units at and after `c` are those of a graph built over `c..` alone. [`Self::cut`]
    /// is the case `from = len`.
    pub fn cut_from(&self, from: usize, tail: &[ItemMeta]) -> usize {
        self.cut_explained(from, tail).position
    }

    /// [`Self::cut_from`], with the relation that moved the cut to where it is.
    ///
    /// A fixpoint that reads only the items after the cut: the relation strings of the items
    /// from `c` on move `c` to the first position holding one; a reasoning block crossing
    /// `c` moves it to the block's start; and anonymous tool searches from `c` on, replayed
    /// from the pairing state before `c` by the graph's own rule ([`AnonState`]), move it to
    /// the earliest call before `c` they pair with or continue (a streamed search whose
    /// chunks all follow their own call does not: it pairs within itself).
    pub fn cut_explained(&self, from: usize, tail: &[ItemMeta]) -> Cut {
        let n = self.items.len();
        let total = n + tail.len();
        let cont = |q: usize| -> bool {
            if q < n {
                self.items[q].flags & CONTINUES != 0
            } else {
                continues(&tail[q - n])
            }
        };
        let mut c = from.min(n);
        let mut pull: Option<Pull> = None;
        let mut folded = total; // relation keys of `folded..` are accounted for
        loop {
            let mut next = c;
            let mut fold = |q: usize, (tie, k): (Tie, u64)| {
                if let Some(&f) = self.first.get(&k) {
                    if f < next {
                        next = f;
                        pull = Some(Pull {
                            tie,
                            from: q,
                            to: f,
                        });
                    }
                }
            };
            for q in c..folded {
                if q < n {
                    self.stored_tied_keys(q).for_each(|key| fold(q, key));
                } else {
                    tied_keys(&tail[q - n]).for_each(|key| fold(q, key));
                }
            }
            folded = c;
            if next > 0 && next < total && cont(next - 1) && cont(next) {
                let crossing = next;
                next -= 1;
                while next > 0 && cont(next - 1) {
                    next -= 1;
                }
                pull = Some(Pull {
                    tie: Tie::ReasoningRun,
                    from: crossing,
                    to: next,
                });
            }
            if next == c {
                // The relations hold at `c`; anonymous searches may still pair across it.
                match self.anon_pull(c, tail) {
                    Some(p) => {
                        next = p.to;
                        pull = Some(p);
                    }
                    None => break,
                }
            }
            c = next;
        }
        Cut { position: c, pull }
    }

    /// The earliest regrouping the appends made since the last call (`None`: no append),
    /// forgotten by this call: where the units of the history were rebuilt from, and the
    /// relation that reached back that far.
    pub fn take_regrouped(&mut self) -> Option<Cut> {
        self.regrouped.take()
    }

    /// Make room for about `items` more items, estimating their strings, relation keys and
    /// units from the items stored so far (nothing without a sample), plus headroom for later
    /// turns. Appending a long history in chunks then never regrows a store: each regrowth
    /// briefly holds the old and the new copy, which set the peak memory of a cold start.
    pub fn reserve(&mut self, items: usize) {
        let n = self.items.len();
        if n == 0 || items == 0 {
            return;
        }
        let per_item = |x: usize| (x as f64 / n as f64 * items as f64 * 1.1) as usize + 64;
        let total = n + items;
        let headroom = |needed: usize| needed + total / 8;
        let arena = per_item(self.arena.len());
        if self.arena.capacity() - self.arena.len() < arena {
            self.arena.reserve_exact(headroom(arena));
        }
        reserve_ahead(&mut self.items, items, headroom(items));
        let keys = per_item(self.first.len());
        if self.first.capacity() - self.first.len() < keys {
            self.first.reserve(keys);
        }
        let units = per_item(self.graph.units.len());
        let g = self.graph_mut();
        reserve_ahead(&mut g.unit_of, items, headroom(items));
        reserve_ahead(&mut g.units, units, headroom(units));
    }

    /// Append history items.
    pub fn extend(&mut self, items: Vec<ItemMeta>) {
        if items.is_empty() {
            return;
        }
        let n = self.items.len();
        let cut = self.cut_explained(n, &items);
        let c = cut.position;
        if self.regrouped.is_none_or(|r| c < r.position) {
            self.regrouped = Some(cut);
        }
        let keys: usize = items.iter().map(|m| relation_keys(m).count()).sum();
        if self.first.capacity() - self.first.len() < keys {
            self.first.reserve(keys + self.first.len() / 2 + 64);
        }
        for (i, m) in items.iter().enumerate() {
            for k in relation_keys(m) {
                self.first.entry(k).or_insert(n + i);
            }
        }
        // Headroom, so that the appends of the next turns do not move the whole index.
        let headroom = items.len() + n / 4 + 64;
        reserve_ahead(&mut self.items, items.len(), headroom);
        for m in &items {
            self.store(m);
        }
        self.note_anonymous(n);
        // The units after the cut: rebuilt from the stored items before it plus the new ones.
        let region: Vec<ItemMeta> = (c..n).map(|p| self.meta(p)).collect();
        let refs: Vec<&ItemMeta> = region.iter().chain(&items).collect();
        let mut tail = build_graph_refs(&refs, refs.len());
        drop(refs);
        drop(region);
        drop(items);
        tail.shift_positions(c);
        let n_history = self.items.len();
        let g = self.graph_mut();
        reserve_ahead(&mut g.unit_of, tail.unit_of.len(), headroom);
        reserve_ahead(&mut g.units, tail.units.len(), headroom / 2);
        let k = if c < n { g.unit_of[c] } else { g.units.len() };
        g.units.truncate(k);
        g.unit_of.truncate(c);
        g.unit_of.extend(tail.unit_of.iter().map(|u| u + k));
        g.units.extend(tail.units);
        g.n_history = n_history;
    }

    /// The graph of the positions after the cut for `new_input` placed after the history.
    pub fn tail(&self, new_input: &[ItemMeta]) -> TailGraph {
        let Cut {
            position: cut,
            pull,
        } = self.cut_explained(self.items.len(), new_input);
        let region: Vec<ItemMeta> = (cut..self.items.len()).map(|p| self.meta(p)).collect();
        let mut graph = build_graph(&region, new_input);
        graph.shift_positions(cut);
        TailGraph { cut, pull, graph }
    }

    /// Where a read of the newest history may start: the first position that a pack of the
    /// indexed history followed by `tail` (items appended since, then the new input) could
    /// cost or keep under [`crate::pack::Policy::Contiguous`] with `budget`, moved back to a
    /// cut ([`Self::cut_from`]). `lower_cost(members)` returns a lower bound of a unit's cost
    /// (exact when known; every item costs at least [`crate::tokens::ITEM_OVERHEAD`]).
    ///
    /// Why a pack of `history[w..] ++ tail` alone then gives exactly the items and totals of
    /// a pack of `history ++ tail`: with `r` the cut of `tail`, the units from `r` on are the
    /// only ones the tail can change (merge, make mandatory, make valid); every unit before
    /// `r` is the index's own. The contiguous fill visits units newest member first, so it
    /// meets all units from `r` on, then the index's units before `r` in the order walked
    /// here. The walk adds the units the fill may take (valid, not input-only) until their
    /// sum passes `budget`, at unit `u*`. The fill's room is at most `budget` (the
    /// budget minus new input, tail dependency, reserve and context), and whatever it took
    /// from `r` on only lowers it, so it cannot take every unit up to `u*`: it stops at `u*`
    /// or before, having costed and kept only members of the units walked. The coherent-start
    /// rule then only drops units; the turn opener it looks for may lie before the window,
    /// but it is never mandatory there (mandatory units are from `r` on), exactly as when
    /// the window has none. `w` is a cut, so the window's units are the same with or
    /// without the items before it. A walk that never passes `budget` returns 0.
    ///
    /// The greedy policy may keep small old turns behind one that did not fit anywhere in
    /// the history: it has no such bound, and a caller reads the whole history for it.
    pub fn window_start<E>(
        &self,
        tail: &[ItemMeta],
        budget: u64,
        lower_cost: impl FnMut(&[usize]) -> Result<u64, E>,
    ) -> Result<usize, E> {
        self.window(tail, budget, lower_cost).map(|w| w.start)
    }

    /// [`Self::window_start`], with why it is not later: whether the budget reaches the
    /// oldest unit (`fits`), and the relation that moved the start back last.
    pub fn window<E>(
        &self,
        tail: &[ItemMeta],
        budget: u64,
        lower_cost: impl FnMut(&[usize]) -> Result<u64, E>,
    ) -> Result<Window, E> {
        self.window_checked(tail, budget, lower_cost, None)
    }

    /// [`Self::window`] for a masked pack, which reads more than the units it may cost or
    /// keep. Before it masks a unit of a turn, the masked fill checks that the rest of the
    /// turn can fit, by the units' masked floors from that unit back to the turn's user
    /// message (`Fill::turn_cannot_fit` in [`crate::pack`]; a floor counts each tool output
    /// at an item's overhead and the other members whole), and stops that walk once the
    /// floors pass its room. The fill stops at the unit `u*` where the walk of
    /// [`Self::window`] passed `budget`, or before it, so the turns it checks are those of
    /// `u*` and of newer units; the only one that may reach before the window is the turn of
    /// `u*`. From `u*` the window walks on back, adding `floor(members)` (a lower bound of
    /// the masked floor), until the turn's user message or until the sum passes `budget`:
    /// the fill's walk, which starts at `u*` or later and whose room is at most `budget`,
    /// has stopped by then. The units walked are in the window, so a masked pack of
    /// `history[w..] ++ tail` reads nothing before `w`.
    pub fn window_masked<E>(
        &self,
        tail: &[ItemMeta],
        budget: u64,
        lower_cost: impl FnMut(&[usize]) -> Result<u64, E>,
        mut floor: impl FnMut(&[usize]) -> Result<u64, E>,
    ) -> Result<Window, E> {
        self.window_checked(tail, budget, lower_cost, Some(&mut floor))
    }

    /// The walk of [`Self::window`] and [`Self::window_masked`] (`floor` given).
    fn window_checked<E>(
        &self,
        tail: &[ItemMeta],
        budget: u64,
        mut lower_cost: impl FnMut(&[usize]) -> Result<u64, E>,
        floor: Option<&mut UnitCost<'_, E>>,
    ) -> Result<Window, E> {
        let regroup = self.cut_explained(self.items.len(), tail);
        let graph = &self.graph;
        let mut start = regroup.position;
        let mut pull = regroup.pull;
        let mut sum = 0u64;
        let mut p = regroup.position;
        while p > 0 {
            p -= 1;
            let unit = &graph.units[graph.unit_of[p]];
            if unit.members.last() != Some(&p) || unit.is_input_only() || !unit.is_valid() {
                continue;
            }
            sum = sum.saturating_add(lower_cost(&unit.members)?);
            let first = unit.members[0];
            if first < start {
                start = first;
                if first < p {
                    pull = Some(Pull {
                        tie: Tie::Unit,
                        from: p,
                        to: first,
                    });
                }
            }
            if sum > budget {
                if let Some(floor) = floor {
                    if let Some(turn) = self.turn_reach(p, budget, floor)? {
                        if turn.to < start {
                            start = turn.to;
                            pull = Some(turn);
                        }
                    }
                }
                let cut = self.cut_explained(start, tail);
                if cut.position < start {
                    pull = cut.pull;
                }
                return Ok(Window {
                    start: cut.position,
                    fits: false,
                    pull,
                    reach: p,
                });
            }
        }
        // The budget reaches the oldest unit. When the items after the history relate to an
        // earlier one, say so unless the whole history fits anyway (the relation is then
        // not why the window is the whole history).
        if let Some(pull) = regroup.pull {
            let n = self.items.len();
            for p in regroup.position..n {
                let unit = &graph.units[graph.unit_of[p]];
                if unit.members.last() == Some(&p) && !unit.is_input_only() && unit.is_valid() {
                    sum = sum.saturating_add(lower_cost(&unit.members)?);
                }
            }
            if sum > budget {
                return Ok(Window {
                    start: 0,
                    fits: false,
                    pull: Some(pull),
                    reach: 0,
                });
            }
        }
        Ok(Window {
            start: 0,
            fits: true,
            pull: None,
            reach: 0,
        })
    }

    /// How far back a masked fill's turn check from the unit whose newest member is `p` may
    /// read ([`Self::window_masked`]): the first member of the oldest unit it may reach, as
    /// a [`Tie::Turn`] from `p` (`None`: nothing before the unit of `p`).
    fn turn_reach<E>(
        &self,
        p: usize,
        budget: u64,
        floor: &mut UnitCost<'_, E>,
    ) -> Result<Option<Pull>, E> {
        let graph = &self.graph;
        let mut first = graph.units[graph.unit_of[p]].members[0];
        let mut sum = 0u64;
        let mut q = p + 1;
        while q > 0 {
            q -= 1;
            let unit = &graph.units[graph.unit_of[q]];
            if unit.members.last() == Some(&q) && !unit.is_input_only() && unit.is_valid() {
                sum = sum.saturating_add(floor(&unit.members)?);
                first = first.min(unit.members[0]);
            }
            if sum > budget || self.is_user_message(q) {
                break;
            }
        }
        let own = graph.units[graph.unit_of[p]].members[0];
        Ok((first < own).then_some(Pull {
            tie: Tie::Turn,
            from: p,
            to: first,
        }))
    }

    /// The units of `history ++ new_input`: cached units before the cut, then `tail`'s.
    pub fn view<'a>(&'a self, tail: &'a TailGraph) -> GraphView<'a> {
        GraphView::split(&self.graph, tail.cut, &tail.graph)
    }
}

/// Why [`GraphIndex::from_snapshot`] refused a snapshot. Either way nothing was loaded and
/// the caller rebuilds the index from the items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// Not an index snapshot, or one written by another version of this crate (whose graph
    /// rules may differ).
    Foreign(String),
    /// The checksum or the contents do not hold together.
    Damaged(String),
    /// Intact, but taken for something else than the `binding` the loader expects (another
    /// session, another database, other rows).
    Unbound,
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Foreign(m) => write!(f, "not a snapshot this version can load: {m}"),
            SnapshotError::Damaged(m) => write!(f, "damaged index snapshot: {m}"),
            SnapshotError::Unbound => write!(
                f,
                "the index snapshot was taken for something else (another session, \
                 database or set of rows)"
            ),
        }
    }
}

impl std::error::Error for SnapshotError {}

const SNAPSHOT_MAGIC: &[u8; 8] = b"PPINDEX\0";
/// Layout of a snapshot; bump it whenever [`Stored`], the graph types or the graph rules
/// change (the crate version is checked too, so releases never share snapshots). Data added
/// after the payload ([`GraphIndex::to_snapshot_extended`]: the index's masked costs) needs
/// no bump: readers of the same layout that do not know it ignore it.
/// 3: id-less reasoning valid, a pending shell call in new_input (the graph rules of the SDK
/// conformance work), and the binding hash in the header.
const SNAPSHOT_FORMAT: u32 = 3;
/// Magic, format, checksum (of everything after it), binding hash.
const SNAPSHOT_HEADER: usize = SNAPSHOT_MAGIC.len() + 4 + 16 + 16;
/// Where the checksummed part starts (the binding hash, then the payload).
const CHECKED_FROM: usize = SNAPSHOT_MAGIC.len() + 4 + 16;

/// Bytes per item in a snapshot's span table: ten `(offset, len)` pairs, little endian.
const SPAN_BYTES: usize = STRING_FIELDS * 8;

/// The payload, written from borrowed parts. Bulk tables are raw bytes (one copy each way,
/// no per-element decoding): at 100k items a load takes a few ms.
#[derive(Serialize)]
struct SnapshotOut<'a, T> {
    version: &'a str,
    kinds: Vec<ItemKind>,
    #[serde(with = "serde_bytes")]
    flags: Vec<u8>,
    #[serde(with = "serde_bytes")]
    spans: Vec<u8>,
    arena: &'a str,
    overflow: &'a [String],
    /// The graph as each position's unit (units are numbered by their first member, so
    /// their members follow) plus the problems as `(unit, reason, position)`.
    unit_of: &'a [usize],
    problems: Vec<(usize, InvalidReason, usize)>,
    attached: &'a T,
}

#[derive(Deserialize)]
struct SnapshotIn<T> {
    version: String,
    kinds: Vec<ItemKind>,
    #[serde(with = "serde_bytes")]
    flags: Vec<u8>,
    #[serde(with = "serde_bytes")]
    spans: Vec<u8>,
    arena: String,
    overflow: Vec<String>,
    unit_of: Vec<usize>,
    problems: Vec<(usize, InvalidReason, usize)>,
    attached: T,
}

fn checksum(payload: &[u8]) -> [u8; 16] {
    let mut h = SipHasher13::new();
    h.write(payload);
    h.finish128().as_bytes()
}

/// What a snapshot stores of the caller's binding (see [`GraphIndex::to_snapshot`]).
fn binding_hash(binding: &[u8]) -> [u8; 16] {
    let mut h = SipHasher13::new();
    h.write(b"protoprompt index snapshot binding\0");
    h.write(binding);
    h.finish128().as_bytes()
}

impl GraphIndex {
    /// The index as bytes, with `attached` (the caller's per-position data), for
    /// [`GraphIndex::from_snapshot`]: a restarted process loads it instead of reading and
    /// classifying the whole history again. `binding` names what the snapshot describes
    /// (e.g. the database, session and rows the items came from); only a loader that
    /// expects the same bytes gets the index back.
    ///
    /// Layout: a magic tag, [`SNAPSHOT_FORMAT`], a SipHash-1-3 128-bit checksum of the rest,
    /// a 128-bit hash of `binding`, then the payload (postcard, see [`SnapshotOut`]): this
    /// crate's version, the compact items, their arena and the history's graph, then the
    /// attached data. The relation-key map is not stored (rebuilt from the items on load).
    /// The checksum finds accidents (a truncated or damaged blob), not forgeries.
    pub fn to_snapshot<T: Serialize>(&self, attached: &T, binding: &[u8]) -> Vec<u8> {
        self.to_snapshot_extended(attached, &[], binding)
    }

    /// [`GraphIndex::to_snapshot`] with `extension` after the payload (inside the checksum
    /// and the binding): data added in a later version of the same layout. A reader that
    /// knows it gets it from [`GraphIndex::from_snapshot_extended`]; one that does not
    /// ignores it ([`GraphIndex::from_snapshot`] stops after the payload), so a snapshot
    /// with an extension loads in every version that reads the layout, and one without it
    /// loads in a version that knows the extension (an empty one).
    pub fn to_snapshot_extended<T: Serialize>(
        &self,
        attached: &T,
        extension: &[u8],
        binding: &[u8],
    ) -> Vec<u8> {
        let mut spans = Vec::with_capacity(self.items.len() * SPAN_BYTES);
        for st in &self.items {
            for sp in &st.spans {
                spans.extend_from_slice(&sp.offset.to_le_bytes());
                spans.extend_from_slice(&sp.len.to_le_bytes());
            }
        }
        let problems = self
            .graph
            .units
            .iter()
            .enumerate()
            .flat_map(|(u, unit)| unit.problems.iter().map(move |p| (u, p.reason, p.position)))
            .collect();
        let out = SnapshotOut {
            version: env!("CARGO_PKG_VERSION"),
            kinds: self.items.iter().map(|st| st.kind).collect(),
            flags: self.items.iter().map(|st| st.flags).collect(),
            spans,
            arena: &self.arena,
            overflow: &self.overflow,
            unit_of: &self.graph.unit_of,
            problems,
            attached,
        };
        let size = SNAPSHOT_HEADER + self.items.len() * (SPAN_BYTES + 8) + self.arena.len();
        let mut bytes = Vec::with_capacity(size + size / 8);
        bytes.extend_from_slice(SNAPSHOT_MAGIC);
        bytes.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
        bytes.extend_from_slice(&[0; 16]);
        bytes.extend_from_slice(&binding_hash(binding));
        // Serialising vectors, strings and derived types into a Vec cannot fail (if it ever
        // did, the empty result would be refused by `from_snapshot`, never misread).
        let mut bytes = postcard::to_extend(&out, bytes).unwrap_or_default();
        if bytes.len() >= SNAPSHOT_HEADER {
            bytes.extend_from_slice(extension);
            let sum = checksum(&bytes[CHECKED_FROM..]);
            bytes[CHECKED_FROM - 16..CHECKED_FROM].copy_from_slice(&sum);
        }
        bytes
    }

    /// Load what [`GraphIndex::to_snapshot`] wrote for the same `binding`: the index and
    /// the attached data.
    ///
    /// Never panics: anything but an intact snapshot of this crate version taken for
    /// `binding` is an error ([`SnapshotError::Unbound`] for one taken for another), and
    /// the contents are checked so that every later operation stays in bounds (tables of
    /// one length, each field inside the arena, units numbered in order of their first
    /// member, problems inside their unit). The checksum guards the rest.
    pub fn from_snapshot<T: DeserializeOwned>(
        bytes: &[u8],
        binding: &[u8],
    ) -> Result<(GraphIndex, T), SnapshotError> {
        Self::from_snapshot_extended(bytes, binding).map(|(index, attached, _)| (index, attached))
    }

    /// [`GraphIndex::from_snapshot`] with the extension written after the payload (see
    /// [`GraphIndex::to_snapshot_extended`]; empty when there is none). It is checksummed
    /// and bound like the rest, not checked: its reader does that.
    pub fn from_snapshot_extended<'b, T: DeserializeOwned>(
        bytes: &'b [u8],
        binding: &[u8],
    ) -> Result<(GraphIndex, T, &'b [u8]), SnapshotError> {
        let foreign = |m: &str| Err(SnapshotError::Foreign(m.to_string()));
        let damaged = |m: String| SnapshotError::Damaged(m);
        if bytes.len() < SNAPSHOT_HEADER || &bytes[..SNAPSHOT_MAGIC.len()] != SNAPSHOT_MAGIC {
            return foreign("no index snapshot header");
        }
        let mut format = [0u8; 4];
        format.copy_from_slice(&bytes[SNAPSHOT_MAGIC.len()..SNAPSHOT_MAGIC.len() + 4]);
        let format = u32::from_le_bytes(format);
        if format != SNAPSHOT_FORMAT {
            return foreign(&format!(
                "layout {format}, this version reads layout {SNAPSHOT_FORMAT}"
            ));
        }
        if checksum(&bytes[CHECKED_FROM..]) != bytes[CHECKED_FROM - 16..CHECKED_FROM] {
            return Err(damaged("checksum mismatch".to_string()));
        }
        if binding_hash(binding) != bytes[CHECKED_FROM..SNAPSHOT_HEADER] {
            return Err(SnapshotError::Unbound);
        }
        let payload = &bytes[SNAPSHOT_HEADER..];
        let (snap, extension): (SnapshotIn<T>, &[u8]) = postcard::take_from_bytes(payload)
            .map_err(|e| damaged(format!("cannot be decoded: {e}")))?;
        if snap.version != env!("CARGO_PKG_VERSION") {
            return foreign(&format!(
                "written by protoprompt-core {}, this is {}",
                snap.version,
                env!("CARGO_PKG_VERSION")
            ));
        }
        let n = snap.kinds.len();
        if snap.flags.len() != n || snap.spans.len() != n * SPAN_BYTES || snap.unit_of.len() != n {
            return Err(damaged(format!("tables of {n} items disagree")));
        }
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let items = snap
            .spans
            .chunks_exact(SPAN_BYTES)
            .zip(snap.kinds.iter().zip(&snap.flags))
            .map(|(raw, (&kind, &flags))| {
                let mut spans = [ABSENT; STRING_FIELDS];
                for (sp, b) in spans.iter_mut().zip(raw.chunks_exact(8)) {
                    *sp = Span {
                        offset: word(&b[..4]),
                        len: word(&b[4..]),
                    };
                }
                Stored { kind, flags, spans }
            })
            .collect();
        let mut index = GraphIndex {
            items,
            arena: snap.arena,
            overflow: snap.overflow,
            common: FxHashMap::default(),
            first: FxHashMap::default(),
            graph: Arc::default(),
            graph_copies: 0,
            anon: Vec::new(),
            regrouped: None,
        };
        index.check_items().map_err(damaged)?;
        let graph = index
            .graph_from(snap.unit_of, &snap.problems)
            .map_err(damaged)?;
        index.graph = Arc::new(graph);
        let mut first = FxHashMap::default();
        first.reserve(n + n / 2);
        for pos in 0..n {
            for k in index.stored_keys(pos) {
                first.entry(k).or_insert(pos);
            }
        }
        index.first = first;
        index.note_anonymous(0);
        Ok((index, snap.attached, extension))
    }

    /// Every item's flags are known and its fields lie inside the stored text.
    fn check_items(&self) -> Result<(), String> {
        for (i, st) in self.items.iter().enumerate() {
            if st.flags & !ALL_FLAGS != 0 {
                return Err(format!("item {i}: unknown flags {:#x}", st.flags));
            }
            if let Some(f) = st
                .spans
                .iter()
                .position(|&s| s != ABSENT && self.text(s).is_none())
            {
                return Err(format!("item {i}: field {f} lies outside the stored text"));
            }
        }
        Ok(())
    }

    /// The history graph from each position's unit and the problems (see [`SnapshotOut`]).
    /// Units must be numbered in order of their first member, so that scanning the
    /// positions in order lists every unit's members sorted, and the units come out ordered
    /// like [`crate::graph::build_graph`]'s.
    fn graph_from(
        &self,
        unit_of: Vec<usize>,
        problems: &[(usize, InvalidReason, usize)],
    ) -> Result<Graph, String> {
        let mut units: Vec<Unit> = Vec::new();
        for (p, &u) in unit_of.iter().enumerate() {
            if u == units.len() {
                units.push(Unit {
                    members: Vec::new(),
                    problems: Vec::new(),
                    contains_new: false,
                    input_only: true,
                });
            } else if u > units.len() {
                return Err(format!(
                    "position {p} is in unit {u} before its predecessors"
                ));
            }
            let unit = &mut units[u];
            unit.members.push(p);
            unit.input_only &= matches!(self.items[p].kind, ItemKind::Control(_));
        }
        for &(u, reason, position) in problems {
            if unit_of.get(position) != Some(&u) {
                return Err(format!("a problem at {position} lies outside its unit {u}"));
            }
            units[u].problems.push(Problem { reason, position });
        }
        Ok(Graph {
            n_history: unit_of.len(),
            units,
            unit_of,
        })
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
            let mut idx = GraphIndex::new();
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
    fn placeholder_ids_do_not_pull_the_cut_back() {
        // A Chat Completions session: every message and call carries `__fake_id__`.
        let turn = |i: usize| {
            json!([
                {"role":"user","content":"q"},
                {"type":"function_call","id":"__fake_id__","call_id":format!("c{i}"),
                 "name":"f","arguments":"{}"},
                {"type":"function_call_output","call_id":format!("c{i}"),"output":"x"},
                {"type":"message","role":"assistant","id":"__fake_id__","status":"completed",
                 "content":[]}
            ])
        };
        let mut idx = GraphIndex::new();
        for i in 0..50 {
            idx.extend(metas(turn(i)));
        }
        assert_eq!(idx.cut(&metas(turn(50))), 200);
        // A call's output in the next turn only reaches back to its call.
        let out = json!([{"type":"function_call_output","call_id":"c49","output":"y"}]);
        assert_eq!(idx.cut(&metas(out)), 197);
    }

    #[test]
    fn snapshots_with_fields_outside_the_text_or_unknown_flags_are_refused() {
        let h = metas(json!([
            {"type":"function_call","id":"fc_1","call_id":"c1","name":"f","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"x"}
        ]));
        let mut idx = GraphIndex::new();
        idx.extend(h);
        let load =
            |idx: &GraphIndex| GraphIndex::from_snapshot::<()>(&idx.to_snapshot(&(), b""), b"");
        assert!(load(&idx).is_ok());
        let mut bad = idx.clone();
        bad.items[1].spans[3].len += 1_000; // the call_id runs past the arena
        let err = load(&bad).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("item 1: field 3"), "{err}");
        let mut bad = idx.clone();
        bad.items[0].flags |= 0x80;
        let err = load(&bad).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("item 0: unknown flags"), "{err}");
    }

    #[test]
    fn a_new_user_message_cuts_at_the_end() {
        let h = metas(json!([
            {"role":"user","content":"a"},
            {"type":"message","role":"assistant","id":"m1","status":"completed","content":[]}
        ]));
        let mut idx = GraphIndex::new();
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
