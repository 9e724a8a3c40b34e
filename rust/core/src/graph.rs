//! The item dependency graph over H ++ N (docs/item-graph.md §12): units of items that must
//! be kept or dropped together, and the rule violations that make a unit invalid.
//!
//! Edges (union-find, §12.2): E1 call/output pairing, E2 program ownership, E3 anonymous tool
//! search, E4 reasoning blocks, E5 MCP approval back-references, E6 SDK de-duplication keys.
//! Validity (§12.3): V1–V10 plus duplicate reasoning ids (§9.5). Everything is O(n) apart
//! from hashing and one sort over the anonymous tool-search pairs. Sections (§) and rules
//! cited in this module are those of docs/item-graph.md.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::items::{CallType, ControlKind, ForeignKind, HostedKind, ItemKind, ItemMeta, FAKE_ID};

/// Why a unit is invalid. [`InvalidReason::message`] gives the exact wording used by the
/// test vectors of docs/item-graph.md §15, [`InvalidReason::code`] a stable snake_case code.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum InvalidReason {
    /// V5: a call (other than the exempt ones) has no output of its matching type.
    CallWithoutOutput,
    /// V4: no call of the matching type with this identity exists.
    OutputWithoutCall,
    /// V4: the output sits before the first matching call.
    OutputBeforeCall,
    /// V6: streamed outputs not `in_progress* [terminal]` (docs/item-graph.md §3).
    InvalidStream,
    /// V7: history program without `program_output` and not named by an N item's `caller`.
    OrphanProgram,
    /// V7: a program child (explicit or inferred) after a `completed` `program_output`.
    ChildAfterCompletedProgram,
    /// V6/§5: anonymous `tool_search_call` with no anonymous output to its right.
    AnonCallWithoutOutput,
    /// V6/§5: anonymous `tool_search_output` with no anonymous call to its left.
    AnonOutputWithoutCall,
    /// V1: client-executed `tool_search_call`/`tool_search_output` without `call_id`.
    ClientToolSearchWithoutCallId,
    /// V9: no model-emitted item in the reasoning block.
    DanglingReasoning,
    /// V3: `compaction_trigger` / `item_reference` in history.
    ControlInHistory,
    /// V3: `compaction_trigger` in new_input that is not the last item.
    CompactionTriggerNotLast,
    /// V1: assistant message with `tool_calls`, or `role:"tool"`.
    ChatCompletionsShape,
    /// V1: the SDK-internal `hosted_tool_call` wrapper.
    HostedToolCallWrapper,
    /// V8: `local_shell_call_output` paired through `id` while its call is in history.
    LocalShellOutputWithoutCallId,
    /// V2: call/output whose identity is missing or empty.
    MissingIdentity,
    /// V7: a `program` that itself has a program `caller`.
    NestedProgram,
    /// V7: a program child positioned before its program.
    ProgramChildBeforeProgram,
    /// V7: a program child whose program is absent (or whose `caller_id` is missing).
    ProgramChildWithoutProgram,
    /// V7: `program_output` status not `completed`/`incomplete`.
    ProgramOutputBadStatus,
    /// V7: `program_output` after a `completed` one.
    ProgramOutputAfterCompleted,
    /// V10: an output's program `caller` differs from its call's.
    CallerMismatch,
    /// Two reasoning items share a non-empty id (SDK de-dup drops the later one).
    DuplicateReasoningId,
    /// V1: unknown `type`.
    UnknownItemType,
    /// V1: message role missing or outside user/system/developer/assistant.
    UnknownRole,
    /// V1: neither `type`, `role` nor `id`.
    NoTypeOrRole,
}

impl InvalidReason {
    pub const ALL: [InvalidReason; 26] = [
        InvalidReason::CallWithoutOutput,
        InvalidReason::OutputWithoutCall,
        InvalidReason::OutputBeforeCall,
        InvalidReason::InvalidStream,
        InvalidReason::OrphanProgram,
        InvalidReason::ChildAfterCompletedProgram,
        InvalidReason::AnonCallWithoutOutput,
        InvalidReason::AnonOutputWithoutCall,
        InvalidReason::ClientToolSearchWithoutCallId,
        InvalidReason::DanglingReasoning,
        InvalidReason::ControlInHistory,
        InvalidReason::CompactionTriggerNotLast,
        InvalidReason::ChatCompletionsShape,
        InvalidReason::HostedToolCallWrapper,
        InvalidReason::LocalShellOutputWithoutCallId,
        InvalidReason::MissingIdentity,
        InvalidReason::NestedProgram,
        InvalidReason::ProgramChildBeforeProgram,
        InvalidReason::ProgramChildWithoutProgram,
        InvalidReason::ProgramOutputBadStatus,
        InvalidReason::ProgramOutputAfterCompleted,
        InvalidReason::CallerMismatch,
        InvalidReason::DuplicateReasoningId,
        InvalidReason::UnknownItemType,
        InvalidReason::UnknownRole,
        InvalidReason::NoTypeOrRole,
    ];

    /// Human-readable reason (exactly the strings of `item-graph-vectors.json`).
    pub fn message(self) -> &'static str {
        match self {
            InvalidReason::CallWithoutOutput => "call without output",
            InvalidReason::OutputWithoutCall => "output without its call",
            InvalidReason::OutputBeforeCall => "output before its call",
            InvalidReason::InvalidStream => "invalid streamed output sequence",
            InvalidReason::OrphanProgram => {
                "history program without program_output and without a new_input child (SDK drops it)"
            }
            InvalidReason::ChildAfterCompletedProgram => {
                "program child after completed program_output"
            }
            InvalidReason::AnonCallWithoutOutput => {
                "anonymous tool_search_call without a later anonymous output"
            }
            InvalidReason::AnonOutputWithoutCall => {
                "anonymous tool_search_output without an earlier anonymous call"
            }
            InvalidReason::ClientToolSearchWithoutCallId => {
                "client-executed tool search without call_id"
            }
            InvalidReason::DanglingReasoning => "reasoning without a model-emitted follower",
            InvalidReason::ControlInHistory => "input-only control in history",
            InvalidReason::CompactionTriggerNotLast => "compaction_trigger not last",
            InvalidReason::ChatCompletionsShape => {
                "Chat Completions shape (tool_calls / role tool)"
            }
            InvalidReason::HostedToolCallWrapper => "hosted_tool_call wrapper is not a wire item",
            InvalidReason::LocalShellOutputWithoutCallId => {
                "local_shell_call_output without call_id (SDK drops the history call)"
            }
            InvalidReason::MissingIdentity => "call or output without identity (missing or empty)",
            InvalidReason::NestedProgram => "nested program (program with a program caller)",
            InvalidReason::ProgramChildBeforeProgram => "program child before its program",
            InvalidReason::ProgramChildWithoutProgram => "program child without its program",
            InvalidReason::ProgramOutputBadStatus => {
                "program_output status is not completed or incomplete"
            }
            InvalidReason::ProgramOutputAfterCompleted => {
                "program_output after completed program_output"
            }
            InvalidReason::CallerMismatch => "call and output have different program callers",
            InvalidReason::DuplicateReasoningId => {
                "duplicate reasoning id (SDK de-duplication drops the later one)"
            }
            InvalidReason::UnknownItemType => "unknown item type",
            InvalidReason::UnknownRole => "message with a missing or unknown role",
            InvalidReason::NoTypeOrRole => "item without type, role or id",
        }
    }

    /// Stable snake_case code.
    pub fn code(self) -> &'static str {
        match self {
            InvalidReason::CallWithoutOutput => "call_without_output",
            InvalidReason::OutputWithoutCall => "output_without_call",
            InvalidReason::OutputBeforeCall => "output_before_call",
            InvalidReason::InvalidStream => "invalid_stream",
            InvalidReason::OrphanProgram => "orphan_program",
            InvalidReason::ChildAfterCompletedProgram => "child_after_completed_program",
            InvalidReason::AnonCallWithoutOutput => "anonymous_call_without_output",
            InvalidReason::AnonOutputWithoutCall => "anonymous_output_without_call",
            InvalidReason::ClientToolSearchWithoutCallId => "client_tool_search_without_call_id",
            InvalidReason::DanglingReasoning => "dangling_reasoning",
            InvalidReason::ControlInHistory => "control_in_history",
            InvalidReason::CompactionTriggerNotLast => "compaction_trigger_not_last",
            InvalidReason::ChatCompletionsShape => "chat_completions_shape",
            InvalidReason::HostedToolCallWrapper => "hosted_tool_call_wrapper",
            InvalidReason::LocalShellOutputWithoutCallId => "local_shell_output_without_call_id",
            InvalidReason::MissingIdentity => "missing_identity",
            InvalidReason::NestedProgram => "nested_program",
            InvalidReason::ProgramChildBeforeProgram => "program_child_before_program",
            InvalidReason::ProgramChildWithoutProgram => "program_child_without_program",
            InvalidReason::ProgramOutputBadStatus => "program_output_bad_status",
            InvalidReason::ProgramOutputAfterCompleted => "program_output_after_completed",
            InvalidReason::CallerMismatch => "caller_mismatch",
            InvalidReason::DuplicateReasoningId => "duplicate_reasoning_id",
            InvalidReason::UnknownItemType => "unknown_item_type",
            InvalidReason::UnknownRole => "unknown_role",
            InvalidReason::NoTypeOrRole => "no_type_or_role",
        }
    }

    fn for_foreign(f: ForeignKind) -> InvalidReason {
        match f {
            ForeignKind::HostedToolCall => InvalidReason::HostedToolCallWrapper,
            ForeignKind::ChatToolCalls | ForeignKind::ChatToolMessage => {
                InvalidReason::ChatCompletionsShape
            }
            ForeignKind::ClientAnonToolSearchCall | ForeignKind::ClientAnonToolSearchOutput => {
                InvalidReason::ClientToolSearchWithoutCallId
            }
            ForeignKind::UnknownRole => InvalidReason::UnknownRole,
            ForeignKind::UnknownType => InvalidReason::UnknownItemType,
            ForeignKind::Untyped => InvalidReason::NoTypeOrRole,
        }
    }
}

impl std::fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// One rule violation: the reason and the global position (H ++ N) of the offending item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    pub reason: InvalidReason,
    pub position: usize,
}

/// A set of items that must be kept or dropped together.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unit {
    /// Sorted global positions (H ++ N).
    pub members: Vec<usize>,
    /// One entry per distinct reason, in rule-check order; empty = valid.
    pub problems: Vec<Problem>,
    /// At least one member is an N item (the unit is mandatory).
    pub contains_new: bool,
    /// Every member is an input-only control (`compaction_trigger` / `item_reference`).
    pub input_only: bool,
}

impl Unit {
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }

    /// Every member is an input-only control.
    pub fn is_input_only(&self) -> bool {
        self.input_only
    }

    /// Distinct reasons, in the order of `problems`.
    pub fn reasons(&self) -> impl Iterator<Item = InvalidReason> + '_ {
        self.problems.iter().map(|p| p.reason)
    }
}

/// The units of H ++ N.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Graph {
    /// Positions `0..n_history` are history, the rest new input.
    pub n_history: usize,
    /// Units ordered by their first member.
    pub units: Vec<Unit>,
    /// Global position (H ++ N) -> unit index.
    pub unit_of: Vec<usize>,
}

impl Graph {
    /// Total number of items (H ++ N).
    pub fn len(&self) -> usize {
        self.unit_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.unit_of.is_empty()
    }

    pub fn is_new(&self, pos: usize) -> bool {
        pos >= self.n_history
    }

    /// The unit containing a global position.
    pub fn unit_at(&self, pos: usize) -> Option<&Unit> {
        self.unit_of.get(pos).and_then(|&u| self.units.get(u))
    }

    /// H positions of units that contain an N item (sorted).
    pub fn mandatory_history(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .units
            .iter()
            .filter(|u| u.contains_new)
            .flat_map(|u| u.members.iter().copied().filter(|&p| p < self.n_history))
            .collect();
        out.sort_unstable();
        out
    }

    /// Invalid units containing N items (a caller error).
    pub fn new_input_errors(&self) -> Vec<&Unit> {
        self.units
            .iter()
            .filter(|u| u.contains_new && !u.is_valid())
            .collect()
    }

    /// Invalid units of history items only (to be dropped).
    pub fn invalid_history_units(&self) -> Vec<&Unit> {
        self.units
            .iter()
            .filter(|u| !u.contains_new && !u.is_valid())
            .collect()
    }

    /// `"history[3]"` / `"new_input[0]"` (see [`position_label`]).
    pub fn position_label(&self, pos: usize) -> String {
        position_label(self.n_history, pos)
    }

    /// Each unit as an embedding reports it (`analyze`), its members' kinds from `metas`
    /// (one per position).
    pub fn unit_reports(&self, metas: &[ItemMeta]) -> Vec<UnitReport> {
        let label = |p: usize| self.position_label(p);
        let report = |unit: &Unit| UnitReport {
            members: unit.members.iter().map(|&p| label(p)).collect(),
            positions: unit.members.clone(),
            kinds: unit.members.iter().map(|&p| metas[p].kind_name()).collect(),
            valid: unit.is_valid(),
            input_only: unit.is_input_only(),
            contains_new: unit.contains_new,
            problems: unit
                .problems
                .iter()
                .map(|p| (p.reason.code(), p.reason.message(), label(p.position)))
                .collect(),
        };
        self.units.iter().map(report).collect()
    }

    /// The graph as an embedding returns it (`analyze`): each unit's report as a tuple
    /// ([`UnitReport::into_tuple`]), `n_history` and [`Graph::mandatory_history`].
    pub fn report_parts(&self, metas: &[ItemMeta]) -> (Vec<UnitTuple>, usize, Vec<usize>) {
        let units = self.unit_reports(metas).into_iter();
        let units = units.map(UnitReport::into_tuple).collect();
        (units, self.n_history, self.mandatory_history())
    }
}

/// One unit of a [`Graph`] as an embedding reports it ([`Graph::unit_reports`]): its
/// members' labels, positions and kinds, whether it is valid, of input items only, or holds
/// new input, and its problems as `(code, message, label)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitReport {
    pub members: Vec<String>,
    pub positions: Vec<usize>,
    pub kinds: Vec<&'static str>,
    pub valid: bool,
    pub input_only: bool,
    pub contains_new: bool,
    pub problems: Vec<(&'static str, &'static str, String)>,
}

/// A [`UnitReport`] in its fields' order, as an embedding hands it out: `(members,
/// positions, kinds, valid, input_only, contains_new, problems)`.
pub type UnitTuple = (
    Vec<String>,
    Vec<usize>,
    Vec<&'static str>,
    bool,
    bool,
    bool,
    Vec<(&'static str, &'static str, String)>,
);

impl UnitReport {
    pub fn into_tuple(self) -> UnitTuple {
        let UnitReport {
            members,
            positions,
            kinds,
            valid,
            input_only,
            contains_new,
            problems,
        } = self;
        (
            members,
            positions,
            kinds,
            valid,
            input_only,
            contains_new,
            problems,
        )
    }
}

/// How messages name a global position of H ++ N with `n_history` history items:
/// `"history[3]"` for a history item, `"new_input[0]"` for a new-input item.
pub fn position_label(n_history: usize, pos: usize) -> String {
    if pos < n_history {
        format!("history[{pos}]")
    } else {
        format!("new_input[{}]", pos - n_history)
    }
}

/// A read-only view of the units of `H ++ N` for [`crate::pack`]: either one [`Graph`], or
/// the units of a cached history graph that lie wholly before a cut position followed by the
/// units of a small graph built over the rest (see [`crate::incremental`]).
#[derive(Debug, Clone, Copy)]
pub struct GraphView<'a> {
    prefix: &'a Graph,
    /// Units of `prefix` that belong to the view (those before the cut).
    prefix_units: usize,
    /// First global position served by `suffix`.
    cut: usize,
    /// Units over positions `cut..`, with members and problem positions already global.
    suffix: Option<&'a Graph>,
    n_history: usize,
    len: usize,
}

impl<'a> GraphView<'a> {
    /// The view of a whole graph.
    pub fn whole(graph: &'a Graph) -> GraphView<'a> {
        GraphView {
            prefix: graph,
            prefix_units: graph.units.len(),
            cut: graph.len(),
            suffix: None,
            n_history: graph.n_history,
            len: graph.len(),
        }
    }

    /// Units of `prefix` wholly before `cut` (no unit of `prefix` may straddle `cut`), then
    /// the units of `suffix`, whose members are global positions `cut..`. `suffix.n_history`
    /// and `suffix.unit_of` count from `cut`.
    pub fn split(prefix: &'a Graph, cut: usize, suffix: &'a Graph) -> GraphView<'a> {
        let prefix_units = if cut < prefix.len() {
            prefix.unit_of[cut]
        } else {
            prefix.units.len()
        };
        GraphView {
            prefix,
            prefix_units,
            cut,
            suffix: Some(suffix),
            n_history: cut + suffix.n_history,
            len: cut + suffix.len(),
        }
    }

    /// Number of history positions (`0..n_history`).
    pub fn n_history(&self) -> usize {
        self.n_history
    }

    /// Number of positions (H ++ N).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn unit_count(&self) -> usize {
        self.prefix_units + self.suffix.map_or(0, |s| s.units.len())
    }

    /// Unit index of a global position.
    pub fn unit_of(&self, pos: usize) -> usize {
        match self.suffix {
            Some(s) if pos >= self.cut => self.prefix_units + s.unit_of[pos - self.cut],
            _ => self.prefix.unit_of[pos],
        }
    }

    /// A unit by index (members are global positions).
    pub fn unit(&self, u: usize) -> &'a Unit {
        if u < self.prefix_units {
            &self.prefix.units[u]
        } else {
            &self.suffix.expect("unit index past the prefix").units[u - self.prefix_units]
        }
    }

    /// `"history[3]"` / `"new_input[0]"` (see [`position_label`]).
    pub fn position_label(&self, pos: usize) -> String {
        position_label(self.n_history, pos)
    }
}

impl Graph {
    /// Add `offset` to every member and problem position (for a graph built over a suffix).
    pub fn shift_positions(&mut self, offset: usize) {
        if offset == 0 {
            return;
        }
        for u in &mut self.units {
            for m in &mut u.members {
                *m += offset;
            }
            for p in &mut u.problems {
                p.position += offset;
            }
        }
    }
}

/// Union-find with path halving and union by size.
struct Dsu {
    parent: Vec<usize>,
    size: Vec<u32>,
}

impl Dsu {
    fn new(n: usize) -> Dsu {
        Dsu {
            parent: (0..n).collect(),
            size: vec![1; n],
        }
    }

    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            let gp = self.parent[self.parent[x]];
            self.parent[x] = gp;
            x = gp;
        }
        x
    }

    fn union(&mut self, a: usize, b: usize) {
        let (mut ra, mut rb) = (self.find(a), self.find(b));
        if ra == rb {
            return;
        }
        if self.size[ra] < self.size[rb] {
            std::mem::swap(&mut ra, &mut rb);
        }
        self.parent[rb] = ra;
        self.size[ra] += self.size[rb];
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Open,
    Closed,
    Bad,
}

impl Stream {
    /// docs/item-graph.md §3: zero or more `in_progress` (status-less chunks allowed anywhere before the
    /// terminal), then at most one `completed`/`incomplete`, nothing after it.
    fn step(self, status: Option<&str>) -> Stream {
        match (self, status) {
            (Stream::Open, None | Some("in_progress")) => Stream::Open,
            (Stream::Open, Some("completed" | "incomplete")) => Stream::Closed,
            _ => Stream::Bad,
        }
    }
}

/// All identified calls sharing one (call type, identity).
struct CallEntry<'a> {
    /// Position of the first such call.
    first: usize,
    /// Some such call is in history.
    in_history: bool,
    /// Some output of the matching type with this identity exists.
    has_output: bool,
    /// Program `caller_id` of the first call (for V10 and inferred program children).
    owner: Option<&'a str>,
    stream: Stream,
    /// Programs only: position of the first `completed` `program_output`.
    completed_at: Option<usize>,
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// The anonymous tool-search pairing rule (E3, docs/item-graph.md §5), read left to right:
/// an anonymous `tool_search_call` opens; an anonymous `tool_search_output` pairs with the
/// newest call still open; an output that finds none open is a further stream chunk of the
/// newest anonymous call to its left (or has no call at all). This pairs exactly what the
/// SDK's right-to-left matcher pairs (a call takes the nearest unmatched output to its
/// right: the same bracket matching read from the other end), and it is the one copy of the
/// rule: [`build_graph`] groups by it and [`crate::incremental`] finds its cuts by it.
///
/// The open calls form a stack kept as a linked list: a state holds only the newest open
/// call, and whoever steps keeps, for each call, the open call under it (returned by
/// [`AnonState::step`] as [`AnonStep::Opened`]). So the state after any prefix of a history
/// is two positions, and the pairing of a suffix can be replayed from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnonState {
    /// The newest anonymous call not paired yet (the top of the stack of open calls).
    pub open: Option<usize>,
    /// The newest anonymous call.
    pub last_call: Option<usize>,
}

/// What one item does to the anonymous pairing ([`AnonState::step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnonStep {
    /// An anonymous call opened; `below` is the open call under it.
    Opened { below: Option<usize> },
    /// An anonymous output paired with this call (the newest open one).
    Paired(usize),
    /// An anonymous output left over: a further chunk of this call (the newest one).
    Chunk(usize),
    /// An anonymous output with no anonymous call before it.
    Orphan,
    /// Not an anonymous tool-search item.
    Other,
}

impl AnonState {
    /// The item at `pos` of `kind`, after everything before it. `below(c)` is the open call
    /// under the open call `c` (what [`AnonStep::Opened`] said when `c` opened).
    pub fn step(
        &mut self,
        pos: usize,
        kind: ItemKind,
        below: impl FnOnce(usize) -> Option<usize>,
    ) -> AnonStep {
        match kind {
            ItemKind::AnonToolSearchCall => {
                let under = self.open;
                self.open = Some(pos);
                self.last_call = Some(pos);
                AnonStep::Opened { below: under }
            }
            ItemKind::AnonToolSearchOutput => match (self.open, self.last_call) {
                (Some(c), _) => {
                    self.open = below(c);
                    AnonStep::Paired(c)
                }
                (None, Some(c)) => AnonStep::Chunk(c),
                (None, None) => AnonStep::Orphan,
            },
            _ => AnonStep::Other,
        }
    }
}

/// Build the units of H ++ N (docs/item-graph.md §12). Never panics on any classified input.
pub fn build_graph(history: &[ItemMeta], new_input: &[ItemMeta]) -> Graph {
    let items: Vec<&ItemMeta> = history.iter().chain(new_input).collect();
    build_graph_refs(&items, history.len())
}

/// [`build_graph`] over items given by reference (`items[..nh]` are the history), so that
/// items held in different places need not be moved together first.
///
/// One pass per rule, in the order of docs/item-graph.md §12.2–§12.3; the order matters only
/// for the order of each unit's problems (rule-check order).
pub fn build_graph_refs(items: &[&ItemMeta], nh: usize) -> Graph {
    let mut b = GraphBuilder::new(items, nh);
    b.check_shapes();
    b.join_duplicate_calls();
    b.join_outputs();
    b.check_unanswered_calls();
    b.join_anonymous_searches();
    b.join_program_children();
    b.check_programs();
    b.join_mcp_approvals();
    b.join_reasoning_blocks();
    b.check_duplicate_reasoning_ids();
    b.join_dedup_keys();
    b.into_graph()
}

/// State shared by the passes of [`build_graph_refs`].
struct GraphBuilder<'a> {
    items: &'a [&'a ItemMeta],
    /// Number of history items (`items[..nh]`).
    nh: usize,
    dsu: Dsu,
    /// Problems in rule-check order; grouped per unit at the end.
    problems: Vec<Problem>,
    /// Identified calls by (call type, identity).
    calls: HashMap<(CallType, &'a str), CallEntry<'a>>,
    /// Program owner of every item: its own program caller, or (outputs) its call's.
    owner: Vec<Option<&'a str>>,
    /// Program ids named by a new_input item's `caller`.
    named_by_new: HashSet<&'a str>,
}

impl<'a> GraphBuilder<'a> {
    fn new(items: &'a [&'a ItemMeta], nh: usize) -> GraphBuilder<'a> {
        GraphBuilder {
            items,
            nh,
            dsu: Dsu::new(items.len()),
            problems: Vec::new(),
            calls: HashMap::default(),
            owner: items.iter().map(|it| it.program_caller()).collect(),
            named_by_new: HashSet::default(),
        }
    }

    fn flag(&mut self, reason: InvalidReason, position: usize) {
        self.problems.push(Problem { reason, position });
    }

    /// V1 foreign items, V3 controls.
    fn check_shapes(&mut self) {
        let (items, nh, n) = (self.items, self.nh, self.items.len());
        for (p, it) in items.iter().enumerate() {
            match it.kind {
                ItemKind::Foreign(f) => self.flag(InvalidReason::for_foreign(f), p),
                ItemKind::Control(_) if p < nh => self.flag(InvalidReason::ControlInHistory, p),
                ItemKind::Control(ControlKind::CompactionTrigger) if p + 1 != n => {
                    self.flag(InvalidReason::CompactionTriggerNotLast, p);
                }
                _ => {}
            }
        }
    }

    /// E1 (calls): calls of one type and identity join; V2 for calls.
    fn join_duplicate_calls(&mut self) {
        let (items, nh) = (self.items, self.nh);
        for (p, it) in items.iter().enumerate() {
            let ItemKind::Call(ct) = it.kind else {
                continue;
            };
            let Some(id) = non_empty(it.identity()) else {
                self.flag(InvalidReason::MissingIdentity, p);
                continue;
            };
            let entry = self.calls.entry((ct, id)).or_insert_with(|| CallEntry {
                first: p,
                in_history: false,
                has_output: false,
                owner: it.program_caller(),
                stream: Stream::Open,
                completed_at: None,
            });
            entry.in_history |= p < nh;
            let first = entry.first;
            if first != p {
                self.dsu.union(first, p);
            }
        }
    }

    /// E1 (outputs): V2, V4, V6 (identified streams), V7 (program_output), V8, V10.
    fn join_outputs(&mut self) {
        let items = self.items;
        for (p, it) in items.iter().enumerate() {
            let ItemKind::Output(ct) = it.kind else {
                continue;
            };
            let Some(id) = non_empty(it.identity()) else {
                self.flag(InvalidReason::MissingIdentity, p);
                continue;
            };
            let Some(entry) = self.calls.get_mut(&(ct, id)) else {
                self.flag(InvalidReason::OutputWithoutCall, p);
                continue;
            };
            entry.has_output = true;
            let mut found: Vec<InvalidReason> = Vec::new();
            if p < entry.first {
                found.push(InvalidReason::OutputBeforeCall);
            }
            if it.uses_id_fallback() && entry.in_history {
                found.push(InvalidReason::LocalShellOutputWithoutCallId);
            }
            if it.has_caller() && it.program_caller() != entry.owner {
                found.push(InvalidReason::CallerMismatch);
            }
            let status = it.raw.status.as_deref();
            if ct.is_streamed() && entry.stream != Stream::Bad {
                entry.stream = entry.stream.step(status);
                if entry.stream == Stream::Bad {
                    found.push(InvalidReason::InvalidStream);
                }
            }
            if ct == CallType::Program {
                let completed = status == Some("completed");
                if !completed && status != Some("incomplete") {
                    found.push(InvalidReason::ProgramOutputBadStatus);
                }
                match entry.completed_at {
                    Some(c) if p > c => found.push(InvalidReason::ProgramOutputAfterCompleted),
                    None if completed => entry.completed_at = Some(p),
                    _ => {}
                }
            }
            let (first, call_owner) = (entry.first, entry.owner);
            self.dsu.union(first, p);
            if !it.is_program_owned() {
                self.owner[p] = call_owner;
            }
            for reason in found {
                self.flag(reason, p);
            }
        }
    }

    /// V5: calls without output (program, program-owned pending shell call and program-owned
    /// MCP approval request are exempt; so is a pending shell call in new_input, which the
    /// SDK sends as given for the hosted shell to run).
    fn check_unanswered_calls(&mut self) {
        let (items, nh) = (self.items, self.nh);
        for (p, it) in items.iter().enumerate() {
            let ItemKind::Call(ct) = it.kind else {
                continue;
            };
            let Some(id) = non_empty(it.identity()) else {
                continue;
            };
            if self.calls.get(&(ct, id)).is_some_and(|e| e.has_output) {
                continue;
            }
            let exempt = match ct {
                CallType::Program => true,
                CallType::ShellCall => {
                    (it.is_program_owned() || p >= nh)
                        && matches!(it.raw.status.as_deref(), None | Some("in_progress"))
                }
                CallType::McpApprovalRequest => it.is_program_owned(),
                _ => false,
            };
            if !exempt {
                self.flag(InvalidReason::CallWithoutOutput, p);
            }
        }
    }

    /// E3 + V6: anonymous tool search (docs/item-graph.md §5). Each anonymous call pairs with the nearest
    /// unpaired anonymous output to its right; outputs left over are further chunks of the
    /// nearest anonymous call to their left. Overlapping spans merge.
    fn join_anonymous_searches(&mut self) {
        let pairs = self.anonymous_pairs();
        let items = self.items;
        // Per call: stream rule, span; overlapping spans merge (sweep by call position).
        let mut sweep: Option<(usize, usize)> = None; // (representative, max end)
        let mut i = 0;
        while i < pairs.len() {
            let call = pairs[i].0;
            let mut stream = Stream::Open;
            let mut end = call;
            while let Some(&(c, o)) = pairs.get(i) {
                if c != call {
                    break;
                }
                self.dsu.union(call, o);
                if !items[o].is_program_owned() {
                    self.owner[o] = self.owner[call];
                }
                if stream != Stream::Bad {
                    stream = stream.step(items[o].raw.status.as_deref());
                    if stream == Stream::Bad {
                        self.flag(InvalidReason::InvalidStream, o);
                    }
                }
                end = end.max(o);
                i += 1;
            }
            sweep = match sweep {
                Some((rep, max_end)) if call < max_end => {
                    self.dsu.union(rep, call);
                    Some((rep, max_end.max(end)))
                }
                _ => Some((call, end)),
            };
        }
    }

    /// The (call, output) pairs of anonymous tool searches, sorted ([`AnonState`]: the one
    /// pairing rule, also used by the incremental index's cut); flags the calls and outputs
    /// that have no partner.
    fn anonymous_pairs(&mut self) -> Vec<(usize, usize)> {
        let items = self.items;
        let mut state = AnonState::default();
        let mut below: HashMap<usize, Option<usize>> = HashMap::default();
        let mut pairs: Vec<(usize, usize)> = Vec::new();
        let mut orphans: Vec<usize> = Vec::new();
        for (p, it) in items.iter().enumerate() {
            match state.step(p, it.kind, |c| below.get(&c).copied().flatten()) {
                AnonStep::Opened { below: b } => {
                    below.insert(p, b);
                }
                AnonStep::Paired(c) | AnonStep::Chunk(c) => pairs.push((c, p)),
                AnonStep::Orphan => orphans.push(p),
                AnonStep::Other => {}
            }
        }
        // Flagged newest first, as ever (a unit reports each reason at its first flag).
        let mut open = state.open;
        while let Some(c) = open {
            self.flag(InvalidReason::AnonCallWithoutOutput, c);
            open = below.get(&c).copied().flatten();
        }
        for &o in orphans.iter().rev() {
            self.flag(InvalidReason::AnonOutputWithoutCall, o);
        }
        pairs.sort_unstable();
        pairs
    }

    /// E2 + V7: every program-owned item joins its program.
    fn join_program_children(&mut self) {
        let (items, nh) = (self.items, self.nh);
        for (p, it) in items.iter().enumerate() {
            if it.is_foreign() || !it.is_program_owned() {
                continue;
            }
            if it.kind == ItemKind::Call(CallType::Program) {
                self.flag(InvalidReason::NestedProgram, p);
            }
            let pid = it.program_caller();
            if p >= nh {
                if let Some(pid) = pid {
                    self.named_by_new.insert(pid);
                }
            }
            let program = pid.and_then(|pid| self.calls.get(&(CallType::Program, pid)));
            match program.map(|e| e.first) {
                None => self.flag(InvalidReason::ProgramChildWithoutProgram, p),
                Some(first) => {
                    self.dsu.union(first, p);
                    if p < first {
                        self.flag(InvalidReason::ProgramChildBeforeProgram, p);
                    }
                }
            }
        }
    }

    /// V7: a history program needs its output or an N item naming it; nothing of a program
    /// but its outputs may follow its `completed` output.
    fn check_programs(&mut self) {
        let (items, nh) = (self.items, self.nh);
        for (p, it) in items.iter().enumerate() {
            if p < nh && it.kind == ItemKind::Call(CallType::Program) {
                if let Some(id) = non_empty(it.identity()) {
                    let closed = self
                        .calls
                        .get(&(CallType::Program, id))
                        .is_some_and(|e| e.has_output);
                    if !closed && !self.named_by_new.contains(id) {
                        self.flag(InvalidReason::OrphanProgram, p);
                    }
                }
            }
            if let Some(pid) = self.owner[p] {
                let done = self
                    .calls
                    .get(&(CallType::Program, pid))
                    .and_then(|e| e.completed_at);
                if done.is_some_and(|c| p > c)
                    && !matches!(it.kind, ItemKind::Output(CallType::Program))
                {
                    self.flag(InvalidReason::ChildAfterCompletedProgram, p);
                }
            }
        }
    }

    /// E5: an `mcp_call` joins the approval request it references.
    fn join_mcp_approvals(&mut self) {
        let items = self.items;
        for (p, it) in items.iter().enumerate() {
            if it.kind != ItemKind::Hosted(HostedKind::McpCall) {
                continue;
            }
            let Some(ar) = non_empty(it.raw.approval_request_id.as_deref()) else {
                continue;
            };
            if let Some(first) = self
                .calls
                .get(&(CallType::McpApprovalRequest, ar))
                .map(|e| e.first)
            {
                self.dsu.union(first, p);
            }
        }
    }

    /// E4 + V9: reasoning blocks. A run of consecutive reasoning / model-emitted /
    /// server-emitted-output items; each reasoning item joins everything after it in the run
    /// and needs a model-emitted item after it in the run.
    fn join_reasoning_blocks(&mut self) {
        let items = self.items;
        let n = items.len();
        let continues = |it: &ItemMeta| {
            it.is_reasoning()
                || it.is_model_emitted()
                || it.is_server_output()
                || it.is_chat_model_message()
        };
        let mut p = 0;
        while p < n {
            if !continues(items[p]) {
                p += 1;
                continue;
            }
            let start = p;
            let mut end = p;
            while end + 1 < n && continues(items[end + 1]) {
                end += 1;
            }
            let last_model = (start..=end).rev().find(|&i| items[i].is_model_emitted());
            // A Chat Completions model's message follows only that provider's reasoning.
            let last_chat = (start..=end)
                .rev()
                .find(|&i| items[i].is_model_emitted() || items[i].is_chat_model_message());
            if let Some(r0) = (start..=end).find(|&i| items[i].is_reasoning()) {
                for i in r0 + 1..=end {
                    self.dsu.union(r0, i);
                }
                for (i, it) in items.iter().enumerate().take(end + 1).skip(r0) {
                    let follower = if it.is_chat_reasoning() {
                        last_chat
                    } else {
                        last_model
                    };
                    if it.is_reasoning() && follower.is_none_or(|m| m < i) {
                        self.flag(InvalidReason::DanglingReasoning, i);
                    }
                }
            }
            p = end + 1;
        }
    }

    /// Two reasoning items sharing a non-empty id: the SDK's de-duplication drops the later.
    fn check_duplicate_reasoning_ids(&mut self) {
        let items = self.items;
        let mut reasoning_ids: HashSet<&str> = HashSet::default();
        for (p, it) in items.iter().enumerate() {
            if !it.is_reasoning() {
                continue;
            }
            // An id-less reasoning item is valid (V9, docs/item-graph.md §6.3): under
            // reasoning_item_id_policy="omit" the SDK strips every history reasoning id before
            // the callback runs and sends the items so, with or without encrypted_content.
            let id = non_empty(it.raw.id.as_deref());
            // The SDK's de-duplication ignores the `__fake_id__` placeholder (Chat Completions
            // models give it to every item), so such reasoning items never collapse.
            if let Some(id) = id.filter(|id| *id != FAKE_ID) {
                if !reasoning_ids.insert(id) {
                    self.flag(InvalidReason::DuplicateReasoningId, p);
                }
            }
        }
    }

    /// E6: items sharing an SDK de-duplication key join.
    fn join_dedup_keys(&mut self) {
        let items = self.items;
        let mut keys: HashMap<(Option<&str>, &str), usize> = HashMap::default();
        for (p, it) in items.iter().enumerate() {
            if let Some(k) = it.dedup_key() {
                let first = *keys.entry(k).or_insert(p);
                if first != p {
                    self.dsu.union(first, p);
                }
            }
        }
    }

    /// Units ordered by first member, each with its distinct problems in rule-check order.
    fn into_graph(mut self) -> Graph {
        let (items, nh, n) = (self.items, self.nh, self.items.len());
        let mut unit_of_root = vec![usize::MAX; n];
        let mut unit_of = vec![0usize; n];
        let mut units: Vec<Unit> = Vec::new();
        for (p, it) in items.iter().enumerate() {
            let r = self.dsu.find(p);
            if unit_of_root[r] == usize::MAX {
                unit_of_root[r] = units.len();
                units.push(Unit {
                    members: Vec::new(),
                    problems: Vec::new(),
                    contains_new: false,
                    input_only: true,
                });
            }
            let u = unit_of_root[r];
            unit_of[p] = u;
            let unit = &mut units[u];
            unit.members.push(p);
            unit.contains_new |= p >= nh;
            unit.input_only &= it.is_control();
        }
        for prob in self.problems {
            let unit = &mut units[unit_of[prob.position]];
            if !unit.problems.iter().any(|q| q.reason == prob.reason) {
                unit.problems.push(prob);
            }
        }
        Graph {
            n_history: nh,
            units,
            unit_of,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn metas(v: Value) -> Vec<ItemMeta> {
        let Value::Array(a) = v else {
            panic!("expected an array")
        };
        a.iter()
            .map(|x| ItemMeta::from_json(x).unwrap_or_else(|e| panic!("{e}")))
            .collect()
    }

    fn graph_of(h: Value, n: Value) -> Graph {
        build_graph(&metas(h), &metas(n))
    }

    fn user() -> Value {
        json!({"role":"user","content":"x"})
    }

    fn msg() -> Value {
        json!({"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[]})
    }

    /// The invalid units as member lists with their reasons.
    fn invalid(g: &Graph) -> Vec<(Vec<usize>, Vec<&'static str>)> {
        summary(g)
            .into_iter()
            .filter(|(_, r)| !r.is_empty())
            .collect()
    }

    /// Units as member lists, plus the reasons of each invalid unit.
    fn summary(g: &Graph) -> Vec<(Vec<usize>, Vec<&'static str>)> {
        g.units
            .iter()
            .map(|u| {
                (
                    u.members.clone(),
                    u.reasons().map(InvalidReason::code).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn reason_codes_and_messages_are_distinct() {
        let codes: HashSet<_> = InvalidReason::ALL.iter().map(|r| r.code()).collect();
        let msgs: HashSet<_> = InvalidReason::ALL.iter().map(|r| r.message()).collect();
        assert_eq!(codes.len(), InvalidReason::ALL.len());
        assert_eq!(msgs.len(), InvalidReason::ALL.len());
    }

    #[test]
    fn empty_inputs() {
        let g = build_graph(&[], &[]);
        assert!(g.is_empty() && g.units.is_empty());
        assert!(g.mandatory_history().is_empty());
    }

    #[test]
    fn status_less_stream_chunks_are_accepted() {
        let h = json!([
            {"type":"shell_call","call_id":"s1","status":"completed"},
            {"type":"shell_call_output","call_id":"s1"},
            {"type":"shell_call_output","call_id":"s1"},
            {"type":"shell_call_output","call_id":"s1","status":"in_progress"},
            {"type":"shell_call_output","call_id":"s1","status":"completed"}
        ]);
        let g = graph_of(h, json!([]));
        assert_eq!(summary(&g), vec![(vec![0, 1, 2, 3, 4], vec![])]);
        // A chunk after the terminal, or an unknown status, breaks the stream.
        for bad in [json!(null), json!("weird")] {
            let mut h = json!([
                {"type":"shell_call","call_id":"s1"},
                {"type":"shell_call_output","call_id":"s1","status":"completed"},
                {"type":"shell_call_output","call_id":"s1"}
            ]);
            if bad.is_string() {
                h[1]["status"] = bad;
            }
            let g = graph_of(h, json!([]));
            assert_eq!(summary(&g), vec![(vec![0, 1, 2], vec!["invalid_stream"])]);
        }
    }

    #[test]
    fn anonymous_search_interleaved_spans_merge() {
        // C0 C1 O2 O3: C1 takes O2, C0 takes O3 -> nested spans merge into one unit.
        let c = json!({"type":"tool_search_call","status":"completed"});
        let o = json!({"type":"tool_search_output","status":"completed"});
        let g = graph_of(json!([c, c, o, o, user()]), json!([]));
        assert_eq!(
            summary(&g),
            vec![(vec![0, 1, 2, 3], vec![]), (vec![4], vec![])]
        );
        // C O C O: two separate pairs.
        let g = graph_of(json!([c, o, c, o]), json!([]));
        assert_eq!(
            summary(&g),
            vec![(vec![0, 1], vec![]), (vec![2, 3], vec![])]
        );
        // O C: both invalid.
        let g = graph_of(json!([o, c]), json!([]));
        assert_eq!(
            summary(&g),
            vec![
                (vec![0], vec!["anonymous_output_without_call"]),
                (vec![1], vec!["anonymous_call_without_output"])
            ]
        );
        // C O(completed) O(completed): leftover chunk joins the call, stream broken.
        let g = graph_of(json!([c, o, o]), json!([]));
        assert_eq!(summary(&g), vec![(vec![0, 1, 2], vec!["invalid_stream"])]);
    }

    #[test]
    fn duplicate_reasoning_id_invalidates_the_unit() {
        let r = json!({"type":"reasoning","id":"rs_1","encrypted_content":"e"});
        let h = json!([r, {"type":"function_call","call_id":"a"}, {"type":"function_call_output","call_id":"a"},
                       user(), r, {"type":"function_call","call_id":"b"}, {"type":"function_call_output","call_id":"b"}]);
        let g = graph_of(h, json!([]));
        assert_eq!(
            summary(&g),
            vec![
                (vec![0, 1, 2, 4, 5, 6], vec!["duplicate_reasoning_id"]),
                (vec![3], vec![])
            ]
        );
    }

    #[test]
    fn placeholder_reasoning_ids_are_not_duplicates() {
        // Chat Completions models give every item `__fake_id__`; the SDK never collapses them.
        let r = json!({"type":"reasoning","id":"__fake_id__","summary":[]});
        let call = |c: &str| json!({"type":"function_call","id":"__fake_id__","call_id":c});
        let out = |c: &str| json!({"type":"function_call_output","call_id":c});
        let h = json!([r, call("a"), out("a"), user(), r, call("b"), out("b")]);
        let g = graph_of(h, json!([]));
        assert_eq!(
            summary(&g),
            vec![
                (vec![0, 1, 2], vec![]),
                (vec![3], vec![]),
                (vec![4, 5, 6], vec![])
            ]
        );
    }

    #[test]
    fn chat_reasoning_is_followed_by_a_placeholder_message() {
        // Claude's thinking through LiteLLM, then the turn's final text: both carry
        // `__fake_id__`; the converter sends them as one assistant message (§6.3).
        let thinking = json!({"type":"reasoning","id":"__fake_id__","summary":[],
                              "provider_data":{"thinking_blocks":[]}});
        let msg = json!({"type":"message","role":"assistant","id":"__fake_id__",
                         "status":"completed","content":[]});
        let g = graph_of(json!([user(), thinking, msg, user()]), json!([]));
        assert_eq!(
            summary(&g),
            vec![(vec![0], vec![]), (vec![1, 2], vec![]), (vec![3], vec![])]
        );
        // An OpenAI reasoning item needs a model-emitted follower: a placeholder message is not.
        let rs = json!({"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA"});
        let g = graph_of(json!([user(), rs, msg]), json!([]));
        assert_eq!(
            summary(&g),
            vec![(vec![0], vec![]), (vec![1, 2], vec!["dangling_reasoning"])]
        );
    }

    #[test]
    fn id_less_reasoning_is_valid() {
        // reasoning_item_id_policy="omit": the SDK strips history reasoning ids and sends the
        // items as they are, encrypted_content or not (V9, docs/item-graph.md §12.3).
        let h = json!([
            {"role":"user","content":"q"},
            {"type":"reasoning","summary":[]},
            {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"ok"},
            {"type":"reasoning","summary":[{"type":"summary_text","text":"t"}]},
            msg(),
        ]);
        let g = graph_of(h, json!([{"role":"user","content":"next"}]));
        assert!(g.units.iter().all(Unit::is_valid));
        assert_eq!(g.unit_of[1], g.unit_of[3]);
        let h = json!([{"type":"reasoning","encrypted_content":"e"}, {"type":"web_search_call","id":"w"}]);
        assert!(graph_of(h, json!([])).units.iter().all(Unit::is_valid));
        // Still dangling without a model-emitted follower.
        let h = json!([{"type":"reasoning","summary":[]}, {"role":"user","content":"q"}]);
        assert_eq!(
            invalid(&graph_of(h, json!([]))),
            vec![(vec![0], vec!["dangling_reasoning"])]
        );
    }

    #[test]
    fn pending_shell_call_is_valid_only_in_new_input() {
        let shell = json!({"type":"shell_call","call_id":"s1","status":"in_progress",
                           "action":{"commands":["ls"]}});
        let g = graph_of(
            json!([{"role":"user","content":"q"}]),
            json!([shell.clone()]),
        );
        assert!(g.units.iter().all(Unit::is_valid));
        let g = graph_of(
            json!([shell.clone()]),
            json!([{"role":"user","content":"q"}]),
        );
        assert_eq!(invalid(&g), vec![(vec![0], vec!["call_without_output"])]);
        // A completed shell call still needs its output, wherever it is.
        let mut done = shell;
        done["status"] = json!("completed");
        let g = graph_of(json!([]), json!([done]));
        assert_eq!(invalid(&g), vec![(vec![0], vec!["call_without_output"])]);
    }

    #[test]
    fn reasoning_chain_and_server_outputs_in_block() {
        // r r program_output msg: both reasoning items reach the model message.
        let r = json!({"type":"reasoning","encrypted_content":"e"});
        let h = json!([r, r, {"type":"tool_search_output","status":"completed"}, msg(), user()]);
        let g = graph_of(h, json!([]));
        // The anonymous output has no call: the whole block is invalid.
        assert_eq!(
            summary(&g),
            vec![
                (vec![0, 1, 2, 3], vec!["anonymous_output_without_call"]),
                (vec![4], vec![])
            ]
        );
        // Reasoning at the very end of N is dangling -> error.
        let g = graph_of(json!([user()]), json!([user(), r]));
        assert_eq!(g.new_input_errors().len(), 1);
    }

    #[test]
    fn program_rules() {
        let prog = json!({"type":"program","id":"pg","call_id":"p1"});
        let child = |t: &str, id: &str| json!({"type":t,"call_id":id,"caller":{"type":"program","caller_id":"p1"}});
        let po = |s: &str| json!({"type":"program_output","call_id":"p1","status":s});
        // Child before its program, program_output with bad status, po after completed.
        let h = json!([
            child("function_call", "c"),
            prog,
            child("function_call_output", "c"),
            po("done"),
            po("completed"),
            po("incomplete")
        ]);
        let g = graph_of(h, json!([]));
        assert_eq!(
            summary(&g),
            vec![(
                vec![0, 1, 2, 3, 4, 5],
                vec![
                    "program_output_bad_status",
                    "program_output_after_completed",
                    "program_child_before_program"
                ]
            )]
        );
        // Child of an absent program; nested program.
        let h = json!([child("web_search_call","w"), {"type":"program","id":"x","call_id":"p2","caller":{"type":"program","caller_id":"p1"}}]);
        let g = graph_of(h, json!([]));
        assert_eq!(
            summary(&g),
            vec![
                (vec![0], vec!["program_child_without_program"]),
                (
                    vec![1],
                    vec![
                        "nested_program",
                        "program_child_without_program",
                        "orphan_program"
                    ]
                )
            ]
        );
        // Program-owned pending shell call and MCP request may stay unanswered; a program
        // in N is never orphan.
        let n = json!([prog, child("shell_call","s"), {"type":"mcp_approval_request","id":"m","caller":{"type":"program","caller_id":"p1"}}]);
        let g = graph_of(json!([user()]), n);
        assert!(g.units.iter().all(Unit::is_valid));
        assert_eq!(g.units.len(), 2);
    }

    #[test]
    fn caller_mismatch_and_inferred_child_after_completion() {
        let h = json!([
            {"type":"program","id":"pg","call_id":"p1"},
            {"type":"program_output","call_id":"p1","status":"completed"},
            {"type":"function_call","call_id":"c"},
            {"type":"function_call_output","call_id":"c","caller":{"type":"program","caller_id":"p1"}}
        ]);
        let g = graph_of(h, json!([]));
        assert_eq!(
            summary(&g),
            vec![(
                vec![0, 1, 2, 3],
                vec!["caller_mismatch", "child_after_completed_program"]
            )]
        );
        // Output without caller inherits the call's program (child after completion).
        let h = json!([
            {"type":"program","id":"pg","call_id":"p1"},
            {"type":"program_output","call_id":"p1","status":"completed"},
            {"type":"function_call","call_id":"c","caller":{"type":"program","caller_id":"p1"}},
            {"type":"function_call_output","call_id":"c"}
        ]);
        let g = graph_of(h, json!([]));
        assert_eq!(g.units[0].problems.len(), 1);
        assert_eq!(g.units[0].problems[0].position, 2);
    }

    #[test]
    fn controls_in_new_input() {
        let g = graph_of(
            json!([user()]),
            json!([{"id":"msg_0"}, {"type":"item_reference","id":"msg_1"}, user(), {"type":"compaction_trigger"}]),
        );
        assert!(g.units.iter().all(Unit::is_valid));
        assert!(g.units[1].is_input_only() && !g.units[0].is_input_only());
        assert!(g.new_input_errors().is_empty());
        let g = graph_of(
            json!([]),
            json!([{"type":"compaction_trigger"}, {"type":"compaction_trigger"}]),
        );
        assert_eq!(g.new_input_errors().len(), 1);
    }

    #[test]
    fn local_shell_id_fallback_in_new_input_is_allowed() {
        let call = json!({"type":"local_shell_call","id":"l","call_id":"c1","status":"completed"});
        let out = json!({"type":"local_shell_call_output","id":"c1"});
        let g = graph_of(json!([]), json!([call, out]));
        assert_eq!(summary(&g), vec![(vec![0, 1], vec![])]);
        let g = graph_of(json!([call]), json!([out]));
        assert_eq!(g.new_input_errors().len(), 1);
        assert_eq!(g.mandatory_history(), vec![0]);
    }

    #[test]
    fn missing_identity_and_labels() {
        let h = json!([{"type":"function_call","call_id":""}, {"type":"function_call_output","call_id":""}, {"type":"mcp_approval_response"}]);
        let g = graph_of(h, json!([user()]));
        assert_eq!(
            summary(&g),
            vec![
                (vec![0], vec!["missing_identity"]),
                (vec![1], vec!["missing_identity"]),
                (vec![2], vec!["missing_identity"]),
                (vec![3], vec![])
            ]
        );
        assert_eq!(g.position_label(2), "history[2]");
        assert_eq!(g.position_label(3), "new_input[0]");
    }

    #[test]
    fn dedup_key_joins_hosted_items() {
        let w = json!({"type":"web_search_call","id":"ws_1","status":"completed"});
        let g = graph_of(json!([w, user(), w]), json!([]));
        assert_eq!(summary(&g), vec![(vec![0, 2], vec![]), (vec![1], vec![])]);
    }

    #[test]
    fn mcp_call_joins_its_request() {
        let h = json!([
            {"type":"mcp_approval_request","id":"r"},
            {"type":"mcp_approval_response","approval_request_id":"r"},
            user(),
            {"type":"mcp_call","id":"m","approval_request_id":"r"},
            {"type":"mcp_call","id":"m2","approval_request_id":"zzz"}
        ]);
        let g = graph_of(h, json!([]));
        assert_eq!(
            summary(&g),
            vec![
                (vec![0, 1, 3], vec![]),
                (vec![2], vec![]),
                (vec![4], vec![])
            ]
        );
    }
}
