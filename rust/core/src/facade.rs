//! The core façade of an embedding's `HistoryIndex` methods: one call per method runs
//! everything between the embedding's arguments and its result (the cost engine and the
//! count store, the tail and the view, the thinking rule, the masked or unmasked pack, the
//! decision rows, and the order in which failures are reported), so that a binding only
//! converts its values and calls.
//!
//! The call back into the embedding: a façade call reads what it needs through the
//! [`ItemSource`] (items by position, one batch per call), the [`CountStore`] (stored counts)
//! and the context hook ([`ContextHook`]) it is handed, each a callback the embedding answers
//! under its own lock (the Python binding: with the GIL, while the façade runs without it).
//! Nothing else calls out.
//!
//! The options of a call are one checked value, [`CallOptions`] (module [`crate::options`]:
//! the rules of each field, the defaults, the cost basis of a model, the thinking rule).

use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use crate::costs::{CostEngine, CostFailure, CountStore, ItemSource, StoreTally};
use crate::decisions::{decision_of, DecisionRows};
use crate::graph::position_label;
use crate::incremental::{Cut, Window};
use crate::indexed::{cost_over, lock, HistoryMark, IndexedHistory, KindNames};
use crate::items::ItemMeta;
use crate::pack::{ContextHook, PackError, UnitDecision};
use crate::pipeline::{
    counted_window, earlier_thinking_free, pack_indexed, run_blocking, Blocking, PackFailure,
    Packed,
};
use crate::tokens::{CostBasis, Loading, TokenError};

pub use crate::options::{CallOptions, FieldError, FieldValue, Int, OptionsError};

/// Why a façade call ended without a value, after the count store's own failure (which the
/// embedding's store keeps: it comes first). A tokenizer failure comes before the others.
#[derive(Debug)]
pub enum CallFailure {
    /// The tokenizer failed on the text of the item at `position`.
    Tokenizer { position: usize, error: TokenError },
    /// The packer's error (a failed context hook: [`PackError::Context`]).
    Pack(PackError),
    /// An item could not be read or costed (the embedding's item source may keep why).
    Item(CostFailure),
}

impl CallFailure {
    /// The failure as an embedding reports it, its positions labelled for `n_history`: a
    /// tokenizer failure's message names the item; an item that could not be read or
    /// costed is the packer's error for it ([`item_failure`]).
    pub fn labelled(self, n_history: usize) -> CallError {
        match self {
            CallFailure::Tokenizer { position, error } => {
                CallError::Tokenizer(format!("{}: {error}", position_label(n_history, position)))
            }
            CallFailure::Pack(e) => CallError::Pack(e),
            CallFailure::Item(f) => CallError::Pack(item_failure(n_history, f)),
        }
    }
}

/// A [`CallFailure`] as an embedding reports it ([`CallFailure::labelled`]).
#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    /// The tokenizer failed: the message names the item.
    Tokenizer(String),
    Pack(PackError),
}

/// A cost failure as the packer's error for the item, labelled for `n_history`.
pub fn item_failure(n_history: usize, f: CostFailure) -> PackError {
    PackError::Item {
        label: position_label(n_history, f.position),
        position: f.position,
        field: f.field,
        message: f.message,
    }
}

/// The end of a façade call: its value or failure, and what it hands back (the item source,
/// the count store with what the call did with it). Positions in failures are labelled for
/// `n_history`.
pub struct CallEnd<T, F, S> {
    pub outcome: Result<T, CallFailure>,
    pub items: F,
    pub store: Option<(S, StoreTally)>,
    pub n_history: usize,
}

/// How a failed call ends as an embedding raises it ([`CallEnd::finish`]), `E` being the
/// embedding's own failures (Python exceptions): the count store's own failure comes first,
/// then a tokenizer failure (its message names the item), then the call's error (for a
/// failed context hook, the hook's own failure, `Raised`) chained to the failure behind the
/// item that could not be read (`cause`).
#[derive(Debug)]
pub enum Ending<E> {
    Store(E),
    Tokenizer(String),
    Raised { error: E, cause: Option<E> },
    Pack { error: PackError, cause: Option<E> },
}

/// A call's value with what it hands back: the item source, and the count store with what
/// the call did with it.
pub type Finished<T, F, S> = (T, F, Option<(S, StoreTally)>);

impl<T, F, S> CallEnd<T, F, S> {
    /// The call's value with what it hands back, or how it ends ([`Ending`]): `store_failure`
    /// takes the count store's own failure out of it, `item_cause` the failure behind the
    /// item that could not be read out of the item source, and `hook` is the failure of the
    /// context hook, if it failed.
    pub fn finish<E>(
        self,
        store_failure: impl FnOnce(&mut S) -> Option<E>,
        item_cause: impl FnOnce(&mut F) -> Option<E>,
        hook: Option<E>,
    ) -> Result<Finished<T, F, S>, Ending<E>> {
        let CallEnd {
            outcome,
            mut items,
            mut store,
            n_history,
        } = self;
        if let Some(e) = store.as_mut().and_then(|(s, _)| store_failure(s)) {
            return Err(Ending::Store(e));
        }
        let failure = match outcome {
            Ok(value) => return Ok((value, items, store)),
            Err(f) => f.labelled(n_history),
        };
        Err(match (failure, hook) {
            (CallError::Tokenizer(m), _) => Ending::Tokenizer(m),
            (_, Some(error)) => Ending::Raised {
                error,
                cause: item_cause(&mut items),
            },
            (CallError::Pack(error), None) => Ending::Pack {
                error,
                cause: item_cause(&mut items),
            },
        })
    }
}

/// Finish `engine`: `outcome`, unless it failed and the tokenizer failed (the engine's
/// failure, else `masked`), which is then the failure.
fn settle<T, F: ItemSource, S: CountStore>(
    engine: CostEngine<'_, F, S>,
    n_history: usize,
    outcome: Result<T, CallFailure>,
    masked: Option<(usize, TokenError)>,
) -> CallEnd<T, F, S> {
    let tokenizer = engine
        .tokenizer_failure()
        .map(|(p, e)| (p, e.clone()))
        .or(masked);
    let (items, store) = engine.finish();
    let outcome = match (outcome, tokenizer) {
        (Err(_), Some((position, error))) => Err(CallFailure::Tokenizer { position, error }),
        (outcome, _) => outcome,
    };
    CallEnd {
        outcome,
        items,
        store,
        n_history,
    }
}

/// How a pack used the index: items held before the call, items it appended, the first
/// position whose units were rebuilt, and why there (the relation that moved it back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexUse {
    pub held: usize,
    pub appended: usize,
    pub regrouped_from: usize,
    pub why: Option<String>,
}

/// What [`IndexedHistory::pack_call`] packed, with what the embedding reports of it.
#[derive(Debug)]
pub struct PackCall {
    pub packed: Packed,
    pub index_use: IndexUse,
    /// How many items the thinking rule made free.
    pub earlier_thinking_free: usize,
    /// The pack's per-unit decisions (the result's `touched` taken into it).
    pub decisions: DecisionReport,
}

/// One plain value of a pack's report ([`PackCall::report`]), as an embedding converts it.
#[derive(Debug, Clone, PartialEq)]
pub enum ReportValue<'a> {
    Positions(&'a [usize]),
    Count(u64),
    Name(&'static str),
    Factor(f64),
    /// How the pack used the index: `(held, appended, regrouped_from, why)`.
    Index(&'a IndexUse),
    /// Where the fill first missed: `(unit, tokens left, cause code)`.
    Stop(Option<(usize, u64, &'static str)>),
}

impl PackCall {
    /// The plain values of the pack's result by name, in its order: the kept and dependency
    /// positions, the token totals (`used` and `remaining` worked out), the cost basis and
    /// policy of `options`, the masking saved, where the fill stopped, how the index was
    /// used, the thinking rule and what it made free, and the reasoning left out of masked
    /// units. The decisions ([`PackCall::decisions`]) and the request (the kept history's
    /// items, then the new input, edited by [`Packed::request_edits`]) are the embedding's
    /// to add.
    pub fn report(&self, options: &CallOptions) -> Vec<(&'static str, ReportValue<'_>)> {
        use ReportValue::{Count, Factor, Index, Name, Positions, Stop};
        let r = &self.packed.result;
        let stop = r.stop.map(|s| (s.unit, s.left, s.cause.code()));
        vec![
            ("kept_history", Positions(&r.kept_history)),
            ("dependency", Positions(&r.dependency)),
            ("new_input_tokens", Count(r.new_input_tokens)),
            ("dependency_tokens", Count(r.dependency_tokens)),
            ("history_tokens", Count(r.history_tokens)),
            ("context_tokens", Count(r.context_tokens)),
            ("output_reserve", Count(r.output_reserve)),
            ("budget", Count(r.budget)),
            ("used", Count(r.used())),
            ("remaining", Count(r.remaining())),
            ("encoding", Name(options.basis.encoding.name())),
            ("opaque_scale", Factor(options.basis.opaque_scale.factor())),
            ("policy", Name(options.pack.policy.name())),
            ("masking_saved", Count(r.masking_saved)),
            ("stop", Stop(stop)),
            ("index", Index(&self.index_use)),
            ("thinking_rule", Name(options.thinking_rule())),
            (
                "earlier_thinking_free",
                Count(self.earlier_thinking_free as u64),
            ),
            ("omitted_reasoning", Positions(&self.packed.omitted)),
        ]
    }
}

/// Where the items of a pack stand: the index held `held` items when the call began, the
/// call appended `appended` (its history is now indexed whole), which regrouped units from
/// `regrouped` on.
#[derive(Debug, Clone, Copy)]
pub struct Appended {
    pub held: usize,
    pub appended: usize,
    pub regrouped: Option<Cut>,
}

impl IndexedHistory {
    /// Begin a call with `options`: a mark to [`IndexedHistory::undo`] it by, the costs (and
    /// with masking, the masked costs) switched to the call's basis.
    pub fn begin_call(&mut self, options: &CallOptions) -> HistoryMark {
        let mut mark = self.mark();
        self.switch_costs(options.basis, &mut mark);
        if let Some(m) = options.masking {
            self.switch_masks(options.basis, m.excerpt_tokens, &mut mark);
        }
        mark
    }

    /// Run `call` as one call with `options` ([`IndexedHistory::begin_call`]): when it fails,
    /// the index is put back as it was before it ([`IndexedHistory::undo`], run through
    /// `blocking`).
    pub fn within_call<R, E>(
        &mut self,
        options: &CallOptions,
        blocking: Blocking<'_>,
        call: impl FnOnce(&mut Self) -> Result<R, E>,
    ) -> Result<R, E> {
        let mark = self.begin_call(options);
        let outcome = call(self);
        if outcome.is_err() {
            run_blocking(blocking, || self.undo(mark));
        }
        outcome
    }

    /// Append `total` fresh history items classified by `classify` (see
    /// [`IndexedHistory::append_classified`]): where the call's items stand then.
    pub fn append_fresh<E>(
        &mut self,
        total: usize,
        classify: impl FnMut(usize, usize) -> Result<Vec<ItemMeta>, E>,
        blocking: Blocking<'_>,
    ) -> Result<Appended, E> {
        let held = self.len();
        self.take_regrouped();
        self.append_classified(total, classify, blocking)?;
        Ok(Appended {
            held,
            appended: self.len() - held,
            regrouped: self.take_regrouped(),
        })
    }

    /// One pack of the indexed history (indexed whole, see [`IndexedHistory::append_fresh`])
    /// followed by `new_input`, over `items` (and `store`), with `options`: the tail and its
    /// view, the thinking rule, the masked or unmasked pack ([`pack_indexed`]) and the
    /// decision rows, behind one call. `preload` (the encoding's build) is waited for
    /// before anything is counted. The only calls out are `items`, `store` and `context`.
    ///
    /// With a `store`, long texts' counts are looked up in it before they are tokenised (the
    /// embedding returns the store's tally: `(key, tokens)` pairs to write, and hits). With
    /// `options.history_offset`, `items` holds the history from that position on (a windowed
    /// read, see [`IndexedHistory::window_call`]): the positions before it must be indexed,
    /// and the pack must not need their items (the item error names the first one it would).
    #[allow(clippy::too_many_arguments)]
    pub fn pack_call<F: ItemSource, S: CountStore>(
        &mut self,
        items: F,
        store: Option<S>,
        options: &CallOptions,
        new_input: &[ItemMeta],
        appended: Appended,
        preload: Loading,
        context: Option<ContextHook<'_>>,
    ) -> CallEnd<PackCall, F, S> {
        let n_history = self.len();
        let (index, costs, masks) = self.graph_costs_and_masks();
        let mut engine = CostEngine::new(items, options.basis)
            .with_memo(costs, n_history)
            .with_store(store);
        let tail = index.tail(new_input);
        preload.wait();
        let view = index.view(&tail);
        let free = earlier_thinking_free(index, new_input, n_history, options.strips_thinking);
        let earlier_free = free.len();
        let (packed, masked) = pack_indexed(
            index,
            view,
            &mut engine,
            masks,
            options.basis,
            &options.pack,
            options.masking,
            &options.pinned,
            new_input,
            free,
            options.omit_reasoning,
            context,
        );
        let packed = packed.map_err(|f| match f {
            PackFailure::Pack(e) => CallFailure::Pack(e),
            PackFailure::Item(f) => CallFailure::Item(f),
        });
        let CallEnd {
            outcome,
            items,
            store,
            ..
        } = settle(engine, n_history, packed, masked);
        let outcome = outcome.map(|packed| {
            let (from, pull) = match appended.regrouped {
                Some(a) if a.position < tail.cut => (a.position, a.pull),
                _ => (tail.cut, tail.pull),
            };
            let index_use = IndexUse {
                held: appended.held,
                appended: appended.appended,
                regrouped_from: from,
                why: pull.map(|p| p.describe(n_history)),
            };
            let mut packed = packed;
            let touched = std::mem::take(&mut packed.result.touched);
            let rows = self.decision_rows(Some(tail));
            PackCall {
                packed,
                index_use,
                earlier_thinking_free: earlier_free,
                decisions: DecisionReport::new(rows, touched, self.kind_names()),
            }
        });
        CallEnd {
            outcome,
            items,
            store,
            n_history,
        }
    }

    /// Where a read of the history may start for a pack with `options` and `budget`, the
    /// indexed history followed by `tail` (items appended since it was indexed, then the new
    /// input; positions from `n_history` on are new input), as the embedding reports it: a
    /// read of the history from `start` on packs to the same request
    /// ([`crate::incremental::GraphIndex::window`]).
    /// A cost not counted yet, or counted under another encoding or calibration, counts as an
    /// item's overhead, which only moves the start earlier; with masking, a tool output counts
    /// at most its masked cost ([`IndexedHistory::window_masked`]). The report says whether
    /// the budget reaches the oldest unit (`fits`), the relation that moved the start back
    /// last (`tie`, `why`), and how far back the budget alone reaches (`reach`).
    pub fn window_call(
        &self,
        tail: &[ItemMeta],
        budget: u64,
        options: &CallOptions,
        n_history: usize,
    ) -> WindowReport {
        let w: Window = self.window_masked(tail, budget, options.basis, options.masking);
        WindowReport {
            start: w.start,
            fits: w.fits,
            tie: w.pull.map(|p| p.tie.code()),
            why: w.pull.map(|p| p.describe(n_history)),
            reach: w.reach,
        }
    }

    /// Count the costs a later window start with `budget` walks over, so that it finds the
    /// window from exact costs rather than lower bounds (the history from
    /// `options.history_offset` on, read through `items`, positions before it keeping their
    /// lower bound; with masking, the masked costs of the units walked too, for a window with
    /// the same masking): the window start ([`counted_window`]).
    pub fn count_window_call<F: ItemSource, S: CountStore>(
        &mut self,
        items: F,
        store: Option<S>,
        options: &CallOptions,
        budget: u64,
    ) -> CallEnd<usize, F, S> {
        let n = self.len();
        let (index, costs, masks) = self.graph_costs_and_masks();
        let mut engine = CostEngine::new(items, options.basis)
            .with_memo(costs, n)
            .with_store(store);
        let (basis, masking, offset) = (options.basis, options.masking, options.history_offset);
        let (walked, masked) =
            counted_window(index, &mut engine, masks, basis, masking, n, budget, offset);
        settle(engine, n, walked.map_err(CallFailure::Item), masked)
    }

    /// Whether the indexed history followed by `appended` items (read through `items`, the
    /// indexed ones' costs kept) costs more than `limit` under `basis` ([`cost_over`]):
    /// `(sum so far, exceeded)`, summed newest first: costs the index knows are reused, the
    /// others counted (and kept for the indexed positions); the walk stops once past `limit`.
    /// Positions are labelled as history throughout.
    pub fn cost_over_call<F: ItemSource, S: CountStore>(
        &mut self,
        items: F,
        basis: CostBasis,
        appended: usize,
        limit: u64,
    ) -> CallEnd<(u64, bool), F, S> {
        let n = self.len();
        let total = n + appended;
        let (_, costs) = self.graph_and_costs();
        let mut engine = CostEngine::new(items, basis).with_memo(costs, n);
        let walked = cost_over(&mut engine, total, limit).map_err(CallFailure::Item);
        settle(engine, total, walked, None)
    }
}

/// [`IndexedHistory::window_call`]'s answer: the start, whether the budget reaches the
/// oldest unit, the relation that moved the start back last (its code and a sentence), and
/// how far back the budget alone reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowReport {
    pub start: usize,
    pub fits: bool,
    pub tie: Option<&'static str>,
    pub why: Option<String>,
    pub reach: usize,
}

/// One pack's per-unit decisions as an embedding reads them. Only what the fill touched is
/// stored; a row is derived from the (shared) rows when it is read, so a pack over a long
/// history allocates nothing per unit (the index detaches the rows before it changes,
/// [`IndexedHistory::release_results`]).
#[derive(Debug)]
pub struct DecisionReport {
    rows: usize,
    source: Arc<Mutex<DecisionRows>>,
    touched: FxHashMap<usize, UnitDecision>,
    kind_names: Vec<&'static str>,
}

/// One row of a [`DecisionReport`]: the unit, its history positions and their kinds, its
/// decision's code and tokens, its problems (`(code, message, label)`) and masked tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportRow {
    pub unit: usize,
    pub positions: Vec<usize>,
    pub kinds: Vec<&'static str>,
    pub code: &'static str,
    pub tokens: Option<u64>,
    pub problems: Vec<(&'static str, &'static str, String)>,
    pub masked_tokens: Option<u64>,
}

/// A [`ReportRow`] in its fields' order, as an embedding hands it out:
/// `(unit, positions, kinds, code, tokens, problems, masked_tokens)`.
pub type RowTuple = (
    usize,
    Vec<usize>,
    Vec<&'static str>,
    &'static str,
    Option<u64>,
    Vec<(&'static str, &'static str, String)>,
    Option<u64>,
);

impl ReportRow {
    pub fn into_tuple(self) -> RowTuple {
        (
            self.unit,
            self.positions,
            self.kinds,
            self.code,
            self.tokens,
            self.problems,
            self.masked_tokens,
        )
    }
}

impl DecisionReport {
    /// The report of a pack whose fill recorded `touched`, reading its rows from `source`
    /// ([`IndexedHistory::decision_rows`]).
    pub fn new(
        source: Arc<Mutex<DecisionRows>>,
        touched: FxHashMap<usize, UnitDecision>,
        kind_names: &KindNames,
    ) -> Self {
        let rows = lock(&source).rows();
        DecisionReport {
            rows,
            source,
            touched,
            kind_names: kind_names.names().to_vec(),
        }
    }

    /// Number of rows (units with history members).
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Row `i`, if there is one.
    pub fn row(&self, i: usize) -> Option<ReportRow> {
        if i >= self.rows {
            return None;
        }
        let (row, n_history) = {
            let source = lock(&self.source);
            (source.row(i), source.n_history())
        };
        let d = decision_of(&self.touched, i, row.untouched);
        Some(ReportRow {
            unit: i,
            kinds: row
                .kinds
                .iter()
                .map(|&k| self.kind_names[k as usize])
                .collect(),
            positions: row.positions,
            code: d.decision.code(),
            tokens: d.tokens,
            problems: row
                .problems
                .iter()
                .map(|p| {
                    (
                        p.reason.code(),
                        p.reason.message(),
                        position_label(n_history, p.position),
                    )
                })
                .collect(),
            masked_tokens: d.masked_tokens,
        })
    }

    /// Number of history items per decision code.
    pub fn item_counts(&self) -> FxHashMap<&'static str, usize> {
        lock(&self.source).tally(&self.touched, |n| n)
    }

    /// Number of units (with history members) per decision code.
    pub fn unit_counts(&self) -> FxHashMap<&'static str, usize> {
        lock(&self.source).tally(&self.touched, |n| usize::from(n > 0))
    }
}
