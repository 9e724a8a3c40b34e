//! Token counting: encodings (tiktoken-rs), model -> encoding, and the item cost model.
//!
//! # Cost model
//!
//! The cost of one item is
//!
//! ```text
//! ITEM_OVERHEAD + tokens(canonical_text(item)) + media tokens + opaque tokens
//! ```
//!
//! * `ITEM_OVERHEAD` (4 tokens) stands for the framing the provider adds around every input
//!   item (role / type markers and separators); the open-weight families' chat templates
//!   take more for some ([`Encoding::item_overhead`]: 5 for Llama 3, Qwen and Gemma 3).
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
//! * Opaque payloads are never counted as text either: the base64 `encrypted_content` of
//!   `reasoning` and `compaction` items, which the provider decrypts back into tokens, costs
//!   its decoded size less a 650-byte envelope at 4 bytes per token plus 25%
//!   ([`opaque_tokens`], the estimate of OpenAI's Codex agent with a margin); an
//!   `image_generation_call`'s base64 `result` costs as an image. Such a payload that is not
//!   valid base64 is counted as text (conservative) and the cost says so
//!   ([`ItemCost::fallback`]). The opaque part alone may be calibrated ([`OpaqueScale`]); the
//!   rule's version is [`COST_RULE`]. Rule, source and uncertainty: `docs/cost-model.md`.
//!
//! # Modules
//!
//! * `encoding`: the encodings (OpenAI's and the open-weight families'), the lazily built
//!   tokenizers.
//! * `models`: model names as users write them -> encoding.
//! * `count`: exact counting of long texts in bounded segments ([`Encoding::count`]).
//! * `cache`: the process-wide count cache and the keys of a persistent count store.
//! * `canonical`: the canonical text of an item.
//! * `media`: image, file and audio costs.
//! * `opaque`: opaque payloads (decoded size), the cost rule's version, calibration scales.
//! * `spm`: SentencePiece BPE on Gemma 3's compiled-in model (`gemma3`).

use std::fmt;

use serde_json::Value;

mod cache;
mod canonical;
mod count;
mod encoding;
mod media;
mod models;
mod opaque;
mod spm;

pub use cache::{
    remember_count, store_key, CacheKey, CountCache, CACHE_GENERATION_ENTRIES, CACHE_MIN_BYTES,
    COUNT_CACHE, STORE_KEY_VERSION, STORE_MIN_BYTES, TAGGED_MIN_BYTES, TAGGED_MIN_TAGS,
};
pub use canonical::{canonical, Canonical};
pub(crate) use count::segments;
pub use count::{
    fail_next_counts, is_exact_split, quietly, FORCED_SPLIT, SEGMENT_BYTES, SPLIT_WINDOW,
};
pub(crate) use encoding::Bpe;
pub use encoding::{set_build_guard, Encoding, Loading};
pub use media::{
    image_tokens, image_tokens_for_size, AUDIO_TOKENS_PER_SECOND, IMAGE_BASE_TOKENS,
    IMAGE_MAX_TOKENS, IMAGE_TILE_TOKENS, PDF_PAGE_IMAGE_TOKENS, PDF_TEXT_TOKENS_PER_PAGE,
    UNKNOWN_FILE_TOKENS,
};
pub use models::strips_earlier_thinking;
pub use opaque::{
    decoded_len, opaque_tokens, OpaqueScale, COST_RULE, COST_RULE_COMPATIBLE,
    OPAQUE_BYTES_PER_TOKEN, OPAQUE_ENVELOPE_BYTES, OPAQUE_MARGIN_PERCENT,
};

/// Tokens added to every item for the provider's framing under OpenAI's encodings, and the
/// least under any encoding ([`Encoding::item_overhead`]).
pub const ITEM_OVERHEAD: u64 = 4;
/// Deepest nesting accepted inside one item.
pub const MAX_DEPTH: usize = 64;

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

/// What a cost is counted under: the model's encoding and its calibration
/// ([`OpaqueScale::ONE`]: none). An [`Encoding`] alone is the basis without calibration.
///
/// The calibration scales the opaque part of a cost under a tokenizer's own encoding, and
/// the whole cost under an estimate ([`Encoding::is_estimate`]: Claude's, whose error is in
/// every token, not only in opaque payloads; see [`CostBasis::cost`]). Under an estimate it
/// is never below [`CostBasis::MIN_ESTIMATE_SCALE`] ([`CostBasis::checked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CostBasis {
    pub encoding: Encoding,
    pub opaque_scale: OpaqueScale,
}

impl CostBasis {
    /// The smallest calibration of an estimate's whole cost: one half, the base encoding's
    /// own count (the Claude estimate counts two tokens per `o200k_base` token), so that a
    /// calibrated item still costs at least [`ITEM_OVERHEAD`].
    pub const MIN_ESTIMATE_SCALE: OpaqueScale = OpaqueScale::HALF;

    /// The basis of `encoding` and `scale`; the error says why a calibration below
    /// [`CostBasis::MIN_ESTIMATE_SCALE`] is refused under an estimate.
    pub fn checked(encoding: Encoding, scale: OpaqueScale) -> Result<CostBasis, String> {
        if encoding.is_estimate() && scale < Self::MIN_ESTIMATE_SCALE {
            return Err(format!(
                "opaque_scale under {} (an estimate: it scales the whole cost) must be at \
                 least {}, got {}",
                encoding.name(),
                Self::MIN_ESTIMATE_SCALE.factor(),
                scale.factor()
            ));
        }
        Ok(CostBasis {
            encoding,
            opaque_scale: scale,
        })
    }

    /// Whether the calibration scales the whole cost (an estimate's) rather than its opaque
    /// part.
    pub fn scales_whole(&self) -> bool {
        self.encoding.is_estimate()
    }

    /// What `cost` counts under this basis: its total with the opaque part scaled, or under
    /// an estimate the whole total scaled (rounded up).
    pub fn cost(&self, cost: &ItemCost) -> u64 {
        if self.scales_whole() {
            self.opaque_scale.apply(cost.total())
        } else {
            cost.scaled_total(self.opaque_scale)
        }
    }

    /// `tokens` counted whole (text, framing: a masked copy's cost) under this basis.
    pub fn whole(&self, tokens: u64) -> u64 {
        if self.scales_whole() {
            self.opaque_scale.apply(tokens)
        } else {
            tokens
        }
    }
}

impl From<Encoding> for CostBasis {
    fn from(encoding: Encoding) -> CostBasis {
        CostBasis {
            encoding,
            opaque_scale: OpaqueScale::ONE,
        }
    }
}

/// The cost of one item, split by source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ItemCost {
    /// Tokens of the canonical text.
    pub text: u64,
    /// Tokens of images, files and audio (and image payloads).
    pub media: u64,
    /// The fixed per-item overhead.
    pub overhead: u64,
    /// Tokens of opaque payloads by their decoded size (unscaled).
    pub opaque: u64,
    /// An opaque payload that is not valid base64 and was counted as text instead: its
    /// field (`"encrypted_content"` or `"result"`).
    pub fallback: Option<&'static str>,
}

impl ItemCost {
    /// The four parts added up (saturating: a cost never wraps around to a small one).
    pub fn total(&self) -> u64 {
        self.scaled_total(OpaqueScale::ONE)
    }

    /// The total with the opaque part scaled by a calibration (the rest never is).
    pub fn scaled_total(&self, scale: OpaqueScale) -> u64 {
        self.text
            .saturating_add(self.media)
            .saturating_add(self.overhead)
            .saturating_add(scale.apply(self.opaque))
    }
}

/// The full cost of one item with the given encoding.
pub fn item_cost(item: &Value, enc: Encoding) -> Result<ItemCost, TokenError> {
    let c = canonical(item, enc)?;
    Ok(c.cost(enc.count_cached(&c.text)?))
}
