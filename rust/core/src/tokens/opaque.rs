//! Opaque payloads: base64 fields the provider decodes rather than reads as text, costed by
//! their decoded size (see the cost model in [`crate::tokens`] and `docs/cost-model.md`).
//!
//! * `encrypted_content` of `reasoning` and `compaction` items: an encrypted blob (a
//!   Fernet-style token: version byte, timestamp, IV, ciphertext, MAC) that the provider
//!   decrypts back into the model's own tokens. Costed as
//!   [`opaque_tokens`]`(decoded bytes)`: the decoded size less an envelope of
//!   [`OPAQUE_ENVELOPE_BYTES`], at [`OPAQUE_BYTES_PER_TOKEN`] bytes per token (the estimate
//!   of OpenAI's Codex agent, `estimate_reasoning_length` in
//!   `codex-rs/core/src/context_manager/history.rs`), plus [`OPAQUE_MARGIN_PERCENT`].
//! * `result` of an `image_generation_call`: a base64 image, costed as an image by the
//!   published image rule (its size read from the decoded header), like an `input_image`.
//!
//! Claude's thinking, as the SDK's Chat Completions converter stores it (LiteLLM), is a
//! `reasoning` item whose `encrypted_content` holds the thinking blocks' signatures joined by
//! `"\n"` and whose `provider_data.thinking_blocks` the raw blocks: not an OpenAI payload, never
//! decoded by this rule ([`is_claude_thinking`]). Its signatures are counted as text, as are its
//! `redacted_thinking` blocks' encrypted `data` (sent back with the blocks), and its thinking
//! text is in `content`: all of it counted, wherever the item stands. Anthropic counts the
//! current turn's thinking on every model, and earlier turns' on Opus 4.5+ and Sonnet 4.6+
//! (older models strip it): so the count is the provider's for current models and at or
//! above it for older ones, and an item's cost never depends on its position (an index's
//! cost memo is keyed by position and basis only; see `docs/item-graph.md`).
//!
//! Gemini's thought signature (`provider_data.thought_signature` of a function call, sent back
//! in the call's `extra_content`) is counted as text with its call: Google does not publish
//! how it counts one, and text is the conservative count.
//!
//! A payload that is not valid base64 is not decoded by the provider either: it is counted as
//! text, as every other field is (the conservative count), and the cost says so
//! ([`ItemCost::fallback`](crate::tokens::ItemCost::fallback)).

use base64::Engine;
use serde_json::{Map, Value};

use super::media::image_tokens_for_size;

/// Version of the cost model as far as stored costs depend on it: an index snapshot records
/// the rule its costs were counted under, and costs of another rule are never reused.
///
/// * 1: `encrypted_content` and image results counted as text (protoprompt 0.2.0 up to
///   commit 1d25e97).
/// * 2: opaque payloads costed by their decoded size (this module); Claude's thinking items
///   never decoded as OpenAI payloads, Gemini thought signatures counted as text (since
///   issue 36: a snapshot that costed such an item before keeps that cost until the item is
///   counted again).
/// * 3: under an estimate encoding (`claude_estimate`) a calibration scales the whole cost,
///   not only the opaque part ([`super::CostBasis::cost`]; protoprompt 1.0.1). Rule 2 costs
///   are the same under every other basis and are reused ([`COST_RULE_COMPATIBLE`]).
pub const COST_RULE: u8 = 3;

/// The earlier rule whose costs equal this rule's under every basis but an estimate's with a
/// calibration (see [`COST_RULE`]): reused except there.
pub const COST_RULE_COMPATIBLE: u8 = 2;

/// Bytes of a decoded encrypted payload that are its envelope, not model tokens (Codex's
/// `estimate_reasoning_length` subtracts 650).
pub const OPAQUE_ENVELOPE_BYTES: u64 = 650;
/// Decoded bytes per token of an encrypted payload's content (Codex's
/// `approx_tokens_from_byte_count`: 4).
pub const OPAQUE_BYTES_PER_TOKEN: u64 = 4;
/// Margin added to the decoded-size estimate, in percent (see `docs/cost-model.md` for why).
pub const OPAQUE_MARGIN_PERCENT: u64 = 25;

/// Tokens of an encrypted payload of `decoded_bytes` bytes:
/// `ceil((decoded_bytes - OPAQUE_ENVELOPE_BYTES) / OPAQUE_BYTES_PER_TOKEN * (1 + margin))`,
/// 0 for a payload no larger than its envelope.
pub fn opaque_tokens(decoded_bytes: u64) -> u64 {
    decoded_bytes
        .saturating_sub(OPAQUE_ENVELOPE_BYTES)
        .saturating_mul(100 + OPAQUE_MARGIN_PERCENT)
        .div_ceil(100 * OPAQUE_BYTES_PER_TOKEN)
}

/// How a top-level field of an item is costed apart from its text, if it is an opaque
/// payload (see the module notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Payload {
    /// Encrypted model tokens: [`opaque_tokens`] of the decoded size.
    Encrypted,
    /// A base64 image: the image rule.
    Image,
}

impl Payload {
    /// The field that holds a payload of this kind.
    pub(super) fn field(self) -> &'static str {
        match self {
            Payload::Encrypted => "encrypted_content",
            Payload::Image => "result",
        }
    }
}

/// The opaque payload at `key` of an item whose top level is `item`, if any.
/// Whether `item` is Claude's thinking as the SDK stores it: a `reasoning` item whose
/// `provider_data.thinking_blocks` is a list (see the module notes).
pub(super) fn is_claude_thinking(item: &Map<String, Value>) -> bool {
    item.get("type").and_then(Value::as_str) == Some("reasoning")
        && item
            .get("provider_data")
            .and_then(|p| p.get("thinking_blocks"))
            .is_some_and(Value::is_array)
}

/// The encrypted `data` of the `redacted_thinking` blocks of Claude's thinking (see
/// [`is_claude_thinking`]): sent back with the blocks, counted as text.
pub(super) fn redacted_thinking(item: &Map<String, Value>) -> Vec<&str> {
    let blocks = item
        .get("provider_data")
        .and_then(|p| p.get("thinking_blocks"))
        .and_then(Value::as_array);
    blocks
        .into_iter()
        .flatten()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("redacted_thinking"))
        .filter_map(|b| b.get("data").and_then(Value::as_str))
        .collect()
}

pub(super) fn payload_kind(item: &Map<String, Value>, key: &str) -> Option<Payload> {
    if is_claude_thinking(item) {
        return None;
    }
    match (item.get("type").and_then(Value::as_str)?, key) {
        ("reasoning" | "compaction", "encrypted_content") => Some(Payload::Encrypted),
        ("image_generation_call", "result") => Some(Payload::Image),
        _ => None,
    }
}

/// What an opaque payload costs, or why it is counted as text instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PayloadCost {
    /// Encrypted tokens (scaled by a calibration, see [`OpaqueScale`]).
    Opaque(u64),
    /// Image tokens (by the published rule; never scaled).
    Media(u64),
    /// Not valid base64 (or an image whose size cannot be read): counted as text.
    Text,
}

/// The cost of `payload`, a string of the given kind.
pub(super) fn payload_cost(kind: Payload, payload: &str) -> PayloadCost {
    match kind {
        Payload::Encrypted => match decoded_len(payload) {
            Some(n) => PayloadCost::Opaque(opaque_tokens(n as u64)),
            None => PayloadCost::Text,
        },
        Payload::Image => {
            let size = decoded_prefix(payload).and_then(|head| imagesize::blob_size(&head).ok());
            match size {
                Some(s) => {
                    PayloadCost::Media(image_tokens_for_size(s.width as u64, s.height as u64))
                }
                None => PayloadCost::Text,
            }
        }
    }
}

/// The engines a payload may be written with: standard or URL-safe alphabet, padded or not.
fn engines() -> [base64::engine::GeneralPurpose; 2] {
    use base64::alphabet::{STANDARD, URL_SAFE};
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    [
        GeneralPurpose::new(&URL_SAFE, config),
        GeneralPurpose::new(&STANDARD, config),
    ]
}

/// The decoded size of a base64 payload, or `None` if it is not base64. Several payloads
/// may be joined by newlines (the SDK's Chat Completions converter stores the signatures of
/// several thinking blocks that way); each line is decoded on its own. An empty payload
/// decodes to nothing.
pub fn decoded_len(payload: &str) -> Option<usize> {
    let engines = engines();
    let mut total = 0usize;
    let mut buf = Vec::new();
    for line in payload.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let mut decoded = None;
        for engine in &engines {
            buf.clear();
            if engine.decode_vec(line, &mut buf).is_ok() {
                decoded = Some(buf.len());
                break;
            }
        }
        total = total.saturating_add(decoded?);
    }
    Some(total)
}

/// The first bytes of a base64 payload (enough for an image header: 256 KiB of base64 covers
/// JPEG headers behind large EXIF blocks), or `None` if they are not base64.
fn decoded_prefix(payload: &str) -> Option<Vec<u8>> {
    let payload = payload.trim();
    let take = payload.len().min(256 * 1024);
    let mut end = take - take % 4;
    while !payload.is_char_boundary(end) {
        end -= 1;
    }
    let head = if end == payload.len() {
        payload
    } else {
        &payload[..end]
    };
    engines()
        .iter()
        .find_map(|e| e.decode(head).ok())
        .filter(|b| !b.is_empty())
}

/// A calibration of the opaque part of item costs: the factor its tokens are multiplied by,
/// in sixty-fourths, between [`OpaqueScale::MIN`] and [`OpaqueScale::MAX`]. Text, media and
/// overhead are never scaled, so a calibrated cost is never below the conservative rule for
/// everything but the opaque payloads — except under an estimate encoding (Claude's), where
/// it scales the whole cost ([`super::CostBasis::cost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpaqueScale(u16);

impl OpaqueScale {
    /// Sixty-fourths: the resolution of a scale.
    pub const UNIT: u16 = 64;
    /// The rule itself (no calibration).
    pub const ONE: OpaqueScale = OpaqueScale(Self::UNIT);
    /// One half (the smallest calibration of an estimate's whole cost, see
    /// [`super::CostBasis::MIN_ESTIMATE_SCALE`]).
    pub const HALF: OpaqueScale = OpaqueScale(Self::UNIT / 2);
    /// The smallest scale a calibration may set (a quarter of the rule).
    pub const MIN: OpaqueScale = OpaqueScale(Self::UNIT / 4);
    /// The largest scale a calibration may set (twice the rule).
    pub const MAX: OpaqueScale = OpaqueScale(Self::UNIT * 2);

    /// The scale of `sixty_fourths` / 64, if within [`OpaqueScale::MIN`]..=[`OpaqueScale::MAX`].
    pub fn from_sixty_fourths(sixty_fourths: u16) -> Option<OpaqueScale> {
        (Self::MIN.0..=Self::MAX.0)
            .contains(&sixty_fourths)
            .then_some(OpaqueScale(sixty_fourths))
    }

    /// The scale nearest above `factor` (rounded up to a sixty-fourth), clamped to the bounds;
    /// `None` for a factor that is not a finite number.
    pub fn from_factor(factor: f64) -> Option<OpaqueScale> {
        if !factor.is_finite() {
            return None;
        }
        let units = (factor * f64::from(Self::UNIT)).ceil();
        let units = units.clamp(f64::from(Self::MIN.0), f64::from(Self::MAX.0));
        Some(OpaqueScale(units as u16))
    }

    /// The calibration a caller asked for (`factor` of the decoded-size rule, rounded up to a
    /// sixty-fourth); the error says why a factor outside the bounds, or not a number, is
    /// refused.
    pub fn checked(factor: f64) -> Result<OpaqueScale, String> {
        let (lo, hi) = (Self::MIN.factor(), Self::MAX.factor());
        if !(lo..=hi).contains(&factor) {
            return Err(format!(
                "opaque_scale must be between {lo} and {hi}, got {factor}"
            ));
        }
        Self::from_factor(factor).ok_or_else(|| "opaque_scale must be a number".to_string())
    }

    pub fn sixty_fourths(self) -> u16 {
        self.0
    }

    pub fn factor(self) -> f64 {
        f64::from(self.0) / f64::from(Self::UNIT)
    }

    /// `tokens` scaled, rounded up.
    pub fn apply(self, tokens: u64) -> u64 {
        if self == Self::ONE {
            return tokens;
        }
        let scaled = u128::from(tokens) * u128::from(self.0);
        u64::try_from(scaled.div_ceil(u128::from(Self::UNIT))).unwrap_or(u64::MAX)
    }
}

impl Default for OpaqueScale {
    fn default() -> Self {
        Self::ONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_scales_refuse_factors_outside_the_bounds_and_round_up_inside() {
        let (lo, hi) = (OpaqueScale::MIN.factor(), OpaqueScale::MAX.factor());
        assert_eq!(OpaqueScale::checked(lo), Ok(OpaqueScale::MIN));
        assert_eq!(OpaqueScale::checked(hi), Ok(OpaqueScale::MAX));
        assert_eq!(
            OpaqueScale::checked(1.0 + 1.0 / 128.0).map(OpaqueScale::sixty_fourths),
            Ok(OpaqueScale::UNIT + 1)
        );
        for bad in [lo - 0.01, hi + 0.01, f64::NAN, f64::INFINITY] {
            let err = OpaqueScale::checked(bad).unwrap_err();
            assert!(
                err.starts_with("opaque_scale must be between"),
                "{bad}: {err}"
            );
        }
    }
    use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};

    #[test]
    fn the_rule_in_a_table() {
        // (decoded bytes, tokens): envelope first, then 4 bytes per token plus 25%.
        for (bytes, tokens) in [
            (0, 0),
            (650, 0),
            (651, 1),
            (654, 2),
            (666, 5),
            (1650, 313),
            (4650, 1250),
            (100_650, 31_250),
        ] {
            assert_eq!(opaque_tokens(bytes), tokens, "{bytes} bytes");
        }
        // Saturates, never wraps around to a small cost.
        assert!(opaque_tokens(u64::MAX) >= u64::MAX / 400);
    }

    #[test]
    fn decoded_sizes_of_every_base64_form() {
        let raw: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for text in [
            STANDARD.encode(&raw),
            URL_SAFE.encode(&raw),
            URL_SAFE_NO_PAD.encode(&raw),
            STANDARD.encode(&raw).trim_end_matches('=').to_string(),
        ] {
            assert_eq!(decoded_len(&text), Some(1000), "{}", &text[..20]);
        }
        // Several signatures joined by newlines: each decoded on its own.
        let joined = format!(
            "{}\n{}\r\n",
            STANDARD.encode(&raw[..10]),
            URL_SAFE.encode(&raw[..7])
        );
        assert_eq!(decoded_len(&joined), Some(17));
        assert_eq!(decoded_len(""), Some(0));
        for bad in ["enc!", "gAAAAAB=gAAA", "a", "abc d", "Zm9v=Zm9v", "ü"] {
            assert_eq!(decoded_len(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn payload_costs() {
        let enc = URL_SAFE.encode(vec![0x80u8; 2650]);
        assert_eq!(
            payload_cost(Payload::Encrypted, &enc),
            PayloadCost::Opaque(625)
        );
        assert_eq!(
            payload_cost(Payload::Encrypted, "not base64!"),
            PayloadCost::Text
        );
        // A 1x1 PNG: the image rule's smallest high-detail cost.
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
        assert_eq!(payload_cost(Payload::Image, png), PayloadCost::Media(255));
        assert_eq!(
            payload_cost(Payload::Image, &enc),
            PayloadCost::Text,
            "not an image"
        );
        assert_eq!(payload_cost(Payload::Image, "%%%"), PayloadCost::Text);
    }

    #[test]
    fn scales_are_bounded_and_round_up() {
        assert_eq!(OpaqueScale::default(), OpaqueScale::ONE);
        assert_eq!(OpaqueScale::from_factor(1.0), Some(OpaqueScale::ONE));
        assert_eq!(OpaqueScale::from_factor(0.0), Some(OpaqueScale::MIN));
        assert_eq!(OpaqueScale::from_factor(-3.0), Some(OpaqueScale::MIN));
        assert_eq!(OpaqueScale::from_factor(9.0), Some(OpaqueScale::MAX));
        assert_eq!(OpaqueScale::from_factor(f64::NAN), None);
        assert_eq!(
            OpaqueScale::from_factor(0.5001).map(OpaqueScale::sixty_fourths),
            Some(33)
        );
        assert_eq!(OpaqueScale::from_sixty_fourths(15), None);
        assert_eq!(OpaqueScale::from_sixty_fourths(129), None);
        let half = OpaqueScale::from_sixty_fourths(32).unwrap();
        assert_eq!(half.factor(), 0.5);
        assert_eq!(half.apply(101), 51, "rounded up");
        assert_eq!(OpaqueScale::ONE.apply(u64::MAX), u64::MAX);
        assert_eq!(OpaqueScale::MAX.apply(u64::MAX), u64::MAX, "saturates");
    }
}
