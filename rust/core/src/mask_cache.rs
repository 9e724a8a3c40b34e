//! The process-wide memo of masked fields by content ([`MASKED_FIELD_CACHE`]): a tool output
//! masked once, by any pack (with an index or without, in any index of the process), is not
//! cut and counted again while it is unchanged.
//!
//! * **Key.** A digest ([`crate::digest`], keyed per process, never stored) of everything
//!   the masked field of one item depends on ([`crate::mask::mask_unit_fields`]): the
//!   masking and cost rules ([`MASK_RULE`], [`COST_RULE`]), the encoding, `excerpt_tokens`,
//!   the item's whole cost (the marker states the tokens the copy saves), the tool name its
//!   unit's calls give it (the marker names the tool) and the item itself, every field. An
//!   item changed in any way digests differently and is masked afresh: nothing cached is
//!   ever reused for an object that may have changed.
//! * **Value.** The item's masked field with its exact cost, or that it has nothing to mask.
//!   A caller gets its own copy ([`MaskedField::detached`]): what a caller keeps in a copy
//!   (the binding's converted Python value) never reaches the cache.
//! * **Bounded.** Two generations of at most [`GENERATION_BYTES`] each (approximately), as
//!   the count cache ([`crate::tokens::CountCache`]): inserts go to the current one, which
//!   becomes the previous one when full (the oldest is dropped); a hit in the previous one is
//!   promoted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use rustc_hash::FxHashMap;
use serde_json::Value;

use crate::digest::{Digest, Digester};
use crate::masked_field::{MaskedField, MASK_RULE};
use crate::tokens::{Encoding, COST_RULE};

/// Approximate bytes of one generation of [`MASKED_FIELD_CACHE`].
pub const GENERATION_BYTES: usize = 16 << 20;

/// What one item masks to: its masked field (with its exact cost), or `None` when it has
/// nothing to mask.
pub type Entry = Option<Arc<MaskedField>>;

/// A bounded, thread-safe memo of masked fields by content (see the module note).
pub struct FieldCache {
    generation_bytes: usize,
    inner: Mutex<Generations>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Default)]
struct Generations {
    current: FxHashMap<Digest, Entry>,
    previous: FxHashMap<Digest, Entry>,
    /// Approximate bytes held by `current`.
    bytes: usize,
}

/// Approximate bytes one entry holds.
fn entry_bytes(entry: &Entry) -> usize {
    std::mem::size_of::<(Digest, Entry)>() + entry.as_ref().map_or(0, |f| f.heap_bytes())
}

impl FieldCache {
    pub fn new(generation_bytes: usize) -> FieldCache {
        FieldCache {
            generation_bytes: generation_bytes.max(1),
            inner: Mutex::new(Generations::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The key of `item`'s masked field: see the module note. `tool`: the name the calls of
    /// the item's unit give its tool (`None`: they name none).
    pub fn key(
        item: &Value,
        whole: u64,
        tool: Option<&str>,
        encoding: Encoding,
        excerpt_tokens: u64,
    ) -> Digest {
        let mut d = Digester::new();
        d.uint(u64::from(MASK_RULE));
        d.uint(u64::from(COST_RULE));
        d.text(encoding.name());
        d.uint(excerpt_tokens);
        d.uint(whole);
        match tool {
            Some(name) => d.text(name),
            None => d.null(),
        }
        d.value(item);
        d.finish()
    }

    fn lock(&self) -> MutexGuard<'_, Generations> {
        // A poisoned lock only means another thread panicked mid-insert; the maps are valid.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry kept under `key`, if any.
    pub fn get(&self, key: &Digest) -> Option<Entry> {
        let mut g = self.lock();
        let found = match g.current.get(key) {
            Some(e) => Some(e.clone()),
            None => g.previous.remove(key).inspect(|e| {
                // Promoted: recently used entries survive a rotation.
                Self::put(&mut g, self.generation_bytes, *key, e.clone());
            }),
        };
        drop(g);
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Keep `entry` under `key`.
    pub fn insert(&self, key: Digest, entry: Entry) {
        let mut g = self.lock();
        Self::put(&mut g, self.generation_bytes, key, entry);
    }

    fn put(g: &mut Generations, generation_bytes: usize, key: Digest, entry: Entry) {
        let bytes = entry_bytes(&entry);
        if g.bytes.saturating_add(bytes) > generation_bytes && !g.current.is_empty() {
            g.previous = std::mem::take(&mut g.current);
            g.bytes = 0;
        }
        if let Some(old) = g.current.insert(key, entry) {
            g.bytes = g.bytes.saturating_sub(entry_bytes(&old));
        }
        g.bytes = g.bytes.saturating_add(bytes);
    }

    /// Lookups that found an entry and lookups that did not, since the process started.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Entries held (both generations).
    pub fn len(&self) -> usize {
        let g = self.lock();
        g.current.len() + g.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Approximate bytes held by the current generation.
    pub fn current_bytes(&self) -> usize {
        self.lock().bytes
    }

    pub fn clear(&self) {
        let mut g = self.lock();
        g.current.clear();
        g.previous.clear();
        g.bytes = 0;
    }
}

/// The process-wide memo used by [`crate::mask::mask_unit_fields`].
pub static MASKED_FIELD_CACHE: LazyLock<FieldCache> =
    LazyLock::new(|| FieldCache::new(GENERATION_BYTES));

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(text: &str) -> Entry {
        Some(Arc::new(MaskedField {
            field: "output",
            value: Arc::new(Value::String(text.to_string())),
            original_len: 100,
            cost: Some(20),
            converted: std::sync::OnceLock::new(),
        }))
    }

    #[test]
    fn keys_follow_every_input() {
        let enc = Encoding::O200kBase;
        let item = json!({"type":"function_call_output","call_id":"c","output":"x"});
        let k = FieldCache::key(&item, 10, Some("grep"), enc, 64);
        assert_eq!(k, FieldCache::key(&item.clone(), 10, Some("grep"), enc, 64));
        let mut changed = item.clone();
        changed["output"] = json!("y");
        let mut other_call = item.clone();
        other_call["call_id"] = json!("d");
        for other in [
            FieldCache::key(&changed, 10, Some("grep"), enc, 64),
            FieldCache::key(&other_call, 10, Some("grep"), enc, 64),
            FieldCache::key(&item, 11, Some("grep"), enc, 64),
            FieldCache::key(&item, 10, Some("find"), enc, 64),
            FieldCache::key(&item, 10, None, enc, 64),
            FieldCache::key(&item, 10, Some("grep"), Encoding::Cl100kBase, 64),
            FieldCache::key(&item, 10, Some("grep"), enc, 65),
        ] {
            assert_ne!(k, other);
        }
    }

    #[test]
    fn two_generations_bound_the_memory_and_hits_are_promoted() {
        let cache = FieldCache::new(3 * entry_bytes(&field("abc")));
        let key = |i: u8| [i; 16];
        cache.insert(key(0), field("abc"));
        cache.insert(key(1), None);
        cache.insert(key(2), field("abc"));
        assert_eq!(cache.len(), 3);
        cache.insert(key(3), field("abc")); // rotates: 0..=2 become the previous generation
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.get(&key(0)), Some(field("abc")), "promoted");
        cache.insert(key(4), field("abc"));
        cache.insert(key(5), field("abc")); // rotates again: 1 and 2 are dropped
        assert_eq!(cache.get(&key(1)), None);
        assert_eq!(cache.get(&key(2)), None);
        assert!(cache.get(&key(0)).is_some() && cache.get(&key(5)).is_some());
        assert!(cache.current_bytes() <= 3 * entry_bytes(&field("abc")));
        let (hits, misses) = cache.stats();
        assert_eq!((hits, misses), (3, 2));
        cache.clear();
        assert!(cache.is_empty());
    }
}
