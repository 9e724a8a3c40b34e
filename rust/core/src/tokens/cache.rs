//! Counts kept across calls: the process-wide, content-addressed [`COUNT_CACHE`] and the
//! keys of a persistent count store ([`store_key`]).

use super::{Encoding, TokenError};

impl Encoding {
    /// [`Encoding::count`] through the process-wide [`CountCache`]: a text seen before (by
    /// content, under this encoding) is not tokenised again.
    pub fn count_cached(self, text: &str) -> Result<u64, TokenError> {
        match self.cache_lookup(text) {
            (_, Some(n)) => Ok(n),
            (key, None) => self.count_and_remember(text, key),
        }
    }

    /// The process cache's key for `text` (`None` for texts shorter than
    /// [`CACHE_MIN_BYTES`], which are never cached) and its count if cached. The key is
    /// handed back to [`Encoding::count_and_remember`] / [`remember_count`], so a text is
    /// hashed once however its count is found.
    pub fn cache_lookup(self, text: &str) -> (Option<CacheKey>, Option<u64>) {
        if text.len() < CACHE_MIN_BYTES {
            return (None, None);
        }
        let key = CacheKey::new(self, text);
        (Some(key), COUNT_CACHE.get(&key))
    }

    /// Count `text` and keep the count under `key` (from [`Encoding::cache_lookup`]). A
    /// text of tagged blocks (see [`Encoding::tagged_lines`]) is counted line by line
    /// through the cache, so the lines a text shares with one counted before are not
    /// tokenised again.
    pub fn count_and_remember(self, text: &str, key: Option<CacheKey>) -> Result<u64, TokenError> {
        let n = match self.tagged_lines(text) {
            Some(starts) => self.count_lines(text, &starts)?,
            None => self.count(text)?,
        };
        remember_count(key, n);
        Ok(n)
    }

    /// For a text of tagged blocks -- at least [`TAGGED_MIN_BYTES`] long, with at least
    /// [`TAGGED_MIN_TAGS`] lines that start with `<` -- the starts of its lines where the
    /// count splits exactly ([`super::is_exact_split`]: a line starting with a tag, a
    /// letter or a digit), else `None`. Such a text (the context message: recalled
    /// passages under headers that change from turn to turn, in sections) is mostly lines
    /// counted before, whatever else changed.
    pub fn tagged_lines(self, text: &str) -> Option<Vec<usize>> {
        let bytes = text.as_bytes();
        if bytes.len() < TAGGED_MIN_BYTES {
            return None;
        }
        let mut tags = 0usize;
        let mut starts = Vec::new();
        for i in newline_positions(bytes) {
            let at = i + 1;
            if super::is_exact_split(self, bytes, at) {
                tags += usize::from(bytes[at] == b'<');
                starts.push(at);
            }
        }
        (tags >= TAGGED_MIN_TAGS).then_some(starts)
    }

    /// The count of `text` as the sum of its pieces between `starts` (exact split points,
    /// ascending), each through the process cache.
    fn count_lines(self, text: &str, starts: &[usize]) -> Result<u64, TokenError> {
        let mut total = 0u64;
        let mut from = 0usize;
        for &end in starts.iter().chain(std::iter::once(&text.len())) {
            let piece = &text[from..end];
            let n = match self.cache_lookup(piece) {
                (_, Some(n)) => n,
                (key, None) => {
                    let n = self.count(piece)?;
                    remember_count(key, n);
                    n
                }
            };
            total = total.saturating_add(n);
            from = end;
        }
        Ok(total)
    }
}

/// Positions of the `\n` bytes of `bytes` (a plain byte scan).
fn newline_positions(bytes: &[u8]) -> impl Iterator<Item = usize> + '_ {
    bytes
        .iter()
        .enumerate()
        .filter_map(|(i, &b)| (b == b'\n').then_some(i))
}

/// Shortest text counted line by line (see [`Encoding::tagged_lines`]): below it, one
/// tokenizer call costs less than the lookups.
pub const TAGGED_MIN_BYTES: usize = 1024;
/// Fewest lines starting with a tag that make a text one of tagged blocks.
pub const TAGGED_MIN_TAGS: usize = 4;

/// Texts shorter than this are counted directly. Everything longer goes through the cache:
/// hashing a short text costs far less than a tokenizer call.
pub const CACHE_MIN_BYTES: usize = 16;
/// Entries per generation of the count cache (two generations are kept).
pub const CACHE_GENERATION_ENTRIES: usize = 1 << 18;

/// Content address of a text under one encoding: the encoding, the text's length and two
/// independent 64-bit hashes of it (a false hit needs a 128-bit collision at equal length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    encoding: Encoding,
    len: usize,
    h1: u64,
    h2: u64,
}

impl CacheKey {
    pub fn new(encoding: Encoding, text: &str) -> CacheKey {
        use std::hash::{BuildHasher, Hasher};
        static SEEDS: std::sync::OnceLock<(std::hash::RandomState, std::hash::RandomState)> =
            std::sync::OnceLock::new();
        let (a, b) = SEEDS.get_or_init(|| (Default::default(), Default::default()));
        let mut h1 = a.build_hasher();
        h1.write(text.as_bytes());
        let mut h2 = b.build_hasher();
        h2.write(text.as_bytes());
        CacheKey {
            encoding,
            len: text.len(),
            h1: h1.finish(),
            h2: h2.finish(),
        }
    }
}

/// Keep a count obtained elsewhere (e.g. a [`store_key`] store) in the process cache under
/// `key` (from [`Encoding::cache_lookup`]; `None`: a short text, not cached).
pub fn remember_count(key: Option<CacheKey>, count: u64) {
    if let Some(key) = key {
        COUNT_CACHE.insert(key, count);
    }
}

/// Texts at least this long have their counts kept in a persistent count store when the
/// caller provides one; a shorter text is cheaper to count again than to look up.
pub const STORE_MIN_BYTES: usize = 256;

/// Version of what a [`store_key`] addresses. Raise it if a text's count under an encoding
/// could ever change (a tokenizer fix), so that stored counts are never read back wrongly.
pub const STORE_KEY_VERSION: u8 = 1;

/// The key of a text's count in a persistent, content-addressed count store (e.g. a table in
/// the session's database, read back by another process): SipHash-1-3 with 128-bit output,
/// keyed with the store's own random `secret`, over [`STORE_KEY_VERSION`], the encoding's
/// name and the text. Stable across processes, platforms and releases. The secret keeps
/// anyone who can choose the texts (a user of a shared store) from crafting two texts with
/// one key, which would let them set the count of someone else's text.
pub fn store_key(secret: &[u8; 16], encoding: Encoding, text: &str) -> [u8; 16] {
    use siphasher::sip128::{Hasher128, SipHasher13};
    use std::hash::Hasher;
    let mut h = SipHasher13::new_with_key(secret);
    h.write_u8(STORE_KEY_VERSION);
    h.write(encoding.name().as_bytes());
    h.write_u8(0xff); // never inside UTF-8: the name ends here
    h.write(text.as_bytes());
    h.finish128().as_bytes()
}

/// A bounded, thread-safe, content-addressed cache of token counts.
///
/// Two generations: lookups check both, inserts go to the current one; when it is full it
/// becomes the previous generation and the oldest is discarded. Memory is bounded by
/// `2 * capacity` entries, and recently used counts survive a rotation (a hit in the old
/// generation is promoted).
pub struct CountCache {
    capacity: usize,
    inner: std::sync::Mutex<(
        std::collections::HashMap<CacheKey, u64>,
        std::collections::HashMap<CacheKey, u64>,
    )>,
}

impl CountCache {
    pub fn new(capacity: usize) -> CountCache {
        CountCache {
            capacity: capacity.max(1),
            inner: std::sync::Mutex::new(Default::default()),
        }
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        (
            std::collections::HashMap<CacheKey, u64>,
            std::collections::HashMap<CacheKey, u64>,
        ),
    > {
        // A poisoned lock only means another thread panicked mid-insert; the maps are valid.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &CacheKey) -> Option<u64> {
        let g = self.lock();
        if let Some(&n) = g.0.get(key) {
            return Some(n);
        }
        let n = *g.1.get(key)?;
        drop(g);
        self.insert(*key, n);
        Some(n)
    }

    pub fn insert(&self, key: CacheKey, count: u64) {
        let mut g = self.lock();
        if g.0.len() >= self.capacity {
            let current = std::mem::take(&mut g.0);
            g.1 = current;
        }
        g.0.insert(key, count);
    }

    /// Entries held (both generations).
    pub fn len(&self) -> usize {
        let g = self.lock();
        g.0.len() + g.1.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&self) {
        let mut g = self.lock();
        g.0.clear();
        g.1.clear();
    }
}

/// The process-wide count cache used by [`Encoding::count_cached`].
pub static COUNT_CACHE: std::sync::LazyLock<CountCache> =
    std::sync::LazyLock::new(|| CountCache::new(CACHE_GENERATION_ENTRIES));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_keys_follow_text_encoding_and_secret() {
        let (o, c) = (Encoding::O200kBase, Encoding::Cl100kBase);
        let s1 = [7u8; 16];
        let mut s2 = s1;
        s2[15] ^= 1;
        let a = "x".repeat(300);
        let b = format!("{}y", "x".repeat(299));
        let k = store_key(&s1, o, &a);
        assert_eq!(k, store_key(&s1, o, &a), "stable");
        assert_ne!(k, store_key(&s1, o, &b), "content");
        assert_ne!(k, store_key(&s1, c, &a), "encoding");
        assert_ne!(k, store_key(&s2, o, &a), "secret");
        // Counts handed back from a store reach the process cache, per encoding.
        let t = format!("{a} {}", std::process::id());
        let (key, hit) = o.cache_lookup(&t);
        assert!(key.is_some() && hit.is_none());
        remember_count(key, 12345);
        assert_eq!(o.cache_lookup(&t).1, Some(12345));
        assert_eq!(c.cache_lookup(&t).1, None);
        assert_eq!(o.count_cached(&t).unwrap(), 12345);
        assert_eq!(o.cache_lookup("short"), (None, None));
    }

    #[test]
    fn no_encoding_reads_anothers_stored_counts() {
        // A new encoding (gemma3) needs no new key version: its name is in every key, so no
        // count stored under another encoding (or before it existed) is ever read for it.
        let secret = [3u8; 16];
        let text = "x".repeat(300);
        let keys: std::collections::HashSet<[u8; 16]> = Encoding::ALL
            .iter()
            .map(|&e| store_key(&secret, e, &text))
            .collect();
        assert_eq!(keys.len(), Encoding::ALL.len());
        let cache: std::collections::HashSet<CacheKey> = Encoding::ALL
            .iter()
            .map(|&e| CacheKey::new(e, &text))
            .collect();
        assert_eq!(cache.len(), Encoding::ALL.len());
    }

    #[test]
    fn count_cache_is_content_addressed_per_encoding_and_bounded() {
        let a = "some long tool output ".repeat(40);
        let b = "some long tool output!".repeat(40);
        let o = Encoding::O200kBase;
        let c = Encoding::Cl100kBase;
        assert_eq!(o.count_cached(&a).unwrap(), o.count(&a).unwrap());
        assert_eq!(o.count_cached(&a).unwrap(), o.count(&a).unwrap());
        assert_eq!(o.count_cached(&b).unwrap(), o.count(&b).unwrap());
        assert_ne!(o.count_cached(&a).unwrap(), o.count_cached(&b).unwrap());
        assert_ne!(CacheKey::new(o, &a), CacheKey::new(c, &a));
        assert_eq!(c.count_cached(&a).unwrap(), c.count(&a).unwrap());
        let cache = CountCache::new(10);
        for i in 0..1000u64 {
            cache.insert(CacheKey::new(o, &format!("{i}{a}")), i);
            assert!(cache.len() <= 20);
        }
        // Recent entries are still there, old ones are gone.
        assert_eq!(cache.get(&CacheKey::new(o, &format!("999{a}"))), Some(999));
        assert_eq!(cache.get(&CacheKey::new(o, &format!("0{a}"))), None);
    }

    /// A context message's shape: sections of recalled turns under headers that change
    /// from turn to turn.
    fn tagged(turn: usize, passages: &[usize]) -> String {
        let mut text = String::from("You are a helpful assistant.\n\n<recalled_turns>\n");
        for &p in passages {
            text.push_str(&format!(
                "<turn when=\"earlier in this session, {} turns ago\">\nuser: passage {p} \
                 about the zephyr build, line one of many words\nand line two, {p}.\n</turn>\n",
                turn.saturating_sub(p)
            ));
        }
        text.push_str("</recalled_turns>");
        text
    }

    #[test]
    fn tagged_texts_count_line_by_line_exactly_and_share_their_lines() {
        for enc in Encoding::ALL {
            let first = tagged(40, &(0..30).collect::<Vec<_>>());
            let starts = enc.tagged_lines(&first);
            let whole = enc.count_whole(&first).unwrap();
            if let Some(starts) = &starts {
                assert_eq!(enc.count_lines(&first, starts).unwrap(), whole);
            }
            assert_eq!(enc.count_cached(&first).unwrap(), whole, "{}", enc.name());
        }
        let o = Encoding::O200kBase;
        let first = tagged(40, &(0..30).collect::<Vec<_>>());
        assert!(o.tagged_lines(&first).is_some_and(|s| s.len() > 60));
        o.count_cached(&first).unwrap();
        // The next turn: other headers, some passages dropped, one added; its passages'
        // lines were counted with the first text (the fast path: found in the cache).
        let next = tagged(41, &(5..31).collect::<Vec<_>>());
        let line = "user: passage 12 about the zephyr build, line one of many words\n";
        assert!(next.contains(line));
        assert_eq!(o.cache_lookup(line).1, Some(o.count(line).unwrap()));
        assert_eq!(
            o.count_cached(&next).unwrap(),
            o.count_whole(&next).unwrap()
        );
        // Not tagged blocks: short, or too few tags.
        assert!(o.tagged_lines(&tagged(5, &[1, 2])).is_none());
        let plain = "word and line\n".repeat(200);
        assert!(o.tagged_lines(&plain).is_none());
    }
}
