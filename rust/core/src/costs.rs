//! Item costs on demand: the [`CostEngine`] behind a pack, over an item fetcher and an
//! optional persistent count store supplied by the caller (the Python binding implements
//! both: it reads its list and converts, and it calls the user's store).
//!
//! # Count tiers
//!
//! The text of an item is counted by the first tier that knows it:
//!
//! 1. the process-wide count cache ([`crate::tokens::COUNT_CACHE`]);
//! 2. the persistent [`CountStore`], for texts of at least [`STORE_MIN_BYTES`] only (a
//!    shorter text is cheaper to count again than to look up), asked once per batch of
//!    positions;
//! 3. the tokenizer.
//!
//! A count the store hands back that no text of that length can have
//! ([`Encoding::count_is_possible`]) is not this text's count (a damaged or foreign store):
//! the text is counted again and the count reported for rewriting. Counts the store lacked,
//! and counts the process cache supplied for long texts (the cache may have been filled
//! before the store was attached), are reported in [`StoreTally::new_counts`] for the caller
//! to write to the store.
//!
//! # Memo
//!
//! A [`CostMemo`] keeps the cost of every history position across calls (an index's memo),
//! under one [`CostBasis`] (the encoding and its calibration): a call under
//! another basis switches it ([`CostMemo::switch`]), and a failed call puts the previous costs
//! back ([`CostMemo::restore`]). It is what an index snapshot carries besides the items
//! ([`CostMemo::payload`], [`CostMemo::from_payload`]), with the cost rule it was counted
//! under ([`tokens::COST_RULE`]): costs of another rule are never reused.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::incremental::reserve_ahead;
use crate::items::{CallType, ItemKind};
use crate::tokens::{
    self, Canonical, CostBasis, Encoding, OpaqueScale, TokenError, COST_RULE, COST_RULE_COMPATIBLE,
    ITEM_OVERHEAD, STORE_MIN_BYTES,
};

/// A failure to cost one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostFailure {
    /// Global position (history ++ new_input).
    pub position: usize,
    pub field: String,
    pub message: String,
}

/// Supplies item costs on demand. Positions are global (history ++ new_input).
pub trait CostSource {
    /// Exact costs of the items at `positions`, in the same order.
    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure>;

    /// A cheap lower bound of the cost of the item at `position`; must never exceed the exact
    /// cost. The default is the per-item overhead.
    fn lower_bound(&mut self, _position: usize) -> u64 {
        crate::tokens::ITEM_OVERHEAD
    }

    /// Exact costs of the history members of one unit (`members`, in order) as sent masked
    /// ([`crate::mask`]): an item with nothing to mask costs what it costs whole. The default,
    /// for a source that cannot mask, is the whole costs.
    fn masked_costs(&mut self, members: &[usize]) -> Result<Vec<u64>, CostFailure> {
        self.costs(members)
    }

    /// A cheap lower bound of the masked cost of the item at `position` (never above it,
    /// which is never above the whole cost). The default is the per-item overhead.
    fn masked_lower_bound(&mut self, _position: usize) -> u64 {
        crate::tokens::ITEM_OVERHEAD
    }

    /// Whether [`CostSource::masked_costs`] can be lower than the whole costs.
    fn masks(&self) -> bool {
        false
    }

    /// The exact cost of the item at `position` if it is known without counting.
    fn known(&self, _position: usize) -> Option<u64> {
        None
    }

    /// Whether the item at `position` may be cheaper masked (a tool output). The default,
    /// for a source that does not know, is `true` (every item is then bounded by an item's
    /// overhead).
    fn maskable(&self, _position: usize) -> bool {
        true
    }
}

/// Why a count store could not answer (the caller keeps the details, e.g. its exception).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    pub message: String,
}

/// A persistent, content-addressed store of token counts (keys from
/// [`tokens::store_key`] under the store's [`CountStore::secret`]).
pub trait CountStore {
    /// The store's own 16-byte key for [`tokens::store_key`].
    fn secret(&self) -> [u8; 16];

    /// The stored counts of `keys`, in order (`None` where the store has none). An answer of
    /// another length is refused by the engine.
    fn get_many(&mut self, keys: &[[u8; 16]]) -> Result<Vec<Option<u64>>, StoreError>;
}

/// One element of a count store's answer as the embedding reads it ([`stored_counts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// No count (`None`).
    Absent,
    /// An integer in `0..=u64::MAX` (a bool is not one).
    Count(u64),
    /// Anything else.
    NotACount,
}

/// A count store's answer to `asked` keys (`None`: it is not a list) as
/// [`CountStore::get_many`] returns it: the counts, or the message refusing it when it is not
/// a list of `asked` elements each absent or a count (`shown()`: the answer as its source
/// writes it).
pub fn stored_counts(
    asked: usize,
    answer: Option<impl ExactSizeIterator<Item = Stored>>,
    shown: impl FnOnce() -> String,
) -> Result<Vec<Option<u64>>, String> {
    let counts = answer.filter(|a| a.len() == asked).and_then(|answer| {
        let count = |s| match s {
            Stored::Absent => Some(None),
            Stored::Count(n) => Some(Some(n)),
            Stored::NotACount => None,
        };
        answer.map(count).collect()
    });
    counts.ok_or_else(|| {
        format!(
            "count_store.get_many must return a list of {asked} ints >= 0 or None, got {}",
            shown()
        )
    })
}

/// Supplies items as JSON values by global position (history ++ new input).
pub trait ItemSource {
    /// The items at `positions`, in order (one call per batch the packer asks for).
    fn values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure>;
}

/// What a call did with its count store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreTally {
    /// Counts found in the store (and accepted).
    pub hits: usize,
    /// Counts to write to the store: `(key, tokens)`.
    pub new_counts: Vec<([u8; 16], u64)>,
}

/// A count store attached to one call, with what the call did with it.
struct Attached<S> {
    store: S,
    secret: [u8; 16],
    tally: StoreTally,
}

/// A position's cost not counted yet (in a [`CostMemo`]).
pub const UNCOUNTED: u64 = u64::MAX;

/// The cost of every history position under one [`CostBasis`], kept across calls (see the
/// module notes). Positions not counted yet hold [`UNCOUNTED`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostMemo {
    basis: Option<CostBasis>,
    costs: Vec<u64>,
}

/// The costs a [`CostMemo::switch`] replaced, for [`CostMemo::restore`].
#[derive(Debug)]
pub struct SwitchedCosts {
    basis: Option<CostBasis>,
    costs: Vec<u64>,
}

/// What an index snapshot carries for the memo: the cost rule the costs were counted under,
/// the calibration of opaque payloads (sixty-fourths), the encoding's name and each
/// position's cost plus one (`UNCOUNTED` becomes 0, one byte in the snapshot's varint
/// encoding).
///
/// The rule comes first, as one byte: rule 1 payloads began with the encoding, an
/// `Option` whose tag byte is 0 or 1, so a protoprompt that reads those refuses these (its
/// costs would be of another rule) and this one tells them apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostPayload {
    rule: u8,
    opaque_scale: u16,
    encoding: Option<String>,
    costs: Vec<u64>,
}

/// What snapshots written under cost rule 1 carry (no rule, no calibration): read only to
/// recognise them, never to reuse their costs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LegacyCostPayload {
    encoding: Option<String>,
    costs: Vec<u64>,
}

impl CostPayload {
    /// Whether its costs were counted under this version's cost rule, or under the earlier
    /// one whose costs are this one's ([`tokens::COST_RULE_COMPATIBLE`]; the costs of an
    /// estimate under a calibration are not reused even then, see
    /// [`CostMemo::from_payload`]).
    pub fn is_current_rule(&self) -> bool {
        self.rule == COST_RULE || self.rule == COST_RULE_COMPATIBLE
    }
}

impl CostMemo {
    pub fn new() -> CostMemo {
        CostMemo::default()
    }

    /// The encoding the costs are counted under (`None`: none counted yet).
    pub fn encoding(&self) -> Option<Encoding> {
        self.basis.map(|b| b.encoding)
    }

    /// The basis the costs are counted under (`None`: none counted yet).
    pub fn basis(&self) -> Option<CostBasis> {
        self.basis
    }

    /// Positions `len` uncounted, under no basis yet (what a snapshot's costs become when
    /// they were counted under another cost rule).
    pub fn uncounted(len: usize) -> CostMemo {
        CostMemo {
            basis: None,
            costs: vec![UNCOUNTED; len],
        }
    }

    /// Positions whose cost is counted.
    pub fn counted(&self) -> usize {
        self.costs.iter().filter(|&&c| c != UNCOUNTED).count()
    }

    pub fn len(&self) -> usize {
        self.costs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.costs.is_empty()
    }

    /// The cost of `position` if counted.
    pub fn get(&self, position: usize) -> Option<u64> {
        self.costs
            .get(position)
            .copied()
            .filter(|&c| c != UNCOUNTED)
    }

    /// The cost of `position` under `basis` if counted, else an item's overhead (never
    /// more than its exact cost).
    pub fn lower_bound(&self, position: usize, basis: impl Into<CostBasis>) -> u64 {
        match self.basis {
            Some(b) if b == basis.into() => self.get(position).unwrap_or(ITEM_OVERHEAD),
            _ => ITEM_OVERHEAD,
        }
    }

    /// Count under `basis` from now on, `len` positions all uncounted, if the memo counts
    /// under another one: returns what it held, for [`CostMemo::restore`] (`None`: nothing
    /// changed).
    pub fn switch(&mut self, basis: impl Into<CostBasis>, len: usize) -> Option<SwitchedCosts> {
        let basis = basis.into();
        if self.basis == Some(basis) {
            return None;
        }
        let costs = std::mem::replace(&mut self.costs, vec![UNCOUNTED; len]);
        let basis = self.basis.replace(basis);
        Some(SwitchedCosts { basis, costs })
    }

    /// Put back what a [`CostMemo::switch`] replaced (if anything), then keep `len` positions.
    pub fn restore(&mut self, switched: Option<SwitchedCosts>, len: usize) {
        if let Some(s) = switched {
            self.basis = s.basis;
            self.costs = s.costs;
        }
        self.costs.truncate(len);
    }

    /// Make room for `needed` more positions (growing by `headroom`), then hold `len`
    /// positions, the new ones uncounted.
    pub fn grow(&mut self, len: usize, needed: usize, headroom: usize) {
        reserve_ahead(&mut self.costs, needed, headroom);
        self.costs.resize(len, UNCOUNTED);
    }

    /// Keep the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.costs.truncate(len);
    }

    /// Keep the first `len` positions and give memory back down to `capacity` positions.
    pub fn shrink_back(&mut self, len: usize, capacity: usize) {
        self.costs.truncate(len);
        self.costs.shrink_to(capacity);
    }

    pub fn capacity(&self) -> usize {
        self.costs.capacity()
    }

    /// Bytes of memory held.
    pub fn heap_bytes(&self) -> usize {
        self.costs.capacity() * std::mem::size_of::<u64>()
    }

    pub fn clear(&mut self) {
        self.costs.clear();
    }

    /// What a snapshot stores for this memo.
    pub fn payload(&self) -> CostPayload {
        CostPayload {
            encoding: self.basis.map(|b| b.encoding.name().to_string()),
            costs: self.costs.iter().map(|c| c.wrapping_add(1)).collect(),
            rule: COST_RULE,
            opaque_scale: self
                .basis
                .map_or(OpaqueScale::ONE, |b| b.opaque_scale)
                .sixty_fourths(),
        }
    }

    /// The memo a snapshot stored for an index of `items` positions; `Err` says how the
    /// payload is damaged (wrong length, a cost below an item's overhead, an unknown
    /// encoding or calibration) — never trusted in part. Costs counted under another cost
    /// rule are not reused: the memo then holds none ([`CostMemo::uncounted`]).
    pub fn from_payload(payload: CostPayload, items: usize) -> Result<CostMemo, String> {
        if payload.costs.len() != items {
            return Err("token costs do not match the items".to_string());
        }
        if !payload.is_current_rule() {
            return Ok(CostMemo::uncounted(items));
        }
        let opaque_scale = OpaqueScale::from_sixty_fourths(payload.opaque_scale)
            .ok_or("the calibration of opaque payloads is out of bounds")?;
        let estimate = payload
            .encoding
            .as_deref()
            .and_then(|n| Encoding::from_name(n).ok())
            .is_some_and(Encoding::is_estimate);
        if estimate && opaque_scale != OpaqueScale::ONE {
            if payload.rule != COST_RULE {
                // Rule 2 scaled an estimate's opaque part only: not this rule's costs.
                return Ok(CostMemo::uncounted(items));
            }
            if opaque_scale < CostBasis::MIN_ESTIMATE_SCALE {
                return Err("the calibration of an estimate is out of bounds".to_string());
            }
        }
        // Every counted item costs at least its overhead (a cost of 0 is stored as 1).
        if let Some(p) = payload
            .costs
            .iter()
            .position(|&c| c != 0 && c.wrapping_sub(1) < ITEM_OVERHEAD)
        {
            return Err(format!("item {p} costs less than an item's overhead"));
        }
        let basis = match payload.encoding.as_deref() {
            None => None,
            Some(name) => Some(CostBasis {
                encoding: Encoding::from_name(name).map_err(|_| "unknown encoding")?,
                opaque_scale,
            }),
        };
        Ok(CostMemo {
            basis,
            costs: payload.costs.iter().map(|c| c.wrapping_sub(1)).collect(),
        })
    }

    /// The memo of a snapshot written under cost rule 1 for an index of `items` positions:
    /// none of its costs (`Err` if it does not even match the items).
    pub fn from_legacy_payload(
        payload: LegacyCostPayload,
        items: usize,
    ) -> Result<CostMemo, String> {
        if payload.costs.len() != items {
            return Err("token costs do not match the items".to_string());
        }
        if let Some(name) = payload.encoding.as_deref() {
            Encoding::from_name(name).map_err(|_| "unknown encoding")?;
        }
        Ok(CostMemo::uncounted(items))
    }
}

/// Costs items on demand for one call (a [`CostSource`]): fetches the items it has no cost
/// for, renders their canonical text, counts it through the tiers (module notes) and keeps
/// each cost, in the memo for history positions or for the call otherwise, so that each
/// position is costed at most once.
pub struct CostEngine<'m, F, S> {
    items: F,
    encoding: Encoding,
    opaque_scale: OpaqueScale,
    store: Option<Attached<S>>,
    memo: Option<&'m mut CostMemo>,
    /// Costs of positions the memo does not hold (new input, or every position without memo).
    cache: FxHashMap<usize, u64>,
    /// The tokenizer failure that ended the call, if one did, and the position it was at.
    tokenizer_failure: Option<(usize, TokenError)>,
}

impl<'m, F: ItemSource, S: CountStore> CostEngine<'m, F, S> {
    /// Costs under `basis` (an [`Encoding`] is the basis without calibration).
    pub fn new(items: F, basis: impl Into<CostBasis>) -> Self {
        let CostBasis {
            encoding,
            opaque_scale,
        } = basis.into();
        CostEngine {
            items,
            encoding,
            opaque_scale,
            store: None,
            memo: None,
            cache: FxHashMap::default(),
            tokenizer_failure: None,
        }
    }

    /// Look long texts up in (and report new counts for) `store`.
    pub fn with_store(mut self, store: Option<S>) -> Self {
        self.store = store.map(|store| Attached {
            secret: store.secret(),
            store,
            tally: StoreTally::default(),
        });
        self
    }

    /// Keep the costs of history positions `0..n_history` in `memo` across calls. A memo of
    /// another basis is switched first (its costs dropped; a caller that must be able to
    /// put them back calls [`CostMemo::switch`] itself beforehand).
    pub fn with_memo(mut self, memo: &'m mut CostMemo, n_history: usize) -> Self {
        memo.switch(self.basis(), n_history);
        memo.costs.resize(n_history, UNCOUNTED);
        self.memo = Some(memo);
        self
    }

    /// What this engine counts under.
    pub fn basis(&self) -> CostBasis {
        CostBasis {
            encoding: self.encoding,
            opaque_scale: self.opaque_scale,
        }
    }

    /// The cost of `position` if this call or the memo has it.
    pub fn known(&self, position: usize) -> Option<u64> {
        if let Some(c) = self.memo.as_deref().and_then(|m| m.get(position)) {
            return Some(c);
        }
        self.cache.get(&position).copied()
    }

    /// The item fetcher (e.g. to read the kept items back).
    pub fn items(&mut self) -> &mut F {
        &mut self.items
    }

    /// The tokenizer failure that ended the call, if one did, with the position of the item
    /// whose text it was (the cost failure handed to the packer says the same, as an item's).
    pub fn tokenizer_failure(&self) -> Option<(usize, &TokenError)> {
        self.tokenizer_failure.as_ref().map(|(p, e)| (*p, e))
    }

    /// The fetcher, and the store with what this call did with it.
    pub fn finish(self) -> (F, Option<(S, StoreTally)>) {
        (self.items, self.store.map(|a| (a.store, a.tally)))
    }

    fn count_failure(&mut self, position: usize, e: TokenError) -> CostFailure {
        let failure = CostFailure {
            position,
            field: "(item)".to_string(),
            message: e.to_string(),
        };
        if matches!(e, TokenError::Tokenizer(_)) {
            self.tokenizer_failure = Some((position, e));
        }
        failure
    }

    fn count(
        &mut self,
        position: usize,
        text: &str,
        key: Option<tokens::CacheKey>,
    ) -> Result<u64, CostFailure> {
        self.encoding
            .count_and_remember(text, key)
            .map_err(|e| self.count_failure(position, e))
    }

    /// Text token counts of `texts`: from the process cache, else the store, else counted.
    /// Without a store, or for short texts, this is [`Encoding::count_cached`].
    fn text_counts(&mut self, texts: &[(usize, Canonical)]) -> Result<Vec<u64>, CostFailure> {
        let enc = self.encoding;
        let mut counts = vec![0u64; texts.len()];
        // Texts to look up in the store: index into `texts`, process-cache key.
        let mut ask: Vec<(usize, Option<tokens::CacheKey>)> = Vec::new();
        for (i, (p, c)) in texts.iter().enumerate() {
            let stored = self.store.is_some() && c.text.len() >= STORE_MIN_BYTES;
            match (
                enc.cache_lookup(&c.text),
                self.store.as_mut().filter(|_| stored),
            ) {
                ((_, Some(n)), Some(link)) => {
                    // Counted earlier in this process, maybe before this store was attached:
                    // (re)write it so that the store has what a restart will need.
                    counts[i] = n;
                    let key = tokens::store_key(&link.secret, enc, &c.text);
                    link.tally.new_counts.push((key, n));
                }
                ((_, Some(n)), None) => counts[i] = n,
                ((key, None), Some(_)) => ask.push((i, key)),
                ((key, None), None) => counts[i] = self.count(*p, &c.text, key)?,
            }
        }
        if ask.is_empty() {
            return Ok(counts);
        }
        let Some(link) = self.store.as_mut() else {
            return Ok(counts);
        };
        let keys: Vec<[u8; 16]> = ask
            .iter()
            .map(|&(i, _)| tokens::store_key(&link.secret, enc, &texts[i].1.text))
            .collect();
        let found = link
            .store
            .get_many(&keys)
            .and_then(|found| {
                if found.len() == keys.len() {
                    Ok(found)
                } else {
                    Err(StoreError {
                        message: format!(
                            "count_store.get_many returned {} counts for {} keys",
                            found.len(),
                            keys.len()
                        ),
                    })
                }
            })
            .map_err(|e| CostFailure {
                position: texts[ask[0].0].0,
                field: "(count_store)".to_string(),
                message: e.message,
            })?;
        for ((&(i, cache_key), key), hit) in ask.iter().zip(keys).zip(found) {
            let (p, c) = &texts[i];
            counts[i] = match hit {
                // A count no text of this length can have is not this text's count (a
                // damaged or foreign store): counted again, and the store is corrected.
                Some(n) if enc.count_is_possible(&c.text, n) => {
                    if let Some(link) = self.store.as_mut() {
                        link.tally.hits += 1;
                    }
                    tokens::remember_count(cache_key, n);
                    n
                }
                _ => {
                    let n = self.count(*p, &c.text, cache_key)?;
                    if let Some(link) = self.store.as_mut() {
                        link.tally.new_counts.push((key, n));
                    }
                    n
                }
            };
        }
        Ok(counts)
    }
}

impl<F: ItemSource, S: CountStore> CostSource for CostEngine<'_, F, S> {
    fn known(&self, position: usize) -> Option<u64> {
        CostEngine::known(self, position)
    }

    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        let missing: Vec<usize> = positions
            .iter()
            .copied()
            .filter(|&p| self.known(p).is_none())
            .collect();
        if !missing.is_empty() {
            let values = self.items.values(&missing)?;
            let texts: Vec<(usize, Canonical)> = missing
                .iter()
                .zip(values)
                .map(|(&p, v)| {
                    tokens::canonical(&v, self.encoding)
                        .map(|c| (p, c))
                        .map_err(|e| match e {
                            TokenError::BadItem { field, message } => CostFailure {
                                position: p,
                                field,
                                message,
                            },
                            other => CostFailure {
                                position: p,
                                field: "(item)".to_string(),
                                message: other.to_string(),
                            },
                        })
                })
                .collect::<Result<_, _>>()?;
            let counts = self.text_counts(&texts)?;
            for ((p, c), n) in texts.iter().zip(counts) {
                let cost = self.basis().cost(&c.cost(n));
                match self.memo.as_deref_mut() {
                    Some(memo) if *p < memo.costs.len() => memo.costs[*p] = cost,
                    _ => {
                        self.cache.insert(*p, cost);
                    }
                }
            }
        }
        Ok(positions
            .iter()
            .map(|&p| self.known(p).unwrap_or_default())
            .collect())
    }
}

/// A [`CountStore`] type for calls without a store (`CostEngine<_, NoStore>`).
pub enum NoStore {}

impl CountStore for NoStore {
    fn secret(&self) -> [u8; 16] {
        match *self {}
    }

    fn get_many(&mut self, _keys: &[[u8; 16]]) -> Result<Vec<Option<u64>>, StoreError> {
        match *self {}
    }
}

/// A [`CostSource`] under a model that strips earlier turns' thinking
/// ([`crate::tokens::strips_earlier_thinking`]): the positions in `free` (the thinking items
/// before the last user message, [`earlier_thinking`]) cost 0, every other position what
/// `inner` says. Built per pack call from the positions of that call, so a cost of 0 is never
/// memoized: `inner`'s memo keeps each item's whole cost, and a new user message (which makes
/// the thinking before it "earlier") changes only this call's `free`.
pub struct EarlierThinkingFree<'a> {
    inner: &'a mut dyn CostSource,
    free: Vec<usize>,
}

impl<'a> EarlierThinkingFree<'a> {
    /// `free` in any order.
    pub fn new(inner: &'a mut dyn CostSource, mut free: Vec<usize>) -> Self {
        free.sort_unstable();
        free.dedup();
        EarlierThinkingFree { inner, free }
    }

    fn is_free(&self, position: usize) -> bool {
        self.free.binary_search(&position).is_ok()
    }

    fn split_costs(&mut self, positions: &[usize], masked: bool) -> Result<Vec<u64>, CostFailure> {
        let counted: Vec<usize> = positions
            .iter()
            .copied()
            .filter(|&p| !self.is_free(p))
            .collect();
        let mut costs = if masked {
            self.inner.masked_costs(&counted)?
        } else {
            self.inner.costs(&counted)?
        }
        .into_iter();
        Ok(positions
            .iter()
            .map(|&p| {
                if self.is_free(p) {
                    0
                } else {
                    costs.next().unwrap_or(0)
                }
            })
            .collect())
    }
}

impl CostSource for EarlierThinkingFree<'_> {
    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        self.split_costs(positions, false)
    }

    fn lower_bound(&mut self, position: usize) -> u64 {
        if self.is_free(position) {
            0
        } else {
            self.inner.lower_bound(position)
        }
    }

    fn masked_costs(&mut self, members: &[usize]) -> Result<Vec<u64>, CostFailure> {
        self.split_costs(members, true)
    }

    fn masked_lower_bound(&mut self, position: usize) -> u64 {
        if self.is_free(position) {
            0
        } else {
            self.inner.masked_lower_bound(position)
        }
    }

    fn masks(&self) -> bool {
        self.inner.masks()
    }

    fn known(&self, position: usize) -> Option<u64> {
        if self.is_free(position) {
            Some(0)
        } else {
            self.inner.known(position)
        }
    }

    fn maskable(&self, position: usize) -> bool {
        !self.is_free(position) && self.inner.maskable(position)
    }
}

/// The thinking items a model that strips earlier turns' thinking does not count: the
/// positions below `len` where `is_thinking` holds that stand before the last position where
/// `is_user` holds (the last user message; a tool result is its own item kind, never a user
/// message). The current turn's thinking (after that message) is not among them.
pub fn earlier_thinking(
    len: usize,
    is_user: &dyn Fn(usize) -> bool,
    is_thinking: &dyn Fn(usize) -> bool,
) -> Vec<usize> {
    let Some(last_user) = (0..len).rev().find(|&p| is_user(p)) else {
        return Vec::new();
    };
    (0..last_user).filter(|&p| is_thinking(p)).collect()
}

/// Whether an item of `kind` that follows a reasoning item may be sent without its `id`:
/// an assistant message (the SDK's compaction session strips assistant-message ids whose
/// reasoning is gone, `_strip_orphaned_assistant_ids`) and the calls whose input form has an
/// optional `id` in the Responses API's input schema (function, custom tool, shell,
/// apply_patch and client tool-search calls). Local shell, computer, hosted and MCP items
/// and programs need their `id` as input.
pub fn id_optional_follower(kind: ItemKind) -> bool {
    matches!(
        kind,
        ItemKind::AssistantMessage
            | ItemKind::Call(
                CallType::FunctionCall
                    | CallType::CustomToolCall
                    | CallType::ShellCall
                    | CallType::ApplyPatchCall
                    | CallType::ToolSearchCall
            )
    )
}

/// Whether a reasoning item's unit may be sent without it: every member is a reasoning item,
/// a message, an [`id_optional_follower`] or an output of one of those calls (outputs are the
/// client's, never a reasoning item's follower). A unit with any other model item keeps its
/// reasoning.
pub fn reasoning_omittable_unit(kinds: impl IntoIterator<Item = ItemKind>) -> bool {
    kinds.into_iter().all(|k| {
        id_optional_follower(k)
            || matches!(
                k,
                ItemKind::Reasoning
                    | ItemKind::UserMessage
                    | ItemKind::SystemMessage
                    | ItemKind::DeveloperMessage
                    | ItemKind::AssistantInputMessage
                    | ItemKind::Output(
                        CallType::FunctionCall
                            | CallType::CustomToolCall
                            | CallType::ShellCall
                            | CallType::ApplyPatchCall
                            | CallType::ToolSearchCall
                    )
            )
    })
}

/// The reasoning items a masked pack may leave out: the positions below `len` where
/// `is_reasoning` holds (the caller excludes Claude's thinking and any reasoning carrying
/// `provider_data`) that stand before the last position where `is_user` holds (the last user
/// message; a tool result is its own item kind, never a user message) and whose unit
/// `unit_ok` accepts ([`reasoning_omittable_unit`]). The current turn's reasoning (its tool
/// loop: after that message) is never among them: OpenAI requires every reasoning item
/// between a function call and the last user message.
pub fn omittable_reasoning(
    len: usize,
    is_user: &dyn Fn(usize) -> bool,
    is_reasoning: &dyn Fn(usize) -> bool,
    unit_ok: &mut dyn FnMut(usize) -> bool,
) -> Vec<usize> {
    let Some(last_user) = (0..len).rev().find(|&p| is_user(p)) else {
        return Vec::new();
    };
    (0..last_user)
        .filter(|&p| is_reasoning(p) && unit_ok(p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Costs 10 + position, counting how many positions it was asked for.
    struct Fixed(usize);

    impl CostSource for Fixed {
        fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
            self.0 += positions.len();
            Ok(positions.iter().map(|&p| 10 + p as u64).collect())
        }
    }

    #[test]
    fn earlier_thinking_stands_before_the_last_user_message() {
        // user, thinking, call, output, user, thinking, call
        let user = |p: usize| p == 0 || p == 4;
        let thinking = |p: usize| p == 1 || p == 5;
        assert_eq!(earlier_thinking(7, &user, &thinking), vec![1]);
        // Before the second user message is appended, the first turn's thinking is current.
        assert_eq!(earlier_thinking(4, &user, &thinking), Vec::<usize>::new());
        assert_eq!(
            earlier_thinking(7, &|_| false, &thinking),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn free_positions_cost_nothing_and_are_never_counted() {
        let mut inner = Fixed(0);
        let mut free = EarlierThinkingFree::new(&mut inner, vec![3, 1, 3]);
        assert_eq!(free.costs(&[0, 1, 2, 3]).unwrap(), vec![10, 0, 12, 0]);
        assert_eq!(free.masked_costs(&[1, 4]).unwrap(), vec![0, 14]);
        assert_eq!(free.known(1), Some(0));
        assert_eq!(free.lower_bound(3), 0);
        assert_eq!(free.lower_bound(2), crate::tokens::ITEM_OVERHEAD);
        assert!(!free.maskable(1));
        // Only the positions that are not free reached the inner source.
        assert_eq!(inner.0, 3);
    }

    #[test]
    fn omittable_reasoning_stops_at_the_last_user_message() {
        // user, reasoning, call, output, user, reasoning, call
        let user = |p: usize| p == 0 || p == 4;
        let reasoning = |p: usize| p == 1 || p == 5;
        assert_eq!(
            omittable_reasoning(7, &user, &reasoning, &mut |_| true),
            vec![1]
        );
        assert_eq!(
            omittable_reasoning(7, &user, &reasoning, &mut |_| false),
            Vec::<usize>::new()
        );
        // Before the second user message the first turn is the current one.
        assert_eq!(
            omittable_reasoning(4, &user, &reasoning, &mut |_| true),
            Vec::<usize>::new()
        );
        let ok = [ItemKind::Reasoning, ItemKind::Call(CallType::FunctionCall)];
        assert!(reasoning_omittable_unit(ok));
        let hosted = [ItemKind::Reasoning, ItemKind::Call(CallType::ComputerCall)];
        assert!(id_optional_follower(ItemKind::Call(CallType::ShellCall)));
        assert!(!id_optional_follower(ItemKind::Call(
            CallType::LocalShellCall
        )));
        assert!(!reasoning_omittable_unit(hosted));
    }
}
