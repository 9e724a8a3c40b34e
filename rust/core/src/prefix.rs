//! A cache-stable prefix: where a session's request starts, decided so that consecutive
//! requests extend each other byte for byte (issue 34's groundwork).
//!
//! # Design note
//!
//! * **Why.** Providers bill the part of a request that repeats a recently sent prefix at a
//!   fraction of the input price (OpenAI: a tenth for gpt-5-class models, from 1,024 tokens in
//!   128-token steps). The newest-first fill of [`crate::pack`] moves its cut (the first kept
//!   history unit) and its masked set at almost every call under pressure, so almost nothing
//!   repeats. This module keeps them put while the request fits and moves them once, far, when
//!   it does not.
//! * **What is decided.** Over the atomic units of [`crate::graph`] (oldest first; history then
//!   new input), [`decide`] returns the *cut* (index of the first optional unit kept; every
//!   sendable unit from it on is kept, with the mandatory units wherever they are) and the
//!   *masked set* (units sent with their tool outputs cut to excerpts, [`crate::mask`]). Units
//!   are kept, masked or dropped whole; invalid and input-only units are never sent (as in
//!   [`crate::pack`]). A cut sits at a turn boundary (a unit opening with a user message), at
//!   the start of the history, inside a turn whose opening user message is mandatory (an
//!   anchored turn, as the pack keeps it), or past every optional unit.
//! * **Stay.** Given the previous decision ([`PrefixState`]) and a history that extends what
//!   it covered, the request keeps the previous cut and masked set and adds what was appended,
//!   whole. If that fits the budget, that is the decision: the request is the previous one
//!   plus the appended units, so the provider's cache covers the whole previous request.
//! * **Move.** Otherwise (or with no previous decision and a history that does not fit whole)
//!   the cut moves once, so that the request falls to `low_water × budget`: tool outputs older
//!   than the newest `keep_recent` turns are masked first, then the oldest turns are dropped
//!   until the request is at the mark. Only when the newest `keep_recent` turns whole cannot
//!   reach the mark does masking reach into them (one turn at a time, oldest first), down to
//!   every optional unit masked; if the mark cannot be reached at all, the lowest cut that fits
//!   the budget is taken (said in the reason). Mandatory units (new input and its tail
//!   dependency) are never masked or dropped; if they alone do not fit,
//!   [`PrefixError::BudgetExceeded`].
//! * **What the state is.** In item positions, not unit indices (a unit grows when items are
//!   appended: a program gains its output, a tool search the calls it loaded, an approval
//!   request its call): the cut's first item, the number of items the previous request
//!   covered, the first items of the masked units and of the mandatory units before the cut,
//!   and the digests of the item identities before the cut and from the cut to the covered
//!   end ([`chain_digest`]; the caller's identities, [`plan_prefix_values`] digests each item).
//!   A state whose digests do not match the new history (rewritten, popped, compacted), or
//!   whose units were regrouped across the cut, is ignored and the decision is made fresh,
//!   with the reason saying so.
//! * **What is reported.** The request's tokens, the tokens it shares with the previous
//!   request (the longest common run of units, as sent, from the start), and a
//!   [`PrefixReason`] ("did not fit: cut moved from unit A to B, request X -> Y").
//! * **What is linear.** Everything: one pass to check the state, one pass per candidate
//!   `keep_recent` over suffix sums. Costs are the caller's; [`plan_prefix_values`] counts
//!   masked costs only when a masked cost can matter.
//! * **Not yet.** The session callback and per-call filter do not call this yet; persisting
//!   the state needs identities stable across processes ([`crate::digest`]'s digests are
//!   keyed per process).

use std::fmt;

use crate::digest::{Digest, Digester};
use crate::graph::GraphView;
use crate::pack::{CostSource, JsonCostSource, MaskedCopies, PackError, PackOptions, Section};

/// How the prefix moves (see the module note).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CachePolicy {
    /// Fraction of the budget a moved request falls to, in `(0, 1]`.
    pub low_water: f64,
    /// Newest turns whose tool outputs stay whole once masking starts.
    pub keep_recent: usize,
}

impl Default for CachePolicy {
    fn default() -> Self {
        CachePolicy {
            low_water: 0.7,
            keep_recent: 3,
        }
    }
}

impl CachePolicy {
    /// A policy, checked: `low_water` must be a number in `(0, 1]`.
    pub fn checked(low_water: f64, keep_recent: usize) -> Result<CachePolicy, String> {
        if !(low_water > 0.0 && low_water <= 1.0) {
            return Err(format!(
                "low_water must be a fraction of the budget in (0, 1], got {low_water}"
            ));
        }
        Ok(CachePolicy {
            low_water,
            keep_recent,
        })
    }

    /// The low-water mark of `budget` in tokens.
    pub fn mark(&self, budget: u64) -> u64 {
        // Exact for budgets below 2^53; a fraction of a token is dropped.
        ((budget as f64) * self.low_water).floor() as u64
    }
}

/// One atomic unit as [`decide`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixUnit {
    /// Position of its first item (units are ordered by it).
    pub first: usize,
    /// One past the position of its last item.
    pub end: usize,
    /// Tokens of the unit sent whole.
    pub whole: u64,
    /// Tokens of the unit sent masked (`== whole` when nothing in it can be masked).
    pub masked: u64,
    /// The unit opens a turn (its first item is a user message).
    pub opens_turn: bool,
    /// Always sent whole (new input, its tail dependency).
    pub mandatory: bool,
    /// May be sent (valid, not an input-only control); an unsendable unit is never sent.
    pub sendable: bool,
}

/// The previous decision, handed back to [`decide`] with the next history. Everything is
/// in item positions, not unit indices: a unit may grow when items are appended (a program
/// gains its output, a tool search the calls it loaded), and the prefix is the items.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefixState {
    /// First item of the cut unit (the items' count when no optional unit was kept).
    pub cut: usize,
    /// Items the previous request covered (`0..end`).
    pub end: usize,
    /// First items of the units sent masked (sorted).
    pub masked: Vec<usize>,
    /// First items of the mandatory units before the cut that the request sent (sorted).
    pub pinned: Vec<usize>,
    /// [`chain_digest`] of the items `0..cut`.
    pub before_cut: Digest,
    /// [`chain_digest`] of the items `cut..end`.
    pub kept: Digest,
}

/// A [`PrefixState`] as an embedding holds it: `(cut, end, masked, pinned, before_cut,
/// kept)`.
pub type StateParts = (usize, usize, Vec<usize>, Vec<usize>, Vec<u8>, Vec<u8>);

impl PrefixState {
    /// A state handed back by an embedding: its digests must be [`Digest`]-sized.
    pub fn from_parts(
        (cut, end, masked, pinned, before_cut, kept): StateParts,
    ) -> Result<PrefixState, String> {
        let digest = |bytes: Vec<u8>| -> Result<Digest, String> {
            bytes
                .try_into()
                .map_err(|_| "previous: a state digest must be 16 bytes".to_string())
        };
        Ok(PrefixState {
            cut,
            end,
            masked,
            pinned,
            before_cut: digest(before_cut)?,
            kept: digest(kept)?,
        })
    }

    /// The state as an embedding holds it ([`PrefixState::from_parts`] reads it back).
    pub fn into_parts(self) -> StateParts {
        let (before_cut, kept) = (self.before_cut.to_vec(), self.kept.to_vec());
        (
            self.cut,
            self.end,
            self.masked,
            self.pinned,
            before_cut,
            kept,
        )
    }
}

/// Why the decision is what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixReason {
    /// No previous decision; the history fits whole.
    FreshFits,
    /// No usable previous decision and the history does not fit whole: cut at `to`.
    FreshCut { to: usize, whole: u64, after: u64 },
    /// The previous cut and masked set still fit.
    Stayed { cut: usize },
    /// The previous cut no longer fits: moved once.
    Moved {
        from: usize,
        to: usize,
        before: u64,
        after: u64,
    },
    /// The previous state did not match the history (`why`); the decision was made fresh.
    Reset {
        why: &'static str,
        fresh: Box<PrefixReason>,
    },
}

impl PrefixReason {
    pub fn code(&self) -> &'static str {
        match self {
            PrefixReason::FreshFits => "fresh_fits",
            PrefixReason::FreshCut { .. } => "fresh_cut",
            PrefixReason::Stayed { .. } => "stayed",
            PrefixReason::Moved { .. } => "moved",
            PrefixReason::Reset { .. } => "reset",
        }
    }

    /// The reason in words, naming units by `name` (e.g. their first history position).
    pub fn describe(&self, name: &dyn Fn(usize) -> String) -> String {
        match self {
            PrefixReason::FreshFits => "no previous decision: the history fits whole".into(),
            PrefixReason::FreshCut { to, whole, after } => format!(
                "no previous decision and the history does not fit whole: cut at {}, \
                 request {whole} -> {after}",
                name(*to)
            ),
            PrefixReason::Stayed { cut } => format!("fits: cut stays at {}", name(*cut)),
            PrefixReason::Moved {
                from,
                to,
                before,
                after,
            } => format!(
                "did not fit: cut moved from {} to {}, request {before} -> {after}",
                name(*from),
                name(*to)
            ),
            PrefixReason::Reset { why, fresh } => {
                format!(
                    "previous decision ignored ({why}); {}",
                    fresh.describe(name)
                )
            }
        }
    }
}

impl fmt::Display for PrefixReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(&|u| format!("unit {u}")))
    }
}

/// The result of [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixDecision {
    pub cut: usize,
    /// Units sent, in order (mandatory ones included).
    pub kept: Vec<usize>,
    /// Units sent masked (sorted; a subset of `kept`).
    pub masked: Vec<usize>,
    /// Tokens of the request: the kept units as sent plus the reservation.
    pub request_tokens: u64,
    /// Tokens of the kept units, as sent, that the previous request sent in the same order
    /// from its start (0 without a usable previous decision).
    pub shared_tokens: u64,
    pub reason: PrefixReason,
    /// The state to hand to the next call.
    pub state: PrefixState,
}

impl PrefixDecision {
    /// The cut moved (or was set fresh) rather than stayed.
    pub fn moved(&self) -> bool {
        !matches!(self.reason, PrefixReason::Stayed { .. })
    }
}

/// Why no decision could be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixError {
    /// The mandatory units and the reservation alone exceed the budget.
    BudgetExceeded { used: u64, budget: u64 },
}

impl fmt::Display for PrefixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefixError::BudgetExceeded { used, budget } => write!(
                f,
                "mandatory input needs {used} tokens, over the budget of {budget}"
            ),
        }
    }
}

impl std::error::Error for PrefixError {}

/// The digest of the identities of `items`, in order (their count included).
pub fn chain_digest(items: &[Digest]) -> Digest {
    let mut d = Digester::new();
    d.list(items.len());
    for id in items {
        d.uint(u64::from_le_bytes(id[..8].try_into().unwrap_or([0; 8])));
        d.uint(u64::from_le_bytes(id[8..].try_into().unwrap_or([0; 8])));
    }
    d.finish()
}

/// The previous state read against the new units: unit indices of its cut, masked and
/// pinned units.
struct Previous<'s> {
    state: &'s PrefixState,
    cut: usize,
    masked: Vec<usize>,
    pinned: Vec<usize>,
}

/// The unit index of each first item in `firsts`, or `None` if one starts no unit.
fn units_starting(units: &[PrefixUnit], firsts: &[usize]) -> Option<Vec<usize>> {
    firsts
        .iter()
        .map(|&p| units.binary_search_by_key(&p, |u| u.first).ok())
        .collect()
}

/// Whether `state` describes a prefix of the items; the error says what changed.
fn check_state<'s>(
    state: &'s PrefixState,
    units: &[PrefixUnit],
    items: &[Digest],
) -> Result<Previous<'s>, &'static str> {
    if state.end > items.len() || state.cut > state.end {
        return Err("the history is shorter than the previous request");
    }
    if chain_digest(&items[..state.cut]) != state.before_cut {
        return Err("the history before the cut changed");
    }
    if chain_digest(&items[state.cut..state.end]) != state.kept {
        return Err("the history the previous request sent changed");
    }
    let cut = units.partition_point(|u| u.first < state.cut);
    // A unit before the cut may reach past it only if the request sent it (the tail
    // dependency of a new input, kept with it: its items are sent where they stand).
    let sent = |u: &PrefixUnit| u.mandatory || state.pinned.binary_search(&u.first).is_ok();
    if units[..cut].iter().any(|u| u.end > state.cut && !sent(u)) {
        return Err("a unit now spans the cut");
    }
    let masked = units_starting(units, &state.masked);
    let pinned = units_starting(units, &state.pinned);
    let (Some(masked), Some(pinned)) = (masked, pinned) else {
        return Err("the units the previous request sent were regrouped");
    };
    Ok(Previous {
        state,
        cut,
        masked,
        pinned,
    })
}

fn sum(a: u64, b: u64) -> u64 {
    a.saturating_add(b)
}

/// The units of one [`decide`] call and their reservation.
struct Plan<'a> {
    units: &'a [PrefixUnit],
    items: &'a [Digest],
    reserved: u64,
    budget: u64,
}

impl Plan<'_> {
    /// Reservation plus every mandatory unit whole.
    fn floor(&self) -> u64 {
        self.units
            .iter()
            .filter(|u| u.mandatory)
            .fold(self.reserved, |a, u| sum(a, u.whole))
    }

    fn optional(&self, i: usize) -> bool {
        let u = &self.units[i];
        u.sendable && !u.mandatory
    }

    /// Index of the opening unit of the turn holding unit `i`, if any.
    fn opener_of(&self, i: usize) -> Option<usize> {
        (0..=i).rev().find(|&j| self.units[j].opens_turn)
    }

    /// Whether the request may start its optional history at unit `c`.
    fn valid_cut(&self, c: usize) -> bool {
        if c == 0 || c >= self.units.len() || !(c..self.units.len()).any(|i| self.optional(i)) {
            return true;
        }
        let u = &self.units[c];
        u.sendable && (u.opens_turn || self.opener_of(c).is_some_and(|o| self.units[o].mandatory))
    }

    /// Index of the first unit of the `k`-th newest turn of the history (`len` for `k == 0`;
    /// 0 when there are fewer turns). A turn opened by a mandatory unit (the new input's user
    /// message) is not counted: it is sent whole anyway.
    fn recent_start(&self, k: usize) -> usize {
        if k == 0 {
            return self.units.len();
        }
        let mut seen = 0;
        for i in (0..self.units.len()).rev() {
            if self.units[i].opens_turn && !self.units[i].mandatory {
                seen += 1;
                if seen == k {
                    return i;
                }
            }
        }
        0
    }

    /// The units sent for `cut` with `masked(i)`, and the request's tokens.
    fn request(
        &self,
        cut: usize,
        pinned: &[usize],
        masked: &dyn Fn(usize) -> bool,
    ) -> (Vec<usize>, u64) {
        let mut kept = Vec::new();
        let mut tokens = self.reserved;
        for (i, u) in self.units.iter().enumerate() {
            if u.mandatory || (i >= cut && u.sendable) || pinned.binary_search(&i).is_ok() {
                kept.push(i);
                let as_sent = if !u.mandatory && masked(i) {
                    u.masked
                } else {
                    u.whole
                };
                tokens = sum(tokens, as_sent);
            }
        }
        (kept, tokens)
    }

    /// Request tokens for every cut `c` (index `c`, plus `len`) when units at or after
    /// `recent` go whole and older optional ones masked.
    fn suffix_costs(&self, recent: usize, floor: u64) -> Vec<u64> {
        let n = self.units.len();
        let mut out = vec![floor; n + 1];
        for i in (0..n).rev() {
            let u = &self.units[i];
            let add = if self.optional(i) {
                if i >= recent {
                    u.whole
                } else {
                    u.masked.min(u.whole)
                }
            } else {
                0
            };
            out[i] = sum(out[i + 1], add);
        }
        out
    }

    /// The fresh cut and the start of the units kept whole: the lowest valid cut whose
    /// request reaches `mark`, masking what is older than the newest `keep_recent` turns
    /// first; `None` when no cut reaches the mark.
    fn cut_to_mark(&self, policy: CachePolicy, mark: u64, floor: u64) -> Option<(usize, usize)> {
        for k in (0..=policy.keep_recent).rev() {
            let recent = self.recent_start(k);
            let costs = self.suffix_costs(recent, floor);
            let limit = recent.min(self.units.len());
            if let Some(c) = (0..=limit).find(|&c| self.valid_cut(c) && costs[c] <= mark) {
                return Some((c, recent));
            }
        }
        None
    }

    /// A fresh decision: everything whole if it fits, else the cut moved to the mark.
    fn fresh(&self, policy: CachePolicy) -> (usize, usize, u64) {
        let n = self.units.len();
        let floor = self.floor();
        let whole = self.suffix_costs(0, floor)[0];
        if whole <= self.budget {
            return (0, 0, whole);
        }
        let mark = policy.mark(self.budget);
        if let Some((c, recent)) = self.cut_to_mark(policy, mark, floor) {
            return (c, recent, whole);
        }
        // The mark cannot be reached: everything optional masked, the lowest cut that fits.
        let costs = self.suffix_costs(n, floor);
        let c = (0..=n)
            .find(|&c| self.valid_cut(c) && costs[c] <= self.budget)
            .unwrap_or(n);
        (c, n, whole)
    }
}

/// Decide the cut and masked set of one request (see the module note).
///
/// `units` are the request's atomic units, ordered by their first item (history, then the
/// units holding new input, which are `mandatory`); `items` the identities of the items
/// (history then new input; a digest of each); `reserved` is what the request takes besides
/// the units (output reserve, context message); `previous` is the state of the last
/// decision for this session.
pub fn decide(
    previous: Option<&PrefixState>,
    units: &[PrefixUnit],
    items: &[Digest],
    reserved: u64,
    budget: u64,
    policy: CachePolicy,
) -> Result<PrefixDecision, PrefixError> {
    let plan = Plan {
        units,
        items,
        reserved,
        budget,
    };
    let floor = plan.floor();
    if floor > budget {
        return Err(PrefixError::BudgetExceeded {
            used: floor,
            budget,
        });
    }
    let checked = previous.map(|s| check_state(s, units, items));
    if let Some(Ok(prev)) = &checked {
        let was_masked = |i: usize| prev.masked.binary_search(&i).is_ok();
        let (kept, tokens) = plan.request(prev.cut, &prev.pinned, &was_masked);
        if tokens <= budget {
            let masked = masked_of(&plan, &kept, &was_masked);
            let reason = PrefixReason::Stayed { cut: prev.cut };
            return Ok(finish(
                &plan,
                Some(prev),
                prev.cut,
                kept,
                masked,
                tokens,
                reason,
            ));
        }
        let (cut, recent, _) = plan.fresh(policy);
        let (kept, after) = plan.request(cut, &[], &|i| i < recent);
        let masked = masked_of(&plan, &kept, &|i| i < recent);
        let reason = PrefixReason::Moved {
            from: prev.cut,
            to: cut,
            before: tokens,
            after,
        };
        return Ok(finish(&plan, Some(prev), cut, kept, masked, after, reason));
    }
    let (cut, recent, whole) = plan.fresh(policy);
    let (kept, after) = plan.request(cut, &[], &|i| i < recent);
    let masked = masked_of(&plan, &kept, &|i| i < recent);
    let mut reason = if recent == 0 && cut == 0 {
        PrefixReason::FreshFits
    } else {
        PrefixReason::FreshCut {
            to: cut,
            whole,
            after,
        }
    };
    if let Some(Err(why)) = checked {
        reason = PrefixReason::Reset {
            why,
            fresh: Box::new(reason),
        };
    }
    // A state that does not match shares nothing that can be proven.
    Ok(finish(&plan, None, cut, kept, masked, after, reason))
}

/// The kept optional units that `masked(i)` masks and that are cheaper masked.
fn masked_of(plan: &Plan<'_>, kept: &[usize], masked: &dyn Fn(usize) -> bool) -> Vec<usize> {
    kept.iter()
        .copied()
        .filter(|&i| {
            let u = &plan.units[i];
            !u.mandatory && masked(i) && u.masked < u.whole
        })
        .collect()
}

/// The units the previous request sent, in order, with whether each was masked.
fn sent_by(plan: &Plan<'_>, prev: &Previous<'_>) -> Vec<(usize, bool)> {
    let mut out: Vec<(usize, bool)> = prev.pinned.iter().map(|&u| (u, false)).collect();
    let end = plan.units.partition_point(|u| u.first < prev.state.end);
    out.extend(
        (prev.cut..end)
            .filter(|&i| plan.units[i].sendable)
            .map(|i| {
                let masked = prev.masked.binary_search(&i).is_ok();
                (i, masked)
            }),
    );
    out
}

fn finish(
    plan: &Plan<'_>,
    previous: Option<&Previous<'_>>,
    cut: usize,
    kept: Vec<usize>,
    masked: Vec<usize>,
    request_tokens: u64,
    reason: PrefixReason,
) -> PrefixDecision {
    let is_masked = |i: usize| masked.binary_search(&i).is_ok();
    // Whole units only: a unit that grew since (its new items appended) counts nothing.
    let shared_tokens = previous.map_or(0, |prev| {
        let before = sent_by(plan, prev);
        let mut shared = 0u64;
        for (&(p, pm), &k) in before.iter().zip(&kept) {
            let u = &plan.units[k];
            if p != k || pm != is_masked(k) || u.end > prev.state.end {
                break;
            }
            shared = sum(shared, if pm { u.masked } else { u.whole });
        }
        shared
    });
    let n = plan.items.len();
    let first = |i: usize| plan.units.get(i).map_or(n, |u| u.first.min(n));
    let cut_item = first(cut);
    let state = PrefixState {
        cut: cut_item,
        end: n,
        pinned: kept
            .iter()
            .filter(|&&i| i < cut)
            .map(|&i| first(i))
            .collect(),
        before_cut: chain_digest(&plan.items[..cut_item]),
        kept: chain_digest(&plan.items[cut_item..]),
        masked: masked.iter().map(|&i| first(i)).collect(),
    };
    PrefixDecision {
        cut,
        kept,
        masked,
        request_tokens,
        shared_tokens,
        reason,
        state,
    }
}

/// A decision over JSON items ([`plan_prefix_values`]), in item positions.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixPlan {
    pub decision: PrefixDecision,
    /// History positions sent, in order.
    pub kept_history: Vec<usize>,
    /// Masked copies of the history items sent masked, as `(position, copy)`.
    pub copies: MaskedCopies,
    /// The first history position of each unit (`n_history` for a unit of new input only).
    pub unit_starts: Vec<usize>,
    pub n_history: usize,
}

impl PrefixPlan {
    /// The first history position of the cut unit (`None`: the cut is in the new input).
    pub fn cut_position(&self) -> Option<usize> {
        let cut = self.decision.cut;
        self.unit_starts
            .get(cut)
            .copied()
            .filter(|&p| p < self.n_history)
    }

    /// The reason in words, naming units by their first history position.
    pub fn describe(&self) -> String {
        let starts = &self.unit_starts;
        let n = self.n_history;
        self.decision.reason.describe(&|u| match starts.get(u) {
            Some(&p) if p < n => format!("history[{p}]"),
            _ => "the new input".to_string(),
        })
    }
}

/// A [`PrefixPlan`] as an embedding returns it: `(kept_history, copies, request_tokens,
/// shared_tokens, reason_code, reason, cut_position, state)`, the copies converted by `C`.
pub type PlanParts<C> = (
    Vec<usize>,
    Vec<(usize, C)>,
    u64,
    u64,
    &'static str,
    String,
    Option<usize>,
    StateParts,
);

impl PrefixPlan {
    /// The plan as an embedding returns it, each masked copy converted by `convert`.
    pub fn into_parts<C, E>(
        self,
        convert: impl Fn(&serde_json::Value) -> Result<C, E>,
    ) -> Result<PlanParts<C>, E> {
        let (reason, cut_position) = (self.describe(), self.cut_position());
        let copies = self.copies.iter().map(|(p, v)| Ok((*p, convert(v)?)));
        let d = self.decision;
        Ok((
            self.kept_history,
            copies.collect::<Result<_, E>>()?,
            d.request_tokens,
            d.shared_tokens,
            d.reason.code(),
            reason,
            cut_position,
            d.state.into_parts(),
        ))
    }
}

/// The options of one [`plan_prefix_values`] call as an embedding passes them, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixCall {
    pub opts: PackOptions,
    pub excerpt_tokens: u64,
    pub policy: CachePolicy,
}

impl PrefixCall {
    /// The call's options: `low_water` ([`CachePolicy::checked`]) and `excerpt_tokens`
    /// ([`crate::mask::Masking::checked`]) are checked, in that order.
    pub fn checked(
        (budget, output_reserve, context_tokens): (u64, u64, u64),
        low_water: f64,
        keep_recent: usize,
        excerpt_tokens: u64,
    ) -> Result<PrefixCall, String> {
        let policy = CachePolicy::checked(low_water, keep_recent)?;
        crate::mask::Masking::checked(excerpt_tokens, None)?;
        let opts = PackOptions {
            budget,
            output_reserve,
            context_tokens,
            ..PackOptions::default()
        };
        Ok(PrefixCall {
            opts,
            excerpt_tokens,
            policy,
        })
    }

    /// [`plan_prefix_values`] with these options.
    pub fn plan(
        &self,
        (history, new_input): (&[serde_json::Value], &[serde_json::Value]),
        encoding: crate::tokens::Encoding,
        previous: Option<&PrefixState>,
    ) -> Result<PrefixPlan, PackError> {
        let (opts, excerpt) = (&self.opts, self.excerpt_tokens);
        plan_prefix_values(
            history,
            new_input,
            encoding,
            opts,
            excerpt,
            self.policy,
            previous,
        )
    }
}

/// Classify the items (history then new input), naming the item that cannot be read.
fn classify_values(
    all: &[&serde_json::Value],
    n_history: usize,
) -> Result<Vec<crate::items::ItemMeta>, PackError> {
    all.iter()
        .enumerate()
        .map(|(p, v)| {
            let raw = crate::items::RawItem::from_json(v).map_err(|e| PackError::Item {
                position: p,
                label: crate::graph::position_label(n_history, p),
                field: e.field.clone(),
                message: e.message.clone(),
            })?;
            Ok(crate::items::classify(&raw))
        })
        .collect()
}

fn item_error(n_history: usize) -> impl Fn(crate::pack::CostFailure) -> PackError {
    move |f| PackError::Item {
        label: crate::graph::position_label(n_history, f.position),
        position: f.position,
        field: f.field,
        message: f.message,
    }
}

/// The units of `graph` as [`decide`] sees them: whole costs of every unit, masked costs of
/// the optional units holding a tool output (the only ones a mask can make cheaper).
fn prefix_units<C: CostSource + crate::mask::ValueSource>(
    graph: &crate::graph::Graph,
    metas: &[crate::items::ItemMeta],
    costs: &mut crate::mask::MaskedCosts<'_, C>,
) -> Result<Vec<PrefixUnit>, PackError> {
    let error = item_error(graph.n_history);
    let total = |c: Vec<u64>| c.iter().fold(0u64, |a, &c| sum(a, c));
    let mut units = Vec::with_capacity(graph.units.len());
    for unit in &graph.units {
        let whole = total(costs.costs(&unit.members).map_err(&error)?);
        let mandatory = unit.contains_new;
        let sendable = unit.is_valid() && !unit.is_input_only();
        let maskable = unit
            .members
            .iter()
            .any(|&p| crate::mask::maskable(metas[p].kind));
        let masked = if mandatory || !sendable || !maskable {
            whole
        } else {
            total(costs.masked_costs(&unit.members).map_err(&error)?)
        };
        units.push(PrefixUnit {
            first: unit.members.first().copied().unwrap_or(0),
            end: unit.members.last().map_or(0, |&p| p + 1),
            whole,
            masked,
            opens_turn: unit
                .members
                .first()
                .is_some_and(|&p| metas[p].is_user_message()),
            mandatory,
            sendable,
        });
    }
    Ok(units)
}

/// [`PrefixError::BudgetExceeded`] as the pack names it: the section that overflowed.
fn budget_error(e: PrefixError, opts: &PackOptions) -> PackError {
    let PrefixError::BudgetExceeded { used, budget } = e;
    let mandatory = used.saturating_sub(sum(opts.output_reserve, opts.context_tokens));
    let section = if mandatory > budget {
        Section::NewInput
    } else if sum(mandatory, opts.output_reserve) > budget {
        Section::OutputReserve
    } else {
        Section::Context
    };
    PackError::BudgetExceeded {
        used,
        budget,
        section,
    }
}

/// Classify, group and cost JSON items, then [`decide`] (masking with `excerpt_tokens`).
/// `opts.policy` is not used (the decision is its own); `opts.context_tokens` and
/// `opts.output_reserve` are the reservation.
pub fn plan_prefix_values(
    history: &[serde_json::Value],
    new_input: &[serde_json::Value],
    encoding: crate::tokens::Encoding,
    opts: &PackOptions,
    excerpt_tokens: u64,
    policy: CachePolicy,
    previous: Option<&PrefixState>,
) -> Result<PrefixPlan, PackError> {
    let n_history = history.len();
    let all: Vec<&serde_json::Value> = history.iter().chain(new_input.iter()).collect();
    let metas = classify_values(&all, n_history)?;
    let graph = crate::graph::build_graph(&metas[..n_history], &metas[n_history..]);
    crate::pack::check_new_input(GraphView::whole(&graph))?;
    let mut source = JsonCostSource::new(all.clone(), encoding);
    let kinds = |p: usize| metas[p].kind;
    let mut masked_costs =
        crate::mask::MaskedCosts::new(&mut source, encoding, excerpt_tokens).with_kinds(&kinds);
    let units = prefix_units(&graph, &metas, &mut masked_costs)?;
    let items: Vec<Digest> = all.iter().map(|v| crate::digest::value_digest(v)).collect();
    let reserved = sum(opts.output_reserve, opts.context_tokens);
    let decision = decide(previous, &units, &items, reserved, opts.budget, policy)
        .map_err(|e| budget_error(e, opts))?;
    let masked_members: Vec<&[usize]> = decision
        .masked
        .iter()
        .map(|&u| graph.units[u].members.as_slice())
        .collect();
    let fields = masked_costs
        .copies(&masked_members)
        .map_err(item_error(n_history))?;
    let copies = fields
        .into_iter()
        .map(|(p, f)| (p, f.apply(&history[p])))
        .collect();
    let mut kept_history: Vec<usize> = decision
        .kept
        .iter()
        .flat_map(|&u| graph.units[u].members.iter().copied())
        .filter(|&p| p < n_history)
        .collect();
    kept_history.sort_unstable();
    let unit_starts = graph
        .units
        .iter()
        .map(|u| {
            u.members
                .first()
                .copied()
                .unwrap_or(n_history)
                .min(n_history)
        })
        .collect();
    Ok(PrefixPlan {
        decision,
        kept_history,
        copies,
        unit_starts,
        n_history,
    })
}
