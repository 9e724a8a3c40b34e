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
//! The options of a call are one checked value, [`CallOptions`]: an embedding checks the
//! types of its own values and sets them here; the rules (defaults, the cost basis of a
//! model, the thinking rule) are this module's.

use std::sync::{Arc, Mutex};

use crate::costs::{CostEngine, CostFailure, CountStore, ItemSource, StoreTally};
use crate::decisions::DecisionRows;
use crate::incremental::Cut;
use crate::indexed::{cost_over, HistoryMark, IndexedHistory};
use crate::items::ItemMeta;
use crate::mask::Masking;
use crate::pack::{ContextHook, PackError, PackOptions};
use crate::pipeline::{counted_window, earlier_thinking_free, pack_indexed, PackFailure, Packed};
use crate::tokens::{
    strips_earlier_thinking, CostBasis, Encoding, Loading, OpaqueScale, TokenError,
};

/// The options of a pack (and of the index calls that take them), checked when each is set.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOptions {
    /// Budget, reservations and policy.
    pub pack: PackOptions,
    /// The encoding and the calibration of opaque payloads (from `model`, `encoding` and
    /// `opaque_scale`, see [`CallOptions::rebase`]).
    pub basis: CostBasis,
    pub model: Option<String>,
    pub encoding: Option<String>,
    pub opaque_scale: f64,
    /// History positions kept whatever the budget.
    pub pinned: Vec<usize>,
    /// How many items of the caller's list are history (`None`: all of it).
    pub history_len: Option<usize>,
    /// The caller's list holds the history from this position on.
    pub history_offset: usize,
    pub masking: Option<Masking>,
    /// The model strips earlier turns' thinking (older Claude generations): the thinking
    /// before the last user message costs 0 in this call.
    pub strips_thinking: bool,
    /// A unit sent masked leaves out its reasoning when it stands before the last user
    /// message (see [`crate::pipeline::earlier_reasoning`]).
    pub omit_reasoning: bool,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            pack: PackOptions::default(),
            basis: CostBasis {
                encoding: Encoding::O200kBase,
                opaque_scale: OpaqueScale::ONE,
            },
            model: None,
            encoding: None,
            opaque_scale: 1.0,
            pinned: Vec::new(),
            history_len: None,
            history_offset: 0,
            masking: None,
            strips_thinking: false,
            omit_reasoning: false,
        }
    }
}

/// Why [`CallOptions::rebase`] refused the options.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionsError {
    /// The model or encoding is not known.
    Token(TokenError),
    /// The calibration is out of range (for the encoding).
    Value(String),
}

impl CallOptions {
    /// Work out the cost basis of `model`, `encoding` and `opaque_scale` again (after any of
    /// them changed), and whether the model strips earlier thinking.
    pub fn rebase(&mut self) -> Result<(), OptionsError> {
        let encoding = Encoding::resolve(self.model.as_deref(), self.encoding.as_deref())
            .map_err(OptionsError::Token)?;
        let scale = OpaqueScale::checked(self.opaque_scale).map_err(OptionsError::Value)?;
        self.basis = CostBasis::checked(encoding, scale).map_err(OptionsError::Value)?;
        self.strips_thinking = self.model.as_deref().is_some_and(strips_earlier_thinking);
        Ok(())
    }

    /// Set the masking (`None`: off) and whether masked units leave out earlier reasoning.
    pub fn set_masking(&mut self, masking: Option<Masking>, omit_reasoning: bool) {
        self.masking = masking;
        self.omit_reasoning = masking.is_some() && omit_reasoning;
    }

    /// The thinking rule a pack with these options applies.
    pub fn thinking_rule(&self) -> &'static str {
        if self.strips_thinking {
            "earlier-turns-free"
        } else {
            "whole"
        }
    }

    /// The options as the embedding's `PackOptions(...)` shows them.
    pub fn describe(&self) -> String {
        let model = self
            .model
            .as_deref()
            .map_or("None".to_string(), |m| format!("'{m}'"));
        format!(
            "PackOptions(max_tokens={}, output_reserve={}, context_tokens={}, model={model}, \
             encoding='{}', policy='{}', opaque_scale={:?}, masking={})",
            self.pack.budget,
            self.pack.output_reserve,
            self.pack.context_tokens,
            self.basis.encoding.name(),
            self.pack.policy.name(),
            self.opaque_scale,
            if self.masking.is_some() { "on" } else { "None" },
        )
    }
}

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

/// A cost failure as the packer's error for the item, labelled for `n_history`.
pub fn item_failure(n_history: usize, f: CostFailure) -> PackError {
    PackError::Item {
        label: crate::graph::position_label(n_history, f.position),
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
    /// The decision rows of the pack (detached from the index before it changes).
    pub rows: Arc<Mutex<DecisionRows>>,
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

    /// Append `total` fresh history items classified by `classify` (see
    /// [`IndexedHistory::append_classified`]): where the call's items stand then.
    pub fn append_fresh<E>(
        &mut self,
        total: usize,
        classify: impl FnMut(usize, usize) -> Result<Vec<ItemMeta>, E>,
        blocking: crate::pipeline::Blocking<'_>,
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
            PackCall {
                packed,
                index_use,
                earlier_thinking_free: earlier_free,
                rows: self.decision_rows(Some(tail)),
            }
        });
        CallEnd {
            outcome,
            items,
            store,
            n_history,
        }
    }

    /// Count the costs a later window start with `budget` walks over (the history from
    /// `options.history_offset` on, read through `items`; with masking, the masked costs
    /// too): the window start ([`counted_window`]).
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
    /// `(sum so far, exceeded)`. Positions are labelled as history throughout.
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
