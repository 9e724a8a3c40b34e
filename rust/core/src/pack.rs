//! Budget reservation and newest-first fill over the atomic units of [`crate::graph`].
//!
//! # Design note
//!
//! * **What is mandatory.** `new_input` is reserved whole, then the history members of every
//!   unit that contains a `new_input` item (the *tail dependency*: e.g. the pending call and its
//!   reasoning that a leading tool output completes — nothing more of the last turn), then
//!   `output_reserve`, then the fixed context cost (system prompt and recalled memory). If the
//!   running total passes the budget, [`PackError::BudgetExceeded`] names the section that
//!   overflowed; nothing is returned, so an oversized request is never built.
//! * **What is counted.** Costs come from a [`CostSource`], asked per unit and only when the
//!   decision depends on them. The contiguous policy stops counting at the first unit that
//!   does not fit: every older unit is dropped without being tokenised. The greedy policy asks
//!   for a cheap, provably safe lower bound first ([`CostSource::lower_bound`]) and tokenises a
//!   unit only when that bound still fits, so a full budget rejects old items for free. Both
//!   give exactly the result of counting everything (tested).
//! * **What is cached.** Item costs are counted on the item's canonical text through the
//!   process-wide, content-addressed [`crate::tokens::COUNT_CACHE`] (keyed by encoding, length
//!   and two 64-bit hashes of the text; two bounded generations), so the next turn — the same
//!   history plus a few new items, handed over as fresh copies by the SDK — re-tokenises
//!   nothing it has seen. Two encodings never share an entry. Within one call each position is
//!   costed at most once (the cost engine, [`crate::costs::CostEngine`], memoises by
//!   position); an index keeps each history position's cost between calls
//!   ([`crate::costs::CostMemo`]), and the classified items and their graph
//!   ([`crate::incremental::GraphIndex`], see that module's note).
//!   Across processes, a caller may add a persistent store keyed by
//!   [`crate::tokens::store_key`] (SipHash-1-3-128 of the encoding and the text under a
//!   per-store secret; texts of at least [`crate::tokens::STORE_MIN_BYTES`]): the binding
//!   looks the process cache's misses up there before tokenising, so a restarted process
//!   reads the kept history's counts back instead of counting them again.
//! * **What is bounded.** The process cache: two generations of
//!   [`crate::tokens::CACHE_GENERATION_ENTRIES`] entries. A persistent store bounds itself
//!   (the Python `SQLiteCountStore`: `max_entries`, oldest written first out).
//! * **What is linear.** [`pack_view`] is not linear in the history: candidates are found
//!   newest first by a backwards scan over positions (a unit is met at its newest member),
//!   the contiguous policy stops at the first unit that does not fit, and the result records
//!   only the units the fill touched ([`PackResult::touched`]); every other unit's decision
//!   follows from the unit ([`PackResult::decision_of`]). The greedy policy scans every unit
//!   (cheaply: lower bounds first). Classifying items and building a whole graph ([`pack`], [`pack_values`]) are
//!   O(n); through a `GraphIndex` only the items after its cut are classified or regrouped.
//! * **What is coherent.** Units are visited newest first (by their newest member). A user
//!   message opens a turn; the kept history never contains a user message whose later turn
//!   items were dropped while older items are kept, and the optional history starts at a user
//!   message: when the fill stops inside a turn whose opening user message is not mandatory,
//!   the units of that turn it had taken are dropped too (`TurnIncomplete`). Contiguous: kept
//!   units form an unbroken suffix of the valid units (invalid and input-only units are
//!   skipped, they never break the suffix), cut at a turn boundary. Greedy: when a unit does
//!   not fit, its whole turn is dropped and older turns are then taken whole or not at all.
//! * **What is pinned.** Besides `new_input`, a caller may pin history positions
//!   ([`pack_view`]'s `pinned`): their units are mandatory too. A turn whose opening user
//!   message is pinned may be kept in part (its newest units), as a model call inside a
//!   tool loop keeps the run's input and newest step and fills the steps between.
//! * **What is masked.** With [`Masking`] ([`pack_view_masked`]), the newest units are still
//!   taken whole while they fit. From the first unit that does not fit whole (or the first
//!   unit older than `after_turns` turns of the history), every older unit is considered
//!   masked: its tool outputs cut to short excerpts in the model-facing copy
//!   ([`crate::mask`]); it is kept masked if that fits, and the fill misses as above if it
//!   does not (coherent start and both policies unchanged: the greedy policy takes older
//!   turns masked, whole or not at all). The units of the turn that did not fit whole that
//!   were already taken whole are masked too (`Fill::mask_taken_turn`), unless the turn's
//!   opening user message is mandatory: a turn is kept masked rather than dropped for want
//!   of room for its own user message. A turn whose opening user message is mandatory (an
//!   *anchored* turn: a model call inside a run, the run's input pinned) is masked before
//!   any of its units is dropped (`Fill::make_room_in_anchored_turn`): it keeps the most of
//!   its units, newest first, that fit masked, and of those the newest stay whole as far as
//!   the room allows, so a long tool loop keeps every call while its steps fit masked.
//!   Before masking any unit of a turn the fill checks by
//!   the units' masked floors that the rest of the turn can fit (`Fill::turn_cannot_fit`):
//!   if not, the turn is dropped as the rule drops it, without an excerpt made (the result
//!   is the same; only the work differs). A mandatory unit is never masked. A unit kept masked
//!   is reported `masked` with its whole and its masked tokens; its items are in
//!   `kept_history`, and [`crate::mask::MaskedCosts::copies`] gives their copies.
//! * **What is reported.** Totals per section, and one [`UnitDecision`] per history unit with
//!   its reason and, when it was counted, its tokens ([`PackResult::decisions`], derived on
//!   demand from the touched units and the graph).

use std::fmt;

use rustc_hash::FxHashMap;

pub use crate::costs::{CostFailure, CostSource};
use crate::graph::{Graph, GraphView, Unit};
use crate::items::ItemMeta;
pub use crate::mask::Masking;

/// How history is chosen once the mandatory part is reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Newest units first; stop at the first unit that does not fit.
    #[default]
    Contiguous,
    /// Newest units first; when a unit does not fit, drop the rest of its turn and continue
    /// with older whole turns that fit.
    Greedy,
}

impl Policy {
    pub fn from_name(name: &str) -> Option<Policy> {
        match name {
            "contiguous" => Some(Policy::Contiguous),
            "greedy" => Some(Policy::Greedy),
            _ => None,
        }
    }

    /// The policy named `name`; the error says which names there are.
    pub fn parse(name: &str) -> Result<Policy, String> {
        Policy::from_name(name)
            .ok_or_else(|| format!("policy must be \"contiguous\" or \"greedy\", got {name:?}"))
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Contiguous => "contiguous",
            Policy::Greedy => "greedy",
        }
    }
}

/// Budget and reservations of one packing call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackOptions {
    /// The model's context window (tokens) for this request.
    pub budget: u64,
    /// Tokens kept free for the model's answer.
    pub output_reserve: u64,
    /// Fixed cost of context placed before the history (system prompt, recalled memory).
    pub context_tokens: u64,
    pub policy: Policy,
}

/// The mandatory section that did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    NewInput,
    Dependency,
    OutputReserve,
    Context,
}

impl Section {
    pub fn name(self) -> &'static str {
        match self {
            Section::NewInput => "new_input",
            Section::Dependency => "dependency",
            Section::OutputReserve => "output_reserve",
            Section::Context => "context",
        }
    }
}

/// What happened to one history unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Part of the tail dependency of `new_input`: always kept.
    Mandatory,
    /// Optional history that fit.
    Kept,
    /// Optional history that fit with its tool outputs masked (cut to excerpts in the
    /// model-facing copy).
    Masked,
    /// Did not fit in what was left of the budget.
    OverBudget,
    /// Another unit of the same turn did not fit, and the turn's opening user message is not
    /// kept: sending the rest would start the history in the middle of a turn (both
    /// policies), or keep a user message without its later turn items (greedy).
    TurnIncomplete,
    /// Violates an item rule (see `problems`); never sent.
    InvalidUnit,
    /// Input-only control (`compaction_trigger`, `item_reference`) found in history.
    InputOnly,
}

impl Decision {
    pub fn code(self) -> &'static str {
        match self {
            Decision::Mandatory => "mandatory",
            Decision::Kept => "kept",
            Decision::Masked => "masked",
            Decision::OverBudget => "over_budget",
            Decision::TurnIncomplete => "turn_incomplete",
            Decision::InvalidUnit => "invalid_unit",
            Decision::InputOnly => "input_only",
        }
    }

    pub fn is_kept(self) -> bool {
        matches!(
            self,
            Decision::Mandatory | Decision::Kept | Decision::Masked
        )
    }
}

/// The decision for one unit that has history members. Its history positions and rule
/// violations are those of the unit in the graph the pack ran on (for a unit without
/// new_input items: all its members).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitDecision {
    /// Index of the unit in the graph (or [`GraphView`]) the pack ran on.
    pub unit: usize,
    pub decision: Decision,
    /// Tokens of the unit's history members, when they were counted.
    pub tokens: Option<u64>,
    /// Tokens of the unit with its tool outputs masked, when that was counted (for a
    /// `Masked` unit: what was sent).
    pub masked_tokens: Option<u64>,
}

/// Why the fill stopped at a unit ([`FillStop::cause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// The unit whole needed more than was left (no masking, or its turn was young enough
    /// to be taken whole only).
    Whole,
    /// The unit with its tool outputs masked still needed more than was left.
    Masked,
    /// The rest of the unit's turn could not fit even masked (by the units' masked floors),
    /// so the turn was dropped without masking any of it.
    TurnMasked,
}

impl StopCause {
    pub fn code(self) -> &'static str {
        match self {
            StopCause::Whole => "whole",
            StopCause::Masked => "masked",
            StopCause::TurnMasked => "turn_masked",
        }
    }
}

/// The unit at which the newest-first fill first missed: what stopped the contiguous fill
/// (every older unit is dropped uncounted) and made the greedy fill drop the rest of its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillStop {
    /// Index of the unit in the graph (or [`GraphView`]) the pack ran on.
    pub unit: usize,
    /// Tokens the fill had left for it when it was tried: after the newer units it had taken
    /// (those of its own turn included, which the coherent start may then drop as
    /// `TurnIncomplete`, giving their tokens back to [`PackResult::remaining`]).
    pub left: u64,
    pub cause: StopCause,
}

/// Result of [`pack`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PackResult {
    /// Kept history positions, in original order (mandatory ones included).
    pub kept_history: Vec<usize>,
    /// History positions of the tail dependency.
    pub dependency: Vec<usize>,
    pub new_input_tokens: u64,
    pub dependency_tokens: u64,
    /// Optional history that was kept.
    pub history_tokens: u64,
    pub context_tokens: u64,
    pub output_reserve: u64,
    pub budget: u64,
    /// The decisions the fill made or the counts it took, by unit index: mandatory, kept and
    /// turn-incomplete units, and every counted unit. Any other unit's decision follows from
    /// the unit itself (see [`PackResult::decision_of`]), so the result stays small however
    /// long the history is.
    pub touched: FxHashMap<usize, UnitDecision>,
    /// Units kept masked (sorted): their members are in `kept_history`, sent as masked
    /// copies where a copy costs less ([`crate::mask::MaskedCosts::copies`]).
    pub masked_units: Vec<usize>,
    /// Tokens the masked units would have cost more whole (included in nothing else).
    pub masking_saved: u64,
    /// The unit the fill first missed at, with the tokens it had left then (`None`: every
    /// candidate fit).
    pub stop: Option<FillStop>,
}

impl PackResult {
    /// Tokens of the request plus the output reserve.
    pub fn used(&self) -> u64 {
        [
            self.dependency_tokens,
            self.history_tokens,
            self.context_tokens,
            self.output_reserve,
        ]
        .iter()
        .fold(self.new_input_tokens, |a, &b| a.saturating_add(b))
    }

    /// Budget left unused.
    pub fn remaining(&self) -> u64 {
        self.budget.saturating_sub(self.used())
    }

    /// The decision for unit `u` of the graph the pack ran on; `None` for a unit without
    /// history members.
    pub fn decision_of(&self, graph: GraphView<'_>, u: usize) -> Option<UnitDecision> {
        let unit = graph.unit(u);
        if unit.members.first().is_none_or(|&p| p >= graph.n_history()) {
            return None;
        }
        if let Some(d) = self.touched.get(&u) {
            return Some(*d);
        }
        Some(UnitDecision {
            unit: u,
            decision: untouched_decision(unit),
            tokens: None,
            masked_tokens: None,
        })
    }

    /// One decision per unit with history members, in unit order (oldest first).
    pub fn decisions(&self, graph: GraphView<'_>) -> Vec<UnitDecision> {
        (0..graph.unit_count())
            .filter_map(|u| self.decision_of(graph, u))
            .collect()
    }
}

/// The decision for a unit the fill did not touch: mandatory, input-only, invalid, or (a valid
/// candidate never reached) over budget.
pub fn untouched_decision(unit: &Unit) -> Decision {
    if unit.contains_new {
        Decision::Mandatory
    } else if unit.is_input_only() {
        Decision::InputOnly
    } else if !unit.is_valid() {
        Decision::InvalidUnit
    } else {
        Decision::OverBudget
    }
}

/// Why packing failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackError {
    /// The mandatory part alone does not fit.
    BudgetExceeded {
        used: u64,
        budget: u64,
        section: Section,
    },
    /// A unit containing `new_input` items is invalid (e.g. an output whose call is missing).
    InvalidNewInput {
        position: usize,
        label: String,
        reasons: Vec<&'static str>,
        /// Every violation of the unit: the item's label (`new_input[0]`, or `history[3]`
        /// for a history item the new input depends on) and the reason.
        problems: Vec<(String, &'static str)>,
    },
    /// The context hook failed (its message is kept; bindings keep the original error).
    Context(String),
    /// An item could not be read or costed.
    Item {
        position: usize,
        label: String,
        field: String,
        message: String,
    },
}

impl fmt::Display for PackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackError::BudgetExceeded {
                used,
                budget,
                section,
            } => write!(
                f,
                "mandatory input needs {used} tokens, over the budget of {budget} \
                 (overflowed at section {})",
                section.name()
            ),
            PackError::InvalidNewInput {
                label, problems, ..
            } => {
                write!(f, "{label} cannot be sent: ")?;
                for (i, (at, reason)) in problems.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "; " };
                    if at.starts_with("history[") {
                        write!(f, "{sep}{at} (history it depends on): {reason}")?;
                    } else {
                        write!(f, "{sep}{at}: {reason}")?;
                    }
                }
                Ok(())
            }
            PackError::Item {
                label,
                field,
                message,
                ..
            } => write!(f, "{label}: field {field}: {message}"),
            PackError::Context(m) => write!(f, "context builder failed: {m}"),
        }
    }
}

impl std::error::Error for PackError {}

struct Packer<'a> {
    graph: GraphView<'a>,
    costs: &'a mut dyn CostSource,
}

impl Packer<'_> {
    fn item_error(&self, f: CostFailure) -> PackError {
        PackError::Item {
            label: self.graph.position_label(f.position),
            position: f.position,
            field: f.field,
            message: f.message,
        }
    }

    fn sum(&mut self, positions: &[usize]) -> Result<u64, PackError> {
        if positions.is_empty() {
            return Ok(0);
        }
        let costs = self
            .costs
            .costs(positions)
            .map_err(|f| self.item_error(f))?;
        // Costs come from outside (a store, a snapshot): never let a sum wrap around.
        Ok(costs.iter().fold(0u64, |a, &c| a.saturating_add(c)))
    }

    fn lower_bound(&mut self, positions: &[usize]) -> u64 {
        positions
            .iter()
            .fold(0u64, |a, &p| a.saturating_add(self.costs.lower_bound(p)))
    }

    fn masked_sum(&mut self, members: &[usize]) -> Result<u64, PackError> {
        let costs = self
            .costs
            .masked_costs(members)
            .map_err(|f| self.item_error(f))?;
        Ok(costs.iter().fold(0u64, |a, &c| a.saturating_add(c)))
    }

    fn masked_lower_bound(&mut self, positions: &[usize]) -> u64 {
        positions.iter().fold(0u64, |a, &p| {
            a.saturating_add(self.costs.masked_lower_bound(p))
        })
    }
}

/// Called once the mandatory part is reserved, with the tokens still free; returns the tokens
/// the context (system prompt, recalled memory) takes. It runs before any history is chosen.
pub type ContextHook<'a> = &'a mut dyn FnMut(u64) -> Result<u64, PackError>;

/// The tokens an embedding's context callable says the context takes, from what it returned:
/// a non-negative integer (`returned`: the value as an integer, if it is one that fits 64
/// bits; `shown()`: the value as its source writes it, for the message refusing it).
pub fn context_tokens(
    returned: Option<i64>,
    shown: impl FnOnce() -> String,
) -> Result<u64, String> {
    returned.and_then(|n| u64::try_from(n).ok()).ok_or_else(|| {
        format!(
            "the context callable must return a non-negative int (tokens used), got {}",
            shown()
        )
    })
}

/// Pack the history of `graph` into `opts.budget`.
///
/// `metas` are the classified items, history then new_input (the same sequence the graph was
/// built from). `context`, when given, is asked for its size after the mandatory reservation
/// (see [`ContextHook`]); its tokens are added to `context_tokens`.
pub fn pack(
    graph: &Graph,
    metas: &[ItemMeta],
    costs: &mut dyn CostSource,
    opts: &PackOptions,
    context: Option<ContextHook<'_>>,
) -> Result<PackResult, PackError> {
    let is_user = |p: usize| metas[p].is_user_message();
    pack_view(GraphView::whole(graph), &is_user, costs, opts, &[], context)
}

/// Per-unit state of the fill.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FillState {
    Kept,
    /// Kept with its tool outputs masked (cheaper than whole).
    Masked,
    TurnIncomplete,
}

/// [`pack`] over a [`GraphView`]; `is_user(p)` tells whether history position `p` is a user
/// message (a turn boundary).
///
/// Work is proportional to the units visited: the candidates are found newest first by a
/// backwards scan over positions (a unit is met at its newest member), so the contiguous
/// policy never looks past the first unit that does not fit. Only the final per-unit
/// decision list is linear in the number of units, with no allocation per unit.
///
/// `pinned` lists history positions that are mandatory like `new_input`: their units are
/// reserved whole (with the tail dependency) and never dropped. A per-call model filter pins
/// the context message and the run's own input this way, while the items between them and
/// the newest step stay optional. Positions at or past `n_history` are ignored.
///
/// The steps: the mandatory units and their validation (`check_mandatory_units`), the
/// reservation (`Fill::reserve`), the newest-first fill with its coherent start
/// (`Fill::fill_newest`), for the greedy policy the fill of older whole turns
/// (`Fill::fill_older_turns`), and the result (`Fill::finish`).
pub fn pack_view(
    graph: GraphView<'_>,
    is_user: &dyn Fn(usize) -> bool,
    costs: &mut dyn CostSource,
    opts: &PackOptions,
    pinned: &[usize],
    context: Option<ContextHook<'_>>,
) -> Result<PackResult, PackError> {
    pack_view_masked(graph, is_user, costs, opts, None, pinned, context)
}

/// [`pack_view`] with `masking`: units older than those kept whole are considered with their
/// tool outputs masked (see the module note); `costs` supplies the masked costs
/// ([`crate::mask::MaskedCosts`]). The mandatory units — new input, the tail dependency and
/// every unit holding a `pinned` position (a per-call model filter pins its newest step and
/// run input this way) — are never masked. `None` packs exactly as [`pack_view`].
pub fn pack_view_masked(
    graph: GraphView<'_>,
    is_user: &dyn Fn(usize) -> bool,
    costs: &mut dyn CostSource,
    opts: &PackOptions,
    masking: Option<Masking>,
    pinned: &[usize],
    context: Option<ContextHook<'_>>,
) -> Result<PackResult, PackError> {
    let mandatory = mandatory_units(graph, pinned);
    check_mandatory_units(graph, &mandatory, pinned)?;
    let mut fill = Fill {
        packer: Packer { graph, costs },
        is_user,
        mandatory,
        masking,
        masked_phase: false,
        checked_turn: None,
        unit_tokens: FxHashMap::default(),
        masked_tokens: FxHashMap::default(),
        state: FxHashMap::default(),
        remaining: 0,
        history_tokens: 0,
        scan: graph.n_history(),
        users_after: 0,
        stop: None,
        refused: StopCause::Whole,
    };
    let reserved = fill.reserve(opts, context)?;
    if let Some(miss_turn) = fill.fill_newest()? {
        // Contiguous: everything older than the first miss stays over budget, uncounted.
        if opts.policy == Policy::Greedy {
            fill.fill_older_turns(miss_turn)?;
        }
    }
    Ok(fill.finish(reserved, opts))
}

/// Units holding new_input items or pinned history positions, sorted and distinct.
fn mandatory_units(graph: GraphView<'_>, pinned: &[usize]) -> Vec<usize> {
    let n_history = graph.n_history();
    let mut units: Vec<usize> = (n_history..graph.len())
        .chain(pinned.iter().copied().filter(|&p| p < n_history))
        .map(|p| graph.unit_of(p))
        .collect();
    units.sort_unstable();
    units.dedup();
    units
}

/// new_input (and what is pinned) must be sendable as given: the first invalid mandatory
/// unit is reported with every violation of its members.
fn check_mandatory_units(
    graph: GraphView<'_>,
    mandatory: &[usize],
    pinned: &[usize],
) -> Result<(), PackError> {
    let n_history = graph.n_history();
    let Some(&u) = mandatory.iter().find(|&&u| !graph.unit(u).is_valid()) else {
        return Ok(());
    };
    let unit = graph.unit(u);
    let position = unit
        .members
        .iter()
        .copied()
        .find(|&p| p >= n_history)
        .or_else(|| unit.members.iter().copied().find(|p| pinned.contains(p)))
        .unwrap_or(n_history);
    let mut reasons: Vec<&'static str> = Vec::new();
    let mut problems = Vec::new();
    for p in &unit.problems {
        let m = p.reason.message();
        if !reasons.contains(&m) {
            reasons.push(m);
        }
        problems.push((graph.position_label(p.position), m));
    }
    Err(PackError::InvalidNewInput {
        label: graph.position_label(position),
        position,
        reasons,
        problems,
    })
}

/// Whether new_input can be sent as given: [`PackError::InvalidNewInput`] names the first
/// invalid unit that holds new input (the check every pack makes first).
pub fn check_new_input(graph: GraphView<'_>) -> Result<(), PackError> {
    check_mandatory_units(graph, &mandatory_units(graph, &[]), &[])
}

/// What the mandatory reservation took.
struct Reservation {
    new_input_tokens: u64,
    dependency_tokens: u64,
    /// History positions of the tail dependency (sorted).
    dependency: Vec<usize>,
    /// The fixed context plus what the context hook took.
    context_tokens: u64,
}

/// The state of one [`pack_view`] call.
struct Fill<'a> {
    packer: Packer<'a>,
    is_user: &'a dyn Fn(usize) -> bool,
    /// Mandatory units (sorted).
    mandatory: Vec<usize>,
    masking: Option<Masking>,
    /// Whether the fill has passed the units kept whole (every later unit is considered
    /// masked).
    masked_phase: bool,
    /// The turn whose rest was last checked to fit masked ([`Fill::turn_cannot_fit`]).
    checked_turn: Option<usize>,
    /// Tokens of every unit counted so far.
    unit_tokens: FxHashMap<usize, u64>,
    /// Masked tokens of every unit counted masked so far.
    masked_tokens: FxHashMap<usize, u64>,
    /// Units the fill kept or dropped as turn-incomplete.
    state: FxHashMap<usize, FillState>,
    /// Budget still free.
    remaining: u64,
    /// Tokens of the optional history kept.
    history_tokens: u64,
    /// The backwards scan: positions `scan..` have been visited.
    scan: usize,
    /// User messages at or after `scan` (the turn label of the positions visited next).
    users_after: usize,
    /// Where the fill first missed, and why.
    stop: Option<FillStop>,
    /// Why the last [`Fill::try_take`] that returned `None` refused its unit.
    refused: StopCause,
}

impl Fill<'_> {
    fn is_mandatory(&self, u: usize) -> bool {
        self.mandatory.binary_search(&u).is_ok()
    }

    /// Reserve new_input, the tail dependency, the output reserve and the context, in that
    /// order; the first section past the budget fails the call.
    fn reserve(
        &mut self,
        opts: &PackOptions,
        context: Option<ContextHook<'_>>,
    ) -> Result<Reservation, PackError> {
        let graph = self.packer.graph;
        let n_history = graph.n_history();
        let new_positions: Vec<usize> = (n_history..graph.len()).collect();
        let new_input_tokens = self.packer.sum(&new_positions)?;
        let mut dependency_tokens = 0u64;
        let mut dependency: Vec<usize> = Vec::new();
        for &u in &self.mandatory {
            let positions: Vec<usize> = graph
                .unit(u)
                .members
                .iter()
                .copied()
                .filter(|&p| p < n_history)
                .collect();
            if positions.is_empty() {
                continue;
            }
            let cost = self.packer.sum(&positions)?;
            self.unit_tokens.insert(u, cost);
            dependency_tokens = dependency_tokens.saturating_add(cost);
            dependency.extend(positions);
        }
        dependency.sort_unstable();
        let mut used = 0u64;
        for (section, tokens) in [
            (Section::NewInput, new_input_tokens),
            (Section::Dependency, dependency_tokens),
            (Section::OutputReserve, opts.output_reserve),
            (Section::Context, opts.context_tokens),
        ] {
            used = used.saturating_add(tokens);
            if used > opts.budget {
                let total = new_input_tokens
                    .saturating_add(dependency_tokens)
                    .saturating_add(opts.output_reserve)
                    .saturating_add(opts.context_tokens);
                return Err(PackError::BudgetExceeded {
                    used: total,
                    budget: opts.budget,
                    section,
                });
            }
        }
        self.remaining = opts.budget - used;
        let mut context_tokens = opts.context_tokens;
        if let Some(hook) = context {
            let extra = hook(self.remaining)?;
            if extra > self.remaining {
                return Err(PackError::BudgetExceeded {
                    used: used.saturating_add(extra),
                    budget: opts.budget,
                    section: Section::Context,
                });
            }
            self.remaining -= extra;
            context_tokens += extra;
        }
        Ok(Reservation {
            new_input_tokens,
            dependency_tokens,
            dependency,
            context_tokens,
        })
    }

    /// The next candidate unit, newest first by its newest member, with its turn label (the
    /// number of user messages after it: equal labels = same turn). A candidate is valid,
    /// not input-only and not mandatory.
    fn next_candidate(&mut self) -> Option<(usize, usize)> {
        let graph = self.packer.graph;
        while self.scan > 0 {
            self.scan -= 1;
            let pos = self.scan;
            let label = self.users_after;
            if (self.is_user)(pos) {
                self.users_after += 1;
            }
            let u = graph.unit_of(pos);
            let unit = graph.unit(u);
            if unit.members.last() == Some(&pos)
                && !self.is_mandatory(u)
                && !unit.is_input_only()
                && unit.is_valid()
            {
                return Some((u, label));
            }
        }
        None
    }

    /// Whether a candidate of turn `label` may still be taken whole.
    fn whole_allowed(&self, label: usize) -> bool {
        !self.masked_phase
            && self
                .masking
                .and_then(|m| m.after_turns)
                .is_none_or(|n| (label as u64) < n)
    }

    /// Count unit `u` masked (its whole cost too, for the report); returns the masked cost
    /// and the state it would be kept in (`Masked` only when cheaper than whole).
    fn count_masked(&mut self, u: usize) -> Result<(u64, FillState), PackError> {
        let members = &self.packer.graph.unit(u).members;
        let masked = self.packer.masked_sum(members)?;
        let whole = self.packer.sum(members)?;
        self.unit_tokens.insert(u, whole);
        self.masked_tokens.insert(u, masked);
        let state = if masked < whole {
            FillState::Masked
        } else {
            FillState::Kept
        };
        Ok((masked, state))
    }

    /// A unit's least possible masked cost: the whole cost of every member that is not a
    /// tool output (counted), an item's overhead for each that is (not counted: a tool
    /// output is what makes a unit big). It depends on the items only (not on what an index
    /// has counted before), so reports are the same with and without an index.
    fn masked_floor(&mut self, members: &[usize]) -> Result<u64, PackError> {
        let (outputs, others): (Vec<usize>, Vec<usize>) = members
            .iter()
            .partition(|&&p| self.packer.costs.maskable(p));
        let counted = self.packer.sum(&others)?;
        let overheads = (outputs.len() as u64).saturating_mul(crate::tokens::ITEM_OVERHEAD);
        Ok(counted.saturating_add(overheads))
    }

    /// The cost and state unit `u` (of turn `label`) is taken with, or `None` when it does not
    /// fit: whole while units fit whole (and are young enough), else masked (see the module
    /// note). `taken`: the units taken so far, newest first, with turn label and cost. A unit
    /// whose masked cost cannot fit by its lower bound is not masked (nor counted masked).
    fn try_take(
        &mut self,
        u: usize,
        label: usize,
        taken: &mut [(usize, usize, u64)],
    ) -> Result<Option<(u64, FillState)>, PackError> {
        let members = &self.packer.graph.unit(u).members;
        self.refused = StopCause::TurnMasked;
        if self.whole_allowed(label) {
            let whole = self.packer.sum(members)?;
            self.unit_tokens.insert(u, whole);
            if whole <= self.remaining {
                return Ok(Some((whole, FillState::Kept)));
            }
            if self.masking.is_none() {
                self.refused = StopCause::Whole;
                return Ok(None);
            }
            self.masked_phase = true;
            if self.opener_mandatory() {
                self.make_room_in_anchored_turn(members, label, taken)?;
            } else {
                // Masking the turn's units taken whole frees at most their outputs' tokens:
                // if even that cannot make room for the rest of the turn, the turn is dropped
                // (the coherent start would drop it) without masking anything.
                let room = self.remaining.saturating_add(self.freeable(label, taken)?);
                if self.turn_cannot_fit(label, room)? {
                    return Ok(None);
                }
                self.mask_taken_turn(label, taken)?;
            }
        } else if self.checked_turn != Some(label) && self.turn_cannot_fit(label, self.remaining)? {
            return Ok(None);
        }
        self.masked_phase = true;
        self.refused = StopCause::Masked;
        if self.masked_floor(members)? > self.remaining {
            return Ok(None);
        }
        let (cost, state) = self.count_masked(u)?;
        Ok((cost <= self.remaining).then_some((cost, state)))
    }

    /// Whether the user message opening the turn of the scan position is mandatory (the
    /// turn is *anchored*: a model call inside a run, whose input is pinned).
    fn opener_mandatory(&self) -> bool {
        let opener = (0..=self.scan).rev().find(|&q| (self.is_user)(q));
        opener.is_some_and(|q| self.is_mandatory(self.packer.graph.unit_of(q)))
    }

    /// The candidates of the scan position's turn from the scan position down to its
    /// opening user message, newest first (what the fill visits next in this turn).
    fn rest_of_turn(&self) -> Vec<usize> {
        let graph = self.packer.graph;
        let opener = (0..=self.scan).rev().find(|&q| (self.is_user)(q));
        (opener.unwrap_or(0)..=self.scan)
            .rev()
            .filter_map(|p| {
                let u = graph.unit_of(p);
                let unit = graph.unit(u);
                (unit.members.last() == Some(&p)
                    && !self.is_mandatory(u)
                    && !unit.is_input_only()
                    && unit.is_valid())
                .then_some(u)
            })
            .collect()
    }

    /// An anchored turn is masked before any of its units is dropped. Called at its first
    /// unit that does not fit whole (`members`, at the scan position), with its newer units
    /// taken whole (the last entries of `taken` with turn `label`): `t` = the most units of
    /// the turn, newest first, that fit with every one masked; then the newest `k` of the
    /// taken units stay whole, `k` the most for which they and the next `t - k` units masked
    /// fit. The taken units after the `k`th are masked here; the fill then takes the rest
    /// masked and misses after the `t`th. Nothing changes when masking the taken units
    /// cannot make room for this unit (`t` is then the units taken). Work: masked floors
    /// first; units are masked only while they may fit.
    fn make_room_in_anchored_turn(
        &mut self,
        members: &[usize],
        label: usize,
        taken: &mut [(usize, usize, u64)],
    ) -> Result<(), PackError> {
        let graph = self.packer.graph;
        let n = taken.iter().rev().take_while(|e| e.1 == label).count();
        if n == 0 {
            return Ok(());
        }
        let first = taken.len() - n;
        let whole_taken = taken[first..]
            .iter()
            .fold(0u64, |a, e| a.saturating_add(e.2));
        let room = self.remaining.saturating_add(whole_taken);
        let mut floor = self.masked_floor(members)?;
        for e in &taken[first..] {
            floor = floor.saturating_add(self.masked_floor(&graph.unit(e.0).members)?);
        }
        if floor > room {
            return Ok(());
        }
        let mut masked_taken = Vec::with_capacity(n);
        for e in &taken[first..] {
            masked_taken.push(self.count_masked(e.0)?);
        }
        let all_taken = masked_taken.iter().fold(0u64, |a, m| a.saturating_add(m.0));
        // The rest of the turn, masked, newest first while it fits with the taken masked.
        let mut rest = 0u64;
        for u in self.rest_of_turn() {
            let members = &graph.unit(u).members;
            let sum = all_taken.saturating_add(rest);
            if sum.saturating_add(self.masked_floor(members)?) > room {
                break;
            }
            let (m, _) = self.count_masked(u)?;
            if sum.saturating_add(m) > room {
                break;
            }
            rest = rest.saturating_add(m);
        }
        // The newest taken units stay whole while they and that rest (masked) fit.
        let mut total = whole_taken.saturating_add(rest);
        let mut k = n;
        while total > room && k > 0 {
            k -= 1;
            total -= taken[first + k].2 - masked_taken[k].0;
        }
        for (entry, &(cost, state)) in taken[first + k..].iter_mut().zip(&masked_taken[k..]) {
            let freed = entry.2 - cost; // a masked cost never exceeds the whole one
            self.remaining += freed;
            self.history_tokens -= freed;
            entry.2 = cost;
            self.state.insert(entry.0, state);
        }
        Ok(())
    }

    /// Whether the rest of turn `label` (the candidate at the scan position and the older
    /// ones of its turn, down to its opening user message) cannot fit masked in `room`, by
    /// their masked floors ([`Fill::masked_floor`]): the fill would then miss inside the
    /// turn and the coherent start drop what it took of it, so masking any of it is waste.
    /// `false` when the turn's opening user message is mandatory (it may be sent in part).
    /// Checked once per turn.
    fn turn_cannot_fit(&mut self, label: usize, room: u64) -> Result<bool, PackError> {
        self.checked_turn = Some(label);
        let graph = self.packer.graph;
        let opener = (0..=self.scan).rev().find(|&q| (self.is_user)(q));
        if opener.is_some_and(|q| self.is_mandatory(graph.unit_of(q))) {
            return Ok(false);
        }
        let mut floor = 0u64;
        for p in (opener.unwrap_or(0)..=self.scan).rev() {
            let u = graph.unit_of(p);
            let unit = graph.unit(u);
            if unit.members.last() != Some(&p)
                || self.is_mandatory(u)
                || unit.is_input_only()
                || !unit.is_valid()
            {
                continue;
            }
            floor = floor.saturating_add(self.masked_floor(&unit.members)?);
            if floor > room {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The most tokens [`Fill::mask_taken_turn`] can free for turn `label`: every tool
    /// output of its units taken whole cut to an item's overhead (0 when the turn's opening
    /// user message is mandatory: nothing is masked then).
    fn freeable(&mut self, label: usize, taken: &[(usize, usize, u64)]) -> Result<u64, PackError> {
        let graph = self.packer.graph;
        let opener = (0..=self.scan).rev().find(|&q| (self.is_user)(q));
        if opener.is_some_and(|q| self.is_mandatory(graph.unit_of(q))) {
            return Ok(0);
        }
        let mut freeable = 0u64;
        for &(u, l, _) in taken.iter().rev() {
            if l != label {
                break;
            }
            let outputs: Vec<usize> = graph
                .unit(u)
                .members
                .iter()
                .copied()
                .filter(|&p| self.packer.costs.maskable(p))
                .collect();
            let whole = self.packer.sum(&outputs)?;
            let overheads = (outputs.len() as u64).saturating_mul(crate::tokens::ITEM_OVERHEAD);
            freeable = freeable.saturating_add(whole.saturating_sub(overheads));
        }
        Ok(freeable)
    }

    /// The first unit that does not fit whole is in turn `label`: the units of that turn
    /// taken whole are masked too, unless the turn's opening user message is mandatory (then
    /// the turn may be sent in part and its newest units stay whole). So a turn that does not
    /// fit whole is kept masked rather than dropped for want of room for its user message.
    fn mask_taken_turn(
        &mut self,
        label: usize,
        taken: &mut [(usize, usize, u64)],
    ) -> Result<(), PackError> {
        let graph = self.packer.graph;
        let opener = (0..=self.scan).rev().find(|&q| (self.is_user)(q));
        if opener.is_some_and(|q| self.is_mandatory(graph.unit_of(q))) {
            return Ok(());
        }
        for entry in taken.iter_mut().rev() {
            if entry.1 != label {
                break;
            }
            let (cost, state) = self.count_masked(entry.0)?;
            let freed = entry.2 - cost; // a masked cost never exceeds the whole one
            self.remaining += freed;
            self.history_tokens -= freed;
            entry.2 = cost;
            self.state.insert(entry.0, state);
        }
        Ok(())
    }

    /// Take candidates newest first until one does not fit; returns the turn label of that
    /// unit (`None`: everything fit).
    ///
    /// Coherent start: the turn the fill stopped in would be sent without its opening user
    /// message (it is in the unit that missed, or older). Unless that message is mandatory,
    /// the turn's newer units that were taken are dropped too, so the kept history starts at
    /// a user message (or at the start of the history).
    fn fill_newest(&mut self) -> Result<Option<usize>, PackError> {
        let graph = self.packer.graph;
        // Kept units in the order they were taken (newest first), with turn label and cost.
        let mut taken: Vec<(usize, usize, u64)> = Vec::new();
        let mut miss_turn = None;
        while let Some((u, label)) = self.next_candidate() {
            let Some((cost, state)) = self.try_take(u, label, &mut taken)? else {
                self.stop = Some(FillStop {
                    unit: u,
                    left: self.remaining,
                    cause: self.refused,
                });
                miss_turn = Some(label);
                break;
            };
            self.remaining -= cost;
            self.history_tokens += cost;
            self.state.insert(u, state);
            taken.push((u, label, cost));
        }
        let Some(miss_turn) = miss_turn else {
            return Ok(None);
        };
        let opener = (0..=self.scan).rev().find(|&q| (self.is_user)(q));
        let anchored = opener.is_some_and(|q| self.is_mandatory(graph.unit_of(q)));
        if !anchored {
            while let Some(&(u, label, cost)) = taken.last() {
                if label != miss_turn {
                    break;
                }
                taken.pop();
                self.remaining += cost;
                self.history_tokens -= cost;
                self.state.insert(u, FillState::TurnIncomplete);
            }
        }
        Ok(Some(miss_turn))
    }

    /// Greedy, after the first miss: the rest of the turn that did not fit is dropped, and
    /// older turns are taken whole or not at all (a turn whose lower bound cannot fit is
    /// dropped uncounted); with masking, older turns are taken masked.
    fn fill_older_turns(&mut self, miss_turn: usize) -> Result<(), PackError> {
        let graph = self.packer.graph;
        let mut rest: Vec<(usize, usize)> = Vec::new();
        while let Some(c) = self.next_candidate() {
            rest.push(c);
        }
        let mut i = 0;
        // Rest of the turn that did not fit.
        while i < rest.len() && rest[i].1 == miss_turn {
            self.state.insert(rest[i].0, FillState::TurnIncomplete);
            i += 1;
        }
        let masked = self.masking.is_some();
        // Older turns, whole or not at all.
        while i < rest.len() {
            let t = rest[i].1;
            let start = i;
            while i < rest.len() && rest[i].1 == t {
                i += 1;
            }
            let group = &rest[start..i];
            let bound = group.iter().fold(0u64, |a, &(u, _)| {
                let members = &graph.unit(u).members;
                a.saturating_add(if masked {
                    self.packer.masked_lower_bound(members)
                } else {
                    self.packer.lower_bound(members)
                })
            });
            if bound > self.remaining {
                continue; // cannot fit: dropped uncounted
            }
            let mut turn_cost = 0u64;
            let mut states = Vec::with_capacity(group.len());
            for &(u, _) in group {
                let (cost, state) = if masked {
                    self.count_masked(u)?
                } else {
                    let cost = self.packer.sum(&graph.unit(u).members)?;
                    self.unit_tokens.insert(u, cost);
                    (cost, FillState::Kept)
                };
                states.push(state);
                turn_cost = turn_cost.saturating_add(cost);
            }
            if turn_cost <= self.remaining {
                self.remaining -= turn_cost;
                self.history_tokens += turn_cost;
                for (&(u, _), state) in group.iter().zip(states) {
                    self.state.insert(u, state);
                }
            }
        }
        Ok(())
    }

    /// What the fill decided; every other unit's decision follows from the unit itself.
    fn finish(self, reserved: Reservation, opts: &PackOptions) -> PackResult {
        let graph = self.packer.graph;
        let mut touched: FxHashMap<usize, UnitDecision> = FxHashMap::default();
        let mut kept_history: Vec<usize> = reserved.dependency.clone();
        let mut masked_units = Vec::new();
        let mut masking_saved = 0u64;
        for (&u, &tokens) in &self.unit_tokens {
            let masked_tokens = self.masked_tokens.get(&u).copied();
            let decision = if self.is_mandatory(u) {
                Decision::Mandatory
            } else {
                match self.state.get(&u) {
                    Some(FillState::Kept) => {
                        kept_history.extend_from_slice(&graph.unit(u).members);
                        Decision::Kept
                    }
                    Some(FillState::Masked) => {
                        kept_history.extend_from_slice(&graph.unit(u).members);
                        masked_units.push(u);
                        masking_saved = masking_saved
                            .saturating_add(tokens.saturating_sub(masked_tokens.unwrap_or(tokens)));
                        Decision::Masked
                    }
                    Some(FillState::TurnIncomplete) => Decision::TurnIncomplete,
                    _ => Decision::OverBudget,
                }
            };
            touched.insert(
                u,
                UnitDecision {
                    unit: u,
                    decision,
                    tokens: Some(tokens),
                    masked_tokens,
                },
            );
        }
        for (&u, &f) in &self.state {
            if f == FillState::TurnIncomplete {
                touched.entry(u).or_insert(UnitDecision {
                    unit: u,
                    decision: Decision::TurnIncomplete,
                    tokens: None,
                    masked_tokens: None,
                });
            }
        }
        kept_history.sort_unstable();
        kept_history.dedup();
        masked_units.sort_unstable();
        PackResult {
            kept_history,
            dependency: reserved.dependency,
            new_input_tokens: reserved.new_input_tokens,
            dependency_tokens: reserved.dependency_tokens,
            history_tokens: self.history_tokens,
            context_tokens: reserved.context_tokens,
            output_reserve: opts.output_reserve,
            budget: opts.budget,
            touched,
            masked_units,
            masking_saved,
            stop: self.stop,
        }
    }
}

/// A [`CostSource`] over JSON values (pure-Rust callers and tests).
pub struct JsonCostSource<'a> {
    items: Vec<&'a serde_json::Value>,
    encoding: crate::tokens::Encoding,
    cache: Vec<Option<u64>>,
}

impl<'a> JsonCostSource<'a> {
    pub fn new(items: Vec<&'a serde_json::Value>, encoding: crate::tokens::Encoding) -> Self {
        let cache = vec![None; items.len()];
        JsonCostSource {
            items,
            encoding,
            cache,
        }
    }
}

impl CostSource for JsonCostSource<'_> {
    fn known(&self, position: usize) -> Option<u64> {
        self.cache.get(position).copied().flatten()
    }

    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        positions
            .iter()
            .map(|&p| {
                if let Some(c) = self.cache[p] {
                    return Ok(c);
                }
                let cost = crate::tokens::item_cost(self.items[p], self.encoding)
                    .map_err(|e| token_failure(p, e))?
                    .total();
                self.cache[p] = Some(cost);
                Ok(cost)
            })
            .collect()
    }
}

fn token_failure(position: usize, e: crate::tokens::TokenError) -> CostFailure {
    match e {
        crate::tokens::TokenError::BadItem { field, message } => CostFailure {
            position,
            field,
            message,
        },
        other => CostFailure {
            position,
            field: "(item)".to_string(),
            message: other.to_string(),
        },
    }
}

impl crate::mask::ValueSource for JsonCostSource<'_> {
    fn item_values(&mut self, positions: &[usize]) -> Result<Vec<serde_json::Value>, CostFailure> {
        Ok(positions.iter().map(|&p| self.items[p].clone()).collect())
    }
}

/// Classify, build the graph and pack JSON items in one call.
pub fn pack_values(
    history: &[serde_json::Value],
    new_input: &[serde_json::Value],
    encoding: crate::tokens::Encoding,
    opts: &PackOptions,
) -> Result<(crate::graph::Graph, PackResult), PackError> {
    pack_values_masked(history, new_input, encoding, opts, None).map(|(g, r, _)| (g, r))
}

/// The masked copies of the items a pack kept masked, as `(position, copy)`.
pub type MaskedCopies = Vec<(usize, serde_json::Value)>;

/// [`pack_values`] with `masking`; also returns the masked copies of what it kept masked
/// (the request is the kept history with those positions replaced, then new_input).
pub fn pack_values_masked(
    history: &[serde_json::Value],
    new_input: &[serde_json::Value],
    encoding: crate::tokens::Encoding,
    opts: &PackOptions,
    masking: Option<Masking>,
) -> Result<(crate::graph::Graph, PackResult, MaskedCopies), PackError> {
    pack_values_pinned(history, new_input, encoding, opts, masking, &[])
}

/// [`pack_values_masked`] with `pinned` history positions (mandatory, see [`pack_view`]).
pub fn pack_values_pinned(
    history: &[serde_json::Value],
    new_input: &[serde_json::Value],
    encoding: crate::tokens::Encoding,
    opts: &PackOptions,
    masking: Option<Masking>,
    pinned: &[usize],
) -> Result<(crate::graph::Graph, PackResult, MaskedCopies), PackError> {
    let n_history = history.len();
    let all: Vec<&serde_json::Value> = history.iter().chain(new_input.iter()).collect();
    let mut metas = Vec::with_capacity(all.len());
    for (p, v) in all.iter().enumerate() {
        let raw = crate::items::RawItem::from_json(v).map_err(|e| PackError::Item {
            position: p,
            label: crate::graph::position_label(n_history, p),
            field: e.field.clone(),
            message: e.message.clone(),
        })?;
        metas.push(crate::items::classify(&raw));
    }
    let graph = crate::graph::build_graph(&metas[..n_history], &metas[n_history..]);
    let mut source = JsonCostSource::new(all, encoding);
    let is_user = |p: usize| metas[p].is_user_message();
    let view = GraphView::whole(&graph);
    let Some(m) = masking else {
        let result = pack_view(view, &is_user, &mut source, opts, pinned, None)?;
        return Ok((graph, result, Vec::new()));
    };
    let kinds = |p: usize| metas[p].kind;
    let mut masked =
        crate::mask::MaskedCosts::new(&mut source, encoding, m.excerpt_tokens).with_kinds(&kinds);
    let result = pack_view_masked(view, &is_user, &mut masked, opts, masking, pinned, None)?;
    let units: Vec<&[usize]> = result
        .masked_units
        .iter()
        .map(|&u| graph.units[u].members.as_slice())
        .collect();
    let fields = masked.copies(&units).map_err(|f| PackError::Item {
        label: crate::graph::position_label(n_history, f.position),
        position: f.position,
        field: f.field,
        message: f.message,
    })?;
    let copies = fields
        .into_iter()
        .map(|(p, f)| (p, f.apply(&history[p])))
        .collect();
    Ok((graph, result, copies))
}
