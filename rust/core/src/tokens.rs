//! Token counting: encodings (tiktoken-rs), model -> encoding, and the item cost model.
//!
//! # Cost model
//!
//! The cost of one item is
//!
//! ```text
//! ITEM_OVERHEAD + tokens(canonical_text(item)) + media tokens
//! ```
//!
//! * `ITEM_OVERHEAD` (4 tokens) stands for the framing the provider adds around every input
//!   item (role / type markers and separators).
//! * `canonical_text` renders every provider-bound field of the item as plain text: an object
//!   becomes one `key: value` line per field (keys sorted, so equal content always renders
//!   the same text whatever the key order of the caller's dict), an array one line
//!   per element, a string is written raw (not JSON-escaped), numbers, booleans and null as
//!   JSON literals. Fields the Agents SDK strips before sending (`provider_data`,
//!   `created_by`, `_agents_*`, an `id` equal to `"__fake_id__"`) are not counted. The text is
//!   counted with the model's real encoding, so it counts structured content, tool-call
//!   arguments, ids and outputs — a conservative upper estimate of what the provider bills.
//! * Media parts are never counted as text: `input_image` (and `computer_screenshot`,
//!   Chat-style `image_url`) parts cost by OpenAI's published image rule for the tile-based
//!   models (GPT-4o, GPT-4.1, GPT-5, o-series): `detail: "low"` = 85 tokens; otherwise the
//!   image is scaled to fit 2048x2048, then its shortest side to 768, and costs
//!   `85 + 170 * tiles(512px)`. Dimensions are read from the header of a base64 data URL
//!   (PNG, JPEG, GIF, WebP, …); an image given by URL or file id costs the largest possible
//!   value (1445) because its size is unknown. `input_file` parts: a text-like file given
//!   inline is decoded and counted as text; a PDF costs, per page, a page image (765, a
//!   letter page at high detail) plus `PDF_TEXT_TOKENS_PER_PAGE`; a file by id/URL costs
//!   `UNKNOWN_FILE_TOKENS`. `input_audio` costs 10 tokens per second (duration from the WAV
//!   header, else from the size at 128 kbit/s).

use std::fmt;

use base64::Engine;
use serde_json::{Map, Value};
use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
use tiktoken_rs::CoreBPE;

/// Tokens added to every item for the provider's framing.
pub const ITEM_OVERHEAD: u64 = 4;
/// `detail: "low"` image cost, and the base cost of every high-detail image.
pub const IMAGE_BASE_TOKENS: u64 = 85;
/// Cost of one 512x512 tile of a high-detail image.
pub const IMAGE_TILE_TOKENS: u64 = 170;
/// Largest possible high-detail image cost (768x2048 after scaling: 8 tiles).
pub const IMAGE_MAX_TOKENS: u64 = IMAGE_BASE_TOKENS + 8 * IMAGE_TILE_TOKENS;
/// Page image of a PDF page (a letter page rendered at high detail: 4 tiles).
pub const PDF_PAGE_IMAGE_TOKENS: u64 = IMAGE_BASE_TOKENS + 4 * IMAGE_TILE_TOKENS;
/// Extracted text of one PDF page (a dense page of prose).
pub const PDF_TEXT_TOKENS_PER_PAGE: u64 = 1000;
/// A file whose bytes are not in the request (by `file_id` or `file_url`).
pub const UNKNOWN_FILE_TOKENS: u64 = 4096;
/// Audio tokens per second of input audio.
pub const AUDIO_TOKENS_PER_SECOND: f64 = 10.0;
/// Deepest nesting accepted inside one item.
pub const MAX_DEPTH: usize = 64;

/// Which encodings have been built (see [`Encoding::is_loaded`]).
static LOADED: [std::sync::atomic::AtomicBool; 6] = [
    std::sync::atomic::AtomicBool::new(false),
    std::sync::atomic::AtomicBool::new(false),
    std::sync::atomic::AtomicBool::new(false),
    std::sync::atomic::AtomicBool::new(false),
    std::sync::atomic::AtomicBool::new(false),
    std::sync::atomic::AtomicBool::new(false),
];

/// Runs every tokenizer build of the process (see [`set_build_guard`]).
static BUILD_GUARD: std::sync::OnceLock<fn(&dyn Fn())> = std::sync::OnceLock::new();

/// Run every later tokenizer build inside `guard`, which must call the closure it is given
/// exactly once. An embedding uses it to keep `fork` from copying a half-built tokenizer
/// into a child (whose first count would then wait forever): the Python binding holds a
/// lock around builds and takes the same lock before a fork. Returns false (and changes
/// nothing) if a guard was already set.
pub fn set_build_guard(guard: fn(&dyn Fn())) -> bool {
    BUILD_GUARD.set(guard).is_ok()
}

/// A tiktoken encoding shipped with tiktoken-rs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Encoding {
    O200kBase,
    O200kHarmony,
    Cl100kBase,
    P50kBase,
    P50kEdit,
    R50kBase,
}

/// Errors of the counting layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// The model name maps to no known encoding.
    UnknownModel(String),
    /// The encoding name is not one tiktoken-rs ships.
    UnknownEncoding(String),
    /// An item cannot be costed: `field` is a path inside the item.
    BadItem { field: String, message: String },
    /// The tokenizer failed on this text (it never panics through this API).
    Tokenizer(String),
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::UnknownModel(m) => write!(
                f,
                "unknown model {m:?}: no known tiktoken encoding; pass encoding= explicitly \
                 (one of {})",
                Encoding::ALL.map(|e| e.name()).join(", ")
            ),
            TokenError::UnknownEncoding(e) => write!(
                f,
                "unknown encoding {e:?}; expected one of {}",
                Encoding::ALL.map(|e| e.name()).join(", ")
            ),
            TokenError::BadItem { field, message } => write!(f, "field {field}: {message}"),
            TokenError::Tokenizer(m) => write!(f, "tokenizer failed: {m}"),
        }
    }
}

impl std::error::Error for TokenError {}

impl Encoding {
    /// Every encoding, default first.
    pub const ALL: [Encoding; 6] = [
        Encoding::O200kBase,
        Encoding::O200kHarmony,
        Encoding::Cl100kBase,
        Encoding::P50kBase,
        Encoding::P50kEdit,
        Encoding::R50kBase,
    ];

    /// The tiktoken name of the encoding.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::O200kHarmony => "o200k_harmony",
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::P50kBase => "p50k_base",
            Encoding::P50kEdit => "p50k_edit",
            Encoding::R50kBase => "r50k_base",
        }
    }

    /// Look an encoding up by its tiktoken name (`gpt2` is an alias of `r50k_base`).
    pub fn from_name(name: &str) -> Result<Encoding, TokenError> {
        let name = name.trim();
        Encoding::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .or((name == "gpt2").then_some(Encoding::R50kBase))
            .ok_or_else(|| TokenError::UnknownEncoding(name.to_string()))
    }

    /// The encoding of an OpenAI model name: gpt-5, gpt-4.1, gpt-4o and o-series use
    /// `o200k_base`; gpt-4 and gpt-3.5 use `cl100k_base`. A provider prefix such as
    /// `openai/` and fine-tune names (`ft:gpt-4o:…`) are understood.
    pub fn for_model(model: &str) -> Result<Encoding, TokenError> {
        let trimmed = model.trim();
        let bare = trimmed.strip_prefix("openai/").unwrap_or(trimmed);
        let tokenizer = get_tokenizer(bare).or_else(|| {
            // Bare o-series names with a suffix tiktoken-rs does not list (o1-pro, o3-deep-…).
            let lower = bare.to_ascii_lowercase();
            ["o1", "o3", "o4"]
                .iter()
                .any(|p| lower == *p || lower.starts_with(&format!("{p}-")))
                .then_some(Tokenizer::O200kBase)
        });
        match tokenizer {
            Some(Tokenizer::O200kBase) => Ok(Encoding::O200kBase),
            Some(Tokenizer::O200kHarmony) => Ok(Encoding::O200kHarmony),
            Some(Tokenizer::Cl100kBase) => Ok(Encoding::Cl100kBase),
            Some(Tokenizer::P50kBase) => Ok(Encoding::P50kBase),
            Some(Tokenizer::P50kEdit) => Ok(Encoding::P50kEdit),
            Some(Tokenizer::R50kBase) | Some(Tokenizer::Gpt2) => Ok(Encoding::R50kBase),
            None => Err(TokenError::UnknownModel(model.to_string())),
        }
    }

    /// Whether this encoding's tokenizer has been built in this process.
    pub fn is_loaded(self) -> bool {
        LOADED[self as usize].load(std::sync::atomic::Ordering::Acquire)
    }

    /// Build this encoding's tokenizer now (once per process; later calls return at once).
    pub fn load(self) {
        self.bpe();
    }

    /// The process-wide tokenizer, built lazily on first use (thread-safe, once), inside the
    /// guard given to [`set_build_guard`] if any.
    pub(crate) fn bpe(self) -> &'static CoreBPE {
        let loaded = &LOADED[self as usize];
        if !loaded.load(std::sync::atomic::Ordering::Acquire) {
            let build = || {
                self.singleton();
            };
            match BUILD_GUARD.get() {
                Some(guard) => guard(&build),
                None => build(),
            }
            loaded.store(true, std::sync::atomic::Ordering::Release);
        }
        self.singleton()
    }

    fn singleton(self) -> &'static CoreBPE {
        // tiktoken-rs singletons are `LazyLock`s: built once per process, on first use.
        match self {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::O200kHarmony => tiktoken_rs::o200k_harmony_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
            Encoding::P50kBase => tiktoken_rs::p50k_base_singleton(),
            Encoding::P50kEdit => tiktoken_rs::p50k_edit_singleton(),
            Encoding::R50kBase => tiktoken_rs::r50k_base_singleton(),
        }
    }

    /// Number of tokens of `text`, special-token text counted as ordinary text
    /// (equal to `len(tiktoken.get_encoding(name).encode_ordinary(text))`).
    ///
    /// Long texts are counted in segments of about [`SEGMENT_BYTES`] split only where every
    /// encoding's pre-tokenizer splits too (see [`is_exact_split`]), so the sum is exact; this
    /// bounds the work of the regex engine and of the BPE merge per segment. A text with no
    /// such point in the [`SPLIT_WINDOW`] bytes after a segment's target size (a run of one
    /// letter, of whitespace, of CJK text without ASCII punctuation) is cut every
    /// [`FORCED_SPLIT`] bytes instead, and segments with the same text are tokenised once per
    /// call, so such texts count in linear time (20 MB of one letter in a fraction of a second
    /// instead of 15 s). Only at such a forced split, or where the tokenizer fails on a
    /// segment and it is halved (see [`Encoding::count_segment`]), can the count differ from
    /// the reference, by about a token per split. Either way it lies within
    /// [`Encoding::count_bounds`] (every token covers 1 to `max_token_bytes` bytes).
    pub fn count(self, text: &str) -> Result<u64, TokenError> {
        self.count_with_segments(text, SEGMENT_BYTES, SPLIT_WINDOW)
    }

    /// The most bytes one token of this encoding covers (the longest entry of its
    /// vocabulary, special tokens excluded; checked against tiktoken-rs's vocabularies).
    pub fn max_token_bytes(self) -> u64 {
        match self {
            Encoding::O200kBase
            | Encoding::O200kHarmony
            | Encoding::Cl100kBase
            | Encoding::P50kBase
            | Encoding::P50kEdit
            | Encoding::R50kBase => 128,
        }
    }

    /// The fewest and most tokens any text of `text_bytes` bytes can count: every token
    /// covers at least one byte and at most [`Encoding::max_token_bytes`]. A count from
    /// outside (a persistent store) that lies outside is not a count of that text.
    pub fn count_bounds(self, text_bytes: usize) -> (u64, u64) {
        let n = text_bytes as u64;
        (n.div_ceil(self.max_token_bytes()), n)
    }

    /// Whether `count` can be the token count of `text` (see [`Encoding::count_bounds`]).
    pub fn count_is_possible(self, text: &str, count: u64) -> bool {
        let (low, high) = self.count_bounds(text.len());
        (low..=high).contains(&count)
    }

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

    /// Count `text` and keep the count under `key` (from [`Encoding::cache_lookup`]).
    pub fn count_and_remember(self, text: &str, key: Option<CacheKey>) -> Result<u64, TokenError> {
        let n = self.count(text)?;
        remember_count(key, n);
        Ok(n)
    }

    fn count_with_segments(
        self,
        text: &str,
        segment: usize,
        window: usize,
    ) -> Result<u64, TokenError> {
        if text.len() <= segment {
            return self.count_segment(text);
        }
        // Segments met earlier in this text (a forced split through a long run of one
        // character makes many equal ones). Keys are hashed with a random key: a text
        // cannot be built to make its segments collide.
        let mut seen: std::collections::HashMap<&str, u64> = Default::default();
        let mut total = 0u64;
        for part in segments(self, text, segment, window) {
            let n = match seen.get(part) {
                Some(&n) => n,
                None => {
                    let n = self.count_segment(part)?;
                    seen.insert(part, n);
                    n
                }
            };
            total = total.saturating_add(n);
        }
        Ok(total)
    }

    /// Number of tokens of `text` tokenised whole, without [`Encoding::count`]'s segments
    /// (slow for long texts: for comparisons and tests). Exact unless the tokenizer fails on
    /// the text, which is then halved as described at [`Encoding::count_segment`].
    pub fn count_whole(self, text: &str) -> Result<u64, TokenError> {
        self.count_segment(text)
    }

    /// Count one segment. A segment the tokenizer fails on (tiktoken-rs unwraps its regex
    /// engine's results, and a long run of whitespace exceeds that engine's limits) is halved
    /// at a character boundary until it can be counted; the failure is caught, never unwinds
    /// to a caller and prints nothing.
    fn count_segment(self, text: &str) -> Result<u64, TokenError> {
        if text.is_empty() {
            return Ok(0);
        }
        let bpe = self.bpe();
        match quietly(|| bpe.encode_ordinary(text).len() as u64) {
            Ok(n) => Ok(n),
            Err(payload) if text.len() >= 2 * MIN_FALLBACK_SPLIT => {
                drop(payload);
                let mut mid = text.len() / 2;
                while !text.is_char_boundary(mid) {
                    mid += 1;
                }
                let left = self.count_segment(&text[..mid])?;
                Ok(left.saturating_add(self.count_segment(&text[mid..])?))
            }
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "internal error".to_string());
                Err(TokenError::Tokenizer(msg))
            }
        }
    }
}

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

/// Target size of the segments a long text is counted in.
pub const SEGMENT_BYTES: usize = 64 * 1024;
/// How far past its target size a segment may run to end at an exact split point; with no
/// such point in this window it ends at its target size (see [`Encoding::count`]).
pub const SPLIT_WINDOW: usize = 64 * 1024;
/// Length of a segment cut where the text has no exact split point (see [`segments`]).
pub const FORCED_SPLIT: usize = 4 * 1024;
/// Smallest piece the fallback split produces.
const MIN_FALLBACK_SPLIT: usize = 1024;

/// Whether this encoding's pre-tokenizer splits `bytes` before position `i` too, so that
/// counting `bytes[..i]` and `bytes[i..]` apart gives the count of the whole. Such a point
/// is where a piece must end and the next one begins, with nothing on either side that a
/// pattern looks at across it:
///
/// * after `\n` followed by an ASCII letter or digit (a piece holding the newline ends
///   there, and no piece starting at a letter or digit looks behind). For the r50k / p50k
///   patterns the byte before the newline must not be whitespace: their `\s++$` would
///   take a whitespace run at the end of the left part whole, where the whole text's
///   `\s+(?!\S)` leaves its last character apart;
/// * after an ASCII letter followed by an ASCII digit or ASCII punctuation other than `'`
///   (a letter piece ends at the last letter unless a contraction `'s`, `'t`… follows);
/// * after an ASCII letter or digit followed by a space and an ASCII letter (the space
///   starts the next word's piece, ` word`).
///
/// In the last two the left part ends with a letter or digit, so no whitespace pattern
/// (`\s+(?!\S)`, `\s++$`) ends at the split. Tested on random texts for every encoding
/// against counting the whole.
pub fn is_exact_split(encoding: Encoding, bytes: &[u8], i: usize) -> bool {
    if i == 0 || i >= bytes.len() {
        return false;
    }
    let (before, at) = (bytes[i - 1], bytes[i]);
    let newline = before == b'\n'
        && at.is_ascii_alphanumeric()
        && match encoding {
            Encoding::O200kBase | Encoding::O200kHarmony | Encoding::Cl100kBase => true,
            Encoding::P50kBase | Encoding::P50kEdit | Encoding::R50kBase => {
                i >= 2 && bytes[i - 2].is_ascii_graphic()
            }
        };
    newline
        || (before.is_ascii_alphabetic()
            && (at.is_ascii_digit() || (at.is_ascii_punctuation() && at != b'\'')))
        || (before.is_ascii_alphanumeric()
            && at == b' '
            && bytes.get(i + 1).is_some_and(u8::is_ascii_alphabetic))
}

/// Split `text` into segments of about `target` bytes: each ends at the first exact split
/// point (see [`is_exact_split`]) at or after `target` bytes and within `window` more. Where
/// there is none, the text is split after [`FORCED_SPLIT`] bytes (the next character
/// boundary) instead: no segment is longer than `target + window` bytes plus a character,
/// and one with no exact point is short, which keeps the BPE merge of a long run of
/// letters fast (it is O(n log n) in the length of a pre-tokenizer piece).
pub(crate) fn segments(
    encoding: Encoding,
    text: &str,
    target: usize,
    window: usize,
) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let target = target.max(1);
    let forced_len = FORCED_SPLIT.min(target);
    let mut start = 0usize;
    // No exact point lies in `..scanned` beyond what a segment ended at.
    let mut scanned = 0usize;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        let begin = start;
        let mut end = bytes.len();
        if end - begin > target {
            let first = (begin + target).max(scanned);
            let last = (begin + target + window).min(bytes.len());
            let exact = (first..last).find(|&i| is_exact_split(encoding, bytes, i));
            scanned = scanned.max(last);
            end = match exact {
                Some(i) => i,
                None if end - begin > target + window => begin + forced_len,
                None => end,
            };
            while !text.is_char_boundary(end) {
                end += 1;
            }
        }
        start = end;
        Some(&text[begin..end])
    })
}

thread_local! {
    /// Set while this thread runs tokenizer code whose panic is caught and handled.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f`, catching a panic without printing it: the process's panic hook is wrapped
/// once so that it stays silent for panics on a thread inside this call (any other panic
/// is reported by the previous hook as before).
pub fn quietly<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> std::thread::Result<R> {
    static WRAPPED: std::sync::Once = std::sync::Once::new();
    WRAPPED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let result = std::panic::catch_unwind(f);
    QUIET.with(|q| q.set(was));
    result
}

/// The cost of one item, split by source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemCost {
    /// Tokens of the canonical text.
    pub text: u64,
    /// Tokens of images, files and audio.
    pub media: u64,
    /// The fixed per-item overhead.
    pub overhead: u64,
}

impl ItemCost {
    /// The three parts added up (saturating: a cost never wraps around to a small one).
    pub fn total(&self) -> u64 {
        self.text
            .saturating_add(self.media)
            .saturating_add(self.overhead)
    }
}

/// Text and media of an item in the canonical form described in the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Canonical {
    pub text: String,
    pub media_tokens: u64,
}

/// Render an item into its canonical text (plus media tokens, costed by the published rules).
pub fn canonical(item: &Value, enc: Encoding) -> Result<Canonical, TokenError> {
    let Value::Object(map) = item else {
        return Err(TokenError::BadItem {
            field: "(item)".to_string(),
            message: "an item must be a JSON object".to_string(),
        });
    };
    let mut out = Canonical::default();
    let mut path = String::new();
    render_object(map, true, enc, &mut out, &mut path, 0)?;
    Ok(out)
}

/// The full cost of one item with the given encoding.
pub fn item_cost(item: &Value, enc: Encoding) -> Result<ItemCost, TokenError> {
    let c = canonical(item, enc)?;
    Ok(c.cost(enc.count_cached(&c.text)?))
}

impl Canonical {
    /// The item's cost given the token count of [`Canonical::text`].
    pub fn cost(&self, text_tokens: u64) -> ItemCost {
        ItemCost {
            text: text_tokens,
            media: self.media_tokens,
            overhead: ITEM_OVERHEAD,
        }
    }
}

fn is_stripped_top_level(key: &str, value: &Value) -> bool {
    key == "provider_data"
        || key == "created_by"
        || key.starts_with("_agents_")
        || (key == "id" && value.as_str() == Some("__fake_id__"))
}

fn push_path(path: &mut String, key: &str) -> usize {
    let len = path.len();
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
    len
}

fn render_object(
    map: &Map<String, Value>,
    top: bool,
    enc: Encoding,
    out: &mut Canonical,
    path: &mut String,
    depth: usize,
) -> Result<(), TokenError> {
    if depth > MAX_DEPTH {
        return Err(TokenError::BadItem {
            field: if path.is_empty() {
                "(item)".into()
            } else {
                path.clone()
            },
            message: format!("nesting deeper than {MAX_DEPTH} levels"),
        });
    }
    if let Some(media) = media_cost(map, enc, path)? {
        out.media_tokens = out.media_tokens.saturating_add(media);
        return Ok(());
    }
    for (key, value) in map {
        if top && is_stripped_top_level(key, value) {
            continue;
        }
        let saved = push_path(path, key);
        out.text.push_str(key);
        out.text.push_str(": ");
        render_value(value, enc, out, path, depth + 1)?;
        out.text.push('\n');
        path.truncate(saved);
    }
    Ok(())
}

fn render_value(
    value: &Value,
    enc: Encoding,
    out: &mut Canonical,
    path: &mut String,
    depth: usize,
) -> Result<(), TokenError> {
    match value {
        Value::String(s) => out.text.push_str(s),
        Value::Null => out.text.push_str("null"),
        Value::Bool(b) => out.text.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.text.push_str(&n.to_string()),
        Value::Array(items) => {
            if depth > MAX_DEPTH {
                return Err(TokenError::BadItem {
                    field: path.clone(),
                    message: format!("nesting deeper than {MAX_DEPTH} levels"),
                });
            }
            for (i, v) in items.iter().enumerate() {
                let saved = path.len();
                path.push_str(&format!("[{i}]"));
                if i > 0 {
                    out.text.push('\n');
                }
                render_value(v, enc, out, path, depth + 1)?;
                path.truncate(saved);
            }
        }
        Value::Object(map) => render_object(map, false, enc, out, path, depth)?,
    }
    Ok(())
}

/// Media parts: `Some(tokens)` when `map` is an image, file or audio part.
fn media_cost(
    map: &Map<String, Value>,
    enc: Encoding,
    path: &str,
) -> Result<Option<u64>, TokenError> {
    let ty = map.get("type").and_then(Value::as_str).unwrap_or("");
    match ty {
        "input_image" | "computer_screenshot" => {
            let detail = map.get("detail").and_then(Value::as_str);
            let url = map.get("image_url").and_then(Value::as_str);
            Ok(Some(image_tokens(detail, url)))
        }
        "image_url" => {
            // Chat Completions shape: {"type":"image_url","image_url":{"url":…,"detail":…}}
            let inner = map.get("image_url");
            let url = inner
                .and_then(|v| v.get("url").and_then(Value::as_str))
                .or_else(|| inner.and_then(Value::as_str));
            let detail = inner.and_then(|v| v.get("detail").and_then(Value::as_str));
            Ok(Some(image_tokens(detail, url)))
        }
        "input_file" => {
            let filename = map.get("filename").and_then(Value::as_str);
            let data = map.get("file_data").and_then(Value::as_str);
            Ok(Some(file_tokens(filename, data, enc, path)?))
        }
        "input_audio" => {
            let data = map
                .get("input_audio")
                .and_then(|v| v.get("data"))
                .or_else(|| map.get("data"))
                .and_then(Value::as_str);
            Ok(Some(audio_tokens(data)))
        }
        _ => Ok(None),
    }
}

/// Split a `data:<mime>;base64,<payload>` URL.
fn split_data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, payload) = rest.split_once(',')?;
    let mime = meta.strip_suffix(";base64")?;
    Some((mime, payload))
}

/// Decode at most `max_chars` base64 characters from the start of `payload`.
fn decode_prefix(payload: &str, max_chars: usize) -> Option<Vec<u8>> {
    let cleaned: String = payload
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .take(max_chars)
        .collect();
    let usable = cleaned.len() - cleaned.len() % 4;
    let engine = base64::engine::general_purpose::STANDARD;
    engine
        .decode(&cleaned[..usable])
        .ok()
        .or_else(|| engine.decode(cleaned[..usable].trim_end_matches('=')).ok())
}

/// Decode a whole base64 payload (standard or URL-safe alphabet, padding optional).
fn decode_all(payload: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let cleaned: String = payload
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(&cleaned).ok())
}

/// High-detail cost of an image of `width` x `height` pixels (tile-based models).
pub fn image_tokens_for_size(width: u64, height: u64) -> u64 {
    if width == 0 || height == 0 {
        return IMAGE_BASE_TOKENS;
    }
    let (mut w, mut h) = (width as f64, height as f64);
    let longest = w.max(h);
    if longest > 2048.0 {
        let s = 2048.0 / longest;
        w *= s;
        h *= s;
    }
    let shortest = w.min(h);
    if shortest > 768.0 {
        let s = 768.0 / shortest;
        w *= s;
        h *= s;
    }
    let tiles = (w / 512.0).ceil().max(1.0) * (h / 512.0).ceil().max(1.0);
    IMAGE_BASE_TOKENS + IMAGE_TILE_TOKENS * tiles as u64
}

/// Cost of an image part by its detail level and (when inline) its real size.
pub fn image_tokens(detail: Option<&str>, url: Option<&str>) -> u64 {
    if detail == Some("low") {
        return IMAGE_BASE_TOKENS;
    }
    let size = url
        .and_then(split_data_url)
        // JPEG headers can sit behind large EXIF blocks; 256 KiB of base64 covers them.
        .and_then(|(_, payload)| decode_prefix(payload, 256 * 1024))
        .and_then(|bytes| imagesize::blob_size(&bytes).ok());
    match size {
        Some(s) => image_tokens_for_size(s.width as u64, s.height as u64),
        None => IMAGE_MAX_TOKENS,
    }
}

fn is_text_mime(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/xml"
                | "application/x-yaml"
                | "application/yaml"
                | "application/javascript"
                | "application/x-python"
                | "application/sql"
        )
}

fn file_tokens(
    filename: Option<&str>,
    data: Option<&str>,
    enc: Encoding,
    path: &str,
) -> Result<u64, TokenError> {
    let Some(data) = data else {
        return Ok(UNKNOWN_FILE_TOKENS);
    };
    let (mime, payload) = split_data_url(data).unwrap_or(("", data));
    let bytes = match decode_all(payload) {
        Some(b) => b,
        None => {
            return Err(TokenError::BadItem {
                field: format!("{path}.file_data"),
                message: "file_data is not valid base64".to_string(),
            })
        }
    };
    let name = filename.unwrap_or("").to_ascii_lowercase();
    if mime == "application/pdf" || name.ends_with(".pdf") || bytes.starts_with(b"%PDF") {
        let pages = count_pdf_pages(&bytes).max(1);
        return Ok(pages * (PDF_PAGE_IMAGE_TOKENS + PDF_TEXT_TOKENS_PER_PAGE));
    }
    if is_text_mime(mime) || std::str::from_utf8(&bytes).is_ok() {
        let text = String::from_utf8_lossy(&bytes);
        return enc.count(&text);
    }
    Ok(UNKNOWN_FILE_TOKENS)
}

/// Count `/Type /Page` objects (not `/Pages`) in a PDF.
fn count_pdf_pages(bytes: &[u8]) -> u64 {
    let needle = b"/Type";
    let mut pages = 0;
    let mut i = 0;
    while i + needle.len() <= bytes.len() {
        if &bytes[i..i + needle.len()] == needle {
            let mut j = i + needle.len();
            while j < bytes.len() && bytes[j].is_ascii_whitespace() {
                j += 1;
            }
            if bytes[j..].starts_with(b"/Page") && !bytes[j..].starts_with(b"/Pages") {
                pages += 1;
            }
            i = j;
        } else {
            i += 1;
        }
    }
    pages
}

fn audio_tokens(data: Option<&str>) -> u64 {
    let Some(data) = data else {
        return (60.0 * AUDIO_TOKENS_PER_SECOND) as u64;
    };
    let payload = split_data_url(data).map(|(_, p)| p).unwrap_or(data);
    let approx_bytes = (payload.len() as f64 * 3.0 / 4.0).max(1.0);
    let byte_rate = decode_prefix(payload, 64)
        .filter(|h| h.len() >= 32 && &h[0..4] == b"RIFF" && &h[8..12] == b"WAVE")
        .map(|h| u32::from_le_bytes([h[28], h[29], h[30], h[31]]) as f64)
        .filter(|r| *r > 0.0)
        .unwrap_or(16_000.0);
    (approx_bytes / byte_rate * AUDIO_TOKENS_PER_SECOND).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn model_names_map_to_encodings() {
        for m in [
            "gpt-5",
            "gpt-5-mini",
            "gpt-5.1",
            "gpt-4.1",
            "gpt-4.1-nano",
            "gpt-4o",
            "gpt-4o-2024-08-06",
            "o1",
            "o3",
            "o3-mini",
            "o4-mini",
            "o1-pro",
            "openai/gpt-4o",
            "ft:gpt-4o-mini-2024-07-18:org::abc",
        ] {
            assert_eq!(Encoding::for_model(m), Ok(Encoding::O200kBase), "{m}");
        }
        for m in ["gpt-4", "gpt-4-0613", "gpt-3.5-turbo", "gpt-3.5-turbo-0125"] {
            assert_eq!(Encoding::for_model(m), Ok(Encoding::Cl100kBase), "{m}");
        }
        let err = Encoding::for_model("llama-3").unwrap_err();
        assert!(err.to_string().contains("llama-3"));
        assert!(err.to_string().contains("encoding="));
    }

    #[test]
    fn encoding_names() {
        for e in Encoding::ALL {
            assert_eq!(Encoding::from_name(e.name()), Ok(e));
        }
        assert_eq!(Encoding::from_name("gpt2"), Ok(Encoding::R50kBase));
        assert!(Encoding::from_name("o300k").is_err());
    }

    #[test]
    fn known_counts() {
        // Reference counts from openai/tiktoken 0.12 (`len(enc.encode_ordinary(text))`).
        let cases: [(&str, u64, u64); 7] = [
            ("hello world", 2, 2),
            ("tiktoken is great!", 6, 6),
            ("Привет, мир! Как дела?", 8, 12),
            ("def f(x):\n    return x**2\n", 10, 10),
            ("<|endoftext|>", 7, 7),
            ("🙂👍🏽 emoji", 5, 9),
            ("   \n\n\t  spaces", 3, 3),
        ];
        for (text, o200k, cl100k) in cases {
            assert_eq!(Encoding::O200kBase.count(text).unwrap(), o200k, "{text:?}");
            assert_eq!(
                Encoding::Cl100kBase.count(text).unwrap(),
                cl100k,
                "{text:?}"
            );
        }
        assert_eq!(Encoding::O200kBase.count("").unwrap(), 0);
    }

    /// Random texts over fragments that stress the pre-tokenizers' boundaries: words,
    /// contractions, digits, punctuation and JSON, whitespace runs, newlines, combining marks,
    /// non-Latin letters.
    fn random_texts(rounds: usize) -> Vec<String> {
        let words = [
            "alpha",
            " beta",
            "\n",
            "\n\n",
            "  ",
            "/path",
            "x/y",
            "42",
            "1234",
            ".\n",
            "Привет",
            "\t",
            "'s",
            "don't",
            "\r\n",
            "a\nb",
            "\n/",
            "?!",
            "🙂",
            "    indent",
            "{\"k\":",
            "\"v\",",
            "}",
            "[1,",
            "2]",
            "ABC",
            "x1",
            "Id",
            "'S",
            "n't",
            "  x",
            "e\u{301}",
            "é",
            "日本語",
            "。",
            "0.5",
            "-",
            "_x",
            "a_b",
            "U.S.",
            " I'm",
            "\u{a0}",
            "`code`",
        ];
        let mut seed = 7u64;
        (0..rounds)
            .map(|round| {
                let mut text = String::new();
                for _ in 0..(20 + round % 60) {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    text.push_str(words[(seed >> 33) as usize % words.len()]);
                }
                text
            })
            .collect()
    }

    #[test]
    fn exact_split_points_split_every_encoding() {
        let mut points = 0;
        for text in random_texts(200) {
            let bytes = text.as_bytes();
            for enc in Encoding::ALL {
                let whole = enc.count_segment(&text).unwrap();
                for i in (1..bytes.len()).filter(|&i| is_exact_split(enc, bytes, i)) {
                    points += 1;
                    let parts = enc.count_segment(&text[..i]).unwrap()
                        + enc.count_segment(&text[i..]).unwrap();
                    assert_eq!(parts, whole, "{} at {i}: {text:?}", enc.name());
                }
            }
        }
        assert!(points > 10_000, "{points} split points tried");
    }

    #[test]
    fn segmented_counting_is_exact() {
        for text in random_texts(200) {
            for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
                let whole = enc.count_segment(&text).unwrap();
                for target in [1, 3, 8, 17] {
                    // A window as long as the text: every segment ends at an exact point.
                    assert_eq!(
                        enc.count_with_segments(&text, target, text.len()).unwrap(),
                        whole,
                        "{text:?} target {target}"
                    );
                }
            }
        }
    }

    #[test]
    fn forced_splits_stay_close_and_within_bounds() {
        let mixed = random_texts(40).concat();
        for text in [
            "a".repeat(5000),
            " ".repeat(5000),
            "ab".repeat(2500),
            "日本語".repeat(500),
            "1".repeat(5000),
            " \t\n".repeat(2000),
            mixed,
        ] {
            for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
                let whole = enc.count_segment(&text).unwrap();
                for (target, window) in [(64, 16), (100, 0), (1000, 1)] {
                    let n = enc.count_with_segments(&text, target, window).unwrap();
                    let (low, high) = enc.count_bounds(text.len());
                    assert!(low <= n && n <= high, "{n} outside {low}..={high}");
                    // A forced split can cost a token or two on each side of it.
                    let splits = (text.len() / target.min(FORCED_SPLIT)) as u64;
                    assert!(n.abs_diff(whole) <= 2 * splits + 2, "{n} vs {whole}");
                }
            }
        }
    }

    #[test]
    fn max_token_bytes_is_the_longest_vocabulary_entry() {
        for enc in Encoding::ALL {
            let bpe = enc.bpe();
            let special: std::collections::HashSet<Vec<u8>> = bpe
                .special_tokens()
                .iter()
                .map(|t| t.as_bytes().to_vec())
                .collect();
            let mut longest = 0;
            let mut tokens = 0;
            for rank in 0..400_000u32 {
                if let Ok(b) = bpe.decode_bytes(&[rank]) {
                    if !special.contains(&b) {
                        tokens += 1;
                        longest = longest.max(b.len() as u64);
                    }
                }
            }
            assert!(tokens > 50_000, "{}: {tokens} tokens", enc.name());
            assert_eq!(enc.max_token_bytes(), longest, "{}", enc.name());
        }
    }

    #[test]
    fn counts_outside_the_byte_bounds_are_impossible() {
        let e = Encoding::O200kBase;
        let text = "word ".repeat(100); // 500 bytes: 1 token covers at most 128 of them
        let n = e.count(&text).unwrap();
        assert!(e.count_is_possible(&text, n));
        assert_eq!(e.count_bounds(500), (4, 500));
        for bad in [0, 1, 3, 501, u64::MAX] {
            assert!(!e.count_is_possible(&text, bad), "{bad}");
        }
        assert!(e.count_is_possible("", 0));
        assert!(!e.count_is_possible("", 1));
        for text in random_texts(50) {
            for enc in Encoding::ALL {
                assert!(enc.count_is_possible(&text, enc.count(&text).unwrap()));
            }
        }
    }

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

    #[test]
    fn pathological_texts_do_not_fail() {
        // A megabyte of spaces overflows the regex engine's limits in tiktoken itself:
        // whole, it is halved until it counts; split into segments it never fails.
        let spaces = " ".repeat(1 << 20);
        let halved = Encoding::O200kBase.count_segment(&spaces).unwrap();
        let n = Encoding::O200kBase.count(&spaces).unwrap();
        assert!(n > 0 && n < 20_000, "{n}");
        assert!(n.abs_diff(halved) <= 64, "{n} vs {halved}");
        let letters = "a".repeat(1 << 20);
        assert_eq!(
            Encoding::O200kBase.count(&letters).unwrap(),
            Encoding::O200kBase.count_segment(&letters).unwrap()
        );
        let lines = "word and more words\n".repeat(50_000);
        let whole = Encoding::O200kBase.count_segment(&lines).unwrap();
        assert_eq!(Encoding::O200kBase.count(&lines).unwrap(), whole);
    }

    #[test]
    fn canonical_text_and_stripped_fields() {
        let item = json!({
            "type": "function_call", "call_id": "c1", "name": "f",
            "arguments": "{\"a\":1}", "provider_data": {"x": "y"}, "id": "__fake_id__",
            "_agents_tool_title": "t", "created_by": "me"
        });
        let c = canonical(&item, Encoding::O200kBase).unwrap();
        assert_eq!(
            c.text,
            "arguments: {\"a\":1}\ncall_id: c1\nname: f\ntype: function_call\n"
        );
        let msg = json!({"role": "user", "content": [
            {"type": "input_text", "text": "hi"}, {"type": "input_text", "text": "there"}]});
        let c = canonical(&msg, Encoding::O200kBase).unwrap();
        assert_eq!(
            c.text,
            "content: text: hi\ntype: input_text\n\ntext: there\ntype: input_text\n\nrole: user\n"
        );
        let cost = item_cost(&msg, Encoding::O200kBase).unwrap();
        assert_eq!(cost.overhead, ITEM_OVERHEAD);
        assert_eq!(
            cost.text,
            Encoding::O200kBase.count(&c.text).unwrap(),
            "text cost is the count of the canonical text"
        );
    }

    #[test]
    fn image_rules() {
        assert_eq!(image_tokens(Some("low"), None), 85);
        assert_eq!(image_tokens(Some("high"), Some("https://x/y.png")), 1445);
        // Published examples: 1024x1024 high -> 765; 2048x4096 -> 1105.
        assert_eq!(image_tokens_for_size(1024, 1024), 765);
        assert_eq!(image_tokens_for_size(2048, 4096), 1105);
        assert_eq!(image_tokens_for_size(512, 512), 255);
        // A real 1x1 PNG inline: one tile.
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
        let url = format!("data:image/png;base64,{png}");
        assert_eq!(image_tokens(Some("auto"), Some(&url)), 255);
        let part = json!({"role":"user","content":[{"type":"input_image","image_url": url, "detail":"high"}]});
        let c = canonical(&part, Encoding::O200kBase).unwrap();
        assert_eq!(c.media_tokens, 255);
        assert!(!c.text.contains("iVBOR"), "base64 is never counted as text");
    }

    #[test]
    fn file_rules() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let text = b64.encode("hello world");
        let item = json!({"type":"input_file","filename":"a.txt","file_data": format!("data:text/plain;base64,{text}")});
        let c = canonical(
            &json!({"role":"user","content":[item]}),
            Encoding::O200kBase,
        )
        .unwrap();
        assert_eq!(c.media_tokens, 2);
        let pdf = b64.encode(b"%PDF-1.4 1 0 obj << /Type /Pages /Count 2 >> 2 0 obj << /Type /Page >> 3 0 obj << /Type/Page >>");
        let item = json!({"type":"input_file","filename":"a.pdf","file_data": format!("data:application/pdf;base64,{pdf}")});
        let c = canonical(
            &json!({"role":"user","content":[item]}),
            Encoding::O200kBase,
        )
        .unwrap();
        assert_eq!(
            c.media_tokens,
            2 * (PDF_PAGE_IMAGE_TOKENS + PDF_TEXT_TOKENS_PER_PAGE)
        );
        let item = json!({"type":"input_file","file_id":"file_1"});
        let c = canonical(
            &json!({"role":"user","content":[item]}),
            Encoding::O200kBase,
        )
        .unwrap();
        assert_eq!(c.media_tokens, UNKNOWN_FILE_TOKENS);
        let bad = json!({"type":"input_file","file_data":"data:application/pdf;base64,@@@@"});
        let err =
            canonical(&json!({"role":"user","content":[bad]}), Encoding::O200kBase).unwrap_err();
        assert!(err.to_string().contains("content[0].file_data"), "{err}");
    }

    #[test]
    fn deep_nesting_is_an_error() {
        let mut v = json!("leaf");
        for _ in 0..(MAX_DEPTH + 5) {
            v = json!({ "k": v });
        }
        let err = canonical(&json!({"type":"x","output": v}), Encoding::O200kBase).unwrap_err();
        assert!(matches!(err, TokenError::BadItem { .. }));
    }
}
