//! The encodings: OpenAI's (tiktoken-rs) and the open-weight families' (the `tiktoken`
//! crate's vocabularies: Llama 3, Qwen 2/3, DeepSeek V3/R1/V4, Mistral's Tekken), their
//! names, the model -> encoding map ([`super::models`]), and the process-wide tokenizers,
//! built lazily, once, inside an embedding's build guard.
//!
//! # Design
//!
//! Every vocabulary is compiled into the binary (zstd-compressed, about 1.5 MB for the four
//! families) but decompressed and built only on the first count under it: a user of OpenAI
//! models never builds one (nor pays its memory), whatever else the build carries. Both
//! crates are pure Rust (no C to cross-compile for manylinux). The families' counts equal
//! their reference tokenizers' on text, special-token text counted as ordinary text (parity
//! tests: `tests/packing/test_model_families.py`).

use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
use tiktoken_rs::CoreBPE;

use super::TokenError;

/// Which encodings have been built (see [`Encoding::is_loaded`]).
static LOADED: [std::sync::atomic::AtomicBool; Encoding::ALL.len()] =
    [const { std::sync::atomic::AtomicBool::new(false) }; Encoding::ALL.len()];

/// A built tokenizer: OpenAI's from tiktoken-rs or a family's from the `tiktoken` crate.
#[derive(Clone, Copy)]
pub(crate) enum Bpe {
    OpenAi(&'static CoreBPE),
    Family(&'static tiktoken::CoreBpe),
    /// A family whose tokenizer normalises text to NFC before splitting it (Qwen's).
    FamilyNfc(&'static tiktoken::CoreBpe),
    /// An estimate for a provider whose tokenizer is not public: two tokens for every token
    /// of this (o200k_base) encoding, each one's pair [`ESTIMATE_FILLER`] then the token,
    /// so that the first `2k` tokens of a text are its first `k` base tokens.
    Doubled(&'static CoreBPE),
    /// A SentencePiece BPE model (Gemma 3's).
    Spm(&'static super::spm::Spm),
}

/// The first token of each pair of an estimate ([`Bpe::Doubled`]): it covers no bytes.
pub(crate) const ESTIMATE_FILLER: u32 = u32::MAX;

/// `text` in NFC (borrowed when it is already: the quick check answers for most texts).
fn nfc(text: &str) -> std::borrow::Cow<'_, str> {
    use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};
    match is_nfc_quick(text.chars()) {
        IsNormalized::Yes => std::borrow::Cow::Borrowed(text),
        _ => std::borrow::Cow::Owned(text.nfc().collect()),
    }
}

impl Bpe {
    /// The tokens of `text`, special-token text encoded as ordinary text.
    pub(crate) fn encode_ordinary(self, text: &str) -> Vec<u32> {
        match self {
            Bpe::OpenAi(b) => b.encode_ordinary(text),
            Bpe::Family(b) => b.encode(text),
            Bpe::FamilyNfc(b) => b.encode(&nfc(text)),
            Bpe::Spm(m) => m.encode(text),
            Bpe::Doubled(b) => b
                .encode_ordinary(text)
                .into_iter()
                .flat_map(|t| [ESTIMATE_FILLER, t])
                .collect(),
        }
    }

    /// The number of tokens of `text` (as [`Bpe::encode_ordinary`] would give).
    pub(crate) fn count(self, text: &str) -> usize {
        match self {
            Bpe::OpenAi(b) => b.encode_ordinary(text).len(),
            Bpe::Family(b) => b.count(text),
            Bpe::FamilyNfc(b) => b.count(&nfc(text)),
            Bpe::Spm(m) => m.count(text),
            Bpe::Doubled(b) => 2 * b.encode_ordinary(text).len(),
        }
    }

    /// The bytes of `tokens`; a token the vocabulary lacks is an error.
    pub(crate) fn decode_bytes(self, tokens: &[u32]) -> Result<Vec<u8>, String> {
        match self {
            Bpe::OpenAi(b) => b.decode_bytes(tokens).map_err(|e| e.to_string()),
            Bpe::Spm(m) => m.decode_bytes(tokens),
            Bpe::Doubled(b) => {
                let base: Vec<u32> = tokens
                    .iter()
                    .copied()
                    .filter(|&t| t != ESTIMATE_FILLER)
                    .collect();
                b.decode_bytes(&base).map_err(|e| e.to_string())
            }
            Bpe::Family(b) | Bpe::FamilyNfc(b) => {
                let mut out = Vec::new();
                for &t in tokens {
                    let bytes = b.decode(&[t]);
                    if bytes.is_empty() {
                        return Err(format!("token {t} is not in the vocabulary"));
                    }
                    out.extend_from_slice(&bytes);
                }
                Ok(out)
            }
        }
    }
}

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

/// A tokenizer being built on a helper thread ([`Encoding::load_in_background`]): joined by
/// [`Loading::wait`] or on drop.
#[derive(Debug)]
pub struct Loading(Option<std::thread::JoinHandle<()>>);

impl Loading {
    /// Wait for the build (a build that panicked is left to the first count to redo).
    pub fn wait(mut self) {
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}

/// An encoding: one of OpenAI's (tiktoken-rs) or an open-weight family's (`tiktoken` crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Encoding {
    O200kBase,
    O200kHarmony,
    Cl100kBase,
    P50kBase,
    P50kEdit,
    R50kBase,
    /// Meta Llama 3, 3.1, 3.2, 3.3 (128,000 tokens: cl100k_base and 28,000 more).
    Llama3,
    /// Qwen 2, 2.5, 3 and QwQ (151,643 tokens).
    Qwen2,
    /// DeepSeek V3, V3.1, V3.2, R1 and V4 (128,000 tokens; V4 only adds special tokens).
    DeepseekV3,
    /// Mistral's Tekken (Nemo, Small 3, Medium 3, Ministral, Pixtral, Codestral 25, ...).
    Tekken,
    /// Anthropic's Claude, whose tokenizer is not public: a conservative estimate, two
    /// tokens per `o200k_base` token (see [`Encoding::is_estimate`] and
    /// `docs/models.md`: public measurements put Claude 4.x at a median 1.7 times the
    /// `o200k_base` count).
    ClaudeEstimate,
    /// Gemma 3's SentencePiece tokenizer (262,144 pieces), which Google's SDK also uses to
    /// count Gemini 2.x / 3 tokens locally (see `docs/models.md`: compatible, not
    /// guaranteed identical to Gemini's server).
    Gemma3,
}

impl Encoding {
    /// Every encoding, default first.
    pub const ALL: [Encoding; 12] = [
        Encoding::O200kBase,
        Encoding::O200kHarmony,
        Encoding::Cl100kBase,
        Encoding::P50kBase,
        Encoding::P50kEdit,
        Encoding::R50kBase,
        Encoding::Llama3,
        Encoding::Qwen2,
        Encoding::DeepseekV3,
        Encoding::Tekken,
        Encoding::ClaudeEstimate,
        Encoding::Gemma3,
    ];

    /// The name of the encoding (tiktoken's for OpenAI's).
    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::O200kHarmony => "o200k_harmony",
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::P50kBase => "p50k_base",
            Encoding::P50kEdit => "p50k_edit",
            Encoding::R50kBase => "r50k_base",
            Encoding::Llama3 => "llama3",
            Encoding::Qwen2 => "qwen2",
            Encoding::DeepseekV3 => "deepseek_v3",
            Encoding::Tekken => "tekken",
            Encoding::ClaudeEstimate => "claude_estimate",
            Encoding::Gemma3 => "gemma3",
        }
    }

    /// The provider family whose tokenizer this is (`"openai"`, `"meta"`, `"qwen"`,
    /// `"deepseek"`, `"mistral"`, `"anthropic"`, `"google"`).
    pub fn family(self) -> &'static str {
        match self {
            Encoding::O200kBase
            | Encoding::O200kHarmony
            | Encoding::Cl100kBase
            | Encoding::P50kBase
            | Encoding::P50kEdit
            | Encoding::R50kBase => "openai",
            Encoding::Llama3 => "meta",
            Encoding::Qwen2 => "qwen",
            Encoding::DeepseekV3 => "deepseek",
            Encoding::Tekken => "mistral",
            Encoding::ClaudeEstimate => "anthropic",
            Encoding::Gemma3 => "google",
        }
    }

    /// Whether counts under this encoding are an estimate of a tokenizer that is not
    /// public (Claude's) rather than the model's own tokenizer's.
    pub fn is_estimate(self) -> bool {
        self == Encoding::ClaudeEstimate
    }

    /// Tokens counted per token of the underlying tokenizer: 2 for an estimate (see
    /// [`Encoding::ClaudeEstimate`]), else 1. A head or tail taken in tokens is a multiple.
    pub fn tokens_per_piece(self) -> u64 {
        if self.is_estimate() {
            2
        } else {
            1
        }
    }

    /// Look an encoding up by its name (aliases: `gpt2` for `r50k_base`, `deepseek_v4` for
    /// `deepseek_v3`, `mistral_v3` (the `tiktoken` crate's name) for `tekken`).
    pub fn from_name(name: &str) -> Result<Encoding, TokenError> {
        let name = name.trim();
        let alias = match name {
            "gpt2" => Some(Encoding::R50kBase),
            "deepseek_v4" => Some(Encoding::DeepseekV3),
            "mistral_v3" => Some(Encoding::Tekken),
            _ => None,
        };
        Encoding::ALL
            .into_iter()
            .find(|e| e.name() == name)
            .or(alias)
            .ok_or_else(|| TokenError::UnknownEncoding(name.to_string()))
    }

    /// The encoding of an OpenAI model name (see [`Encoding::for_model`]), or None.
    pub(crate) fn for_openai_model(bare: &str) -> Option<Encoding> {
        let tokenizer = get_tokenizer(bare).or_else(|| {
            // Bare o-series names with a suffix tiktoken-rs does not list (o1-pro, o3-deep-…).
            let lower = bare.to_ascii_lowercase();
            ["o1", "o3", "o4"]
                .iter()
                .any(|p| lower == *p || lower.starts_with(&format!("{p}-")))
                .then_some(Tokenizer::O200kBase)
        })?;
        Some(match tokenizer {
            Tokenizer::O200kBase => Encoding::O200kBase,
            Tokenizer::O200kHarmony => Encoding::O200kHarmony,
            Tokenizer::Cl100kBase => Encoding::Cl100kBase,
            Tokenizer::P50kBase => Encoding::P50kBase,
            Tokenizer::P50kEdit => Encoding::P50kEdit,
            Tokenizer::R50kBase | Tokenizer::Gpt2 => Encoding::R50kBase,
        })
    }

    /// The encoding of a model name as users write it for the Agents SDK: OpenAI's names
    /// (`gpt-5`, `openai/gpt-4o`, `ft:gpt-4o:…`), the open-weight families' (`qwen3-32b`,
    /// `deepseek-chat`, `Llama-3.3-70B-Instruct`, `mistral-small-latest`), behind any
    /// routing prefix (`litellm/<provider>/…`, any-llm's `provider:model` and
    /// `provider/model`, Bedrock's `us.meta.…-v1:0`, Ollama's `qwen3:32b`). The rules:
    /// [`super::models`].
    pub fn for_model(model: &str) -> Result<Encoding, TokenError> {
        super::models::resolve(model).ok_or_else(|| TokenError::UnknownModel(model.to_string()))
    }

    /// The encoding a call asked for: `encoding` by name if given, else `model`'s, else the
    /// default (`o200k_base`).
    pub fn resolve(model: Option<&str>, encoding: Option<&str>) -> Result<Encoding, TokenError> {
        match (encoding, model) {
            (Some(e), _) => Encoding::from_name(e),
            (None, Some(m)) => Encoding::for_model(m),
            (None, None) => Ok(Encoding::O200kBase),
        }
    }

    /// Build this encoding's tokenizer on a helper thread ("protoprompt-tokenizer") while
    /// the caller does other work; the returned [`Loading`] joins it when waited for or
    /// dropped, so no thread outlives it. Already built, or no thread could be started (the
    /// first count then builds it): nothing to join.
    pub fn load_in_background(self) -> Loading {
        if self.is_loaded() {
            return Loading(None);
        }
        let handle = std::thread::Builder::new()
            .name("protoprompt-tokenizer".to_string())
            .spawn(move || self.load())
            .ok();
        Loading(handle)
    }

    /// Build this encoding's tokenizer on a detached thread ("protoprompt-preload"), unless
    /// it is built already; the error says why no thread could be started.
    pub fn preload_detached(self) -> Result<(), String> {
        if self.is_loaded() {
            return Ok(());
        }
        std::thread::Builder::new()
            .name("protoprompt-preload".to_string())
            .spawn(move || self.load())
            .map(drop)
            .map_err(|e| format!("cannot start the preload thread: {e}"))
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
    pub(crate) fn bpe(self) -> Bpe {
        let loaded = &LOADED[self as usize];
        if !loaded.load(std::sync::atomic::Ordering::Acquire) {
            // Marked loaded inside the guard: whoever takes the guard's lock after a build
            // (a fork, for one) sees it loaded.
            let build = || {
                self.singleton();
                loaded.store(true, std::sync::atomic::Ordering::Release);
            };
            match BUILD_GUARD.get() {
                Some(guard) => guard(&build),
                None => build(),
            }
        }
        self.singleton()
    }

    fn singleton(self) -> Bpe {
        // tiktoken-rs singletons are `LazyLock`s and the `tiktoken` crate's `OnceLock`s:
        // built once per process, on first use.
        let family = |name: &str| {
            // Every name below is one of the features enabled in Cargo.toml.
            Bpe::Family(tiktoken::get_encoding(name).expect("vocabulary compiled in"))
        };
        match self {
            Encoding::O200kBase => Bpe::OpenAi(tiktoken_rs::o200k_base_singleton()),
            Encoding::O200kHarmony => Bpe::OpenAi(tiktoken_rs::o200k_harmony_singleton()),
            Encoding::Cl100kBase => Bpe::OpenAi(tiktoken_rs::cl100k_base_singleton()),
            Encoding::P50kBase => Bpe::OpenAi(tiktoken_rs::p50k_base_singleton()),
            Encoding::P50kEdit => Bpe::OpenAi(tiktoken_rs::p50k_edit_singleton()),
            Encoding::R50kBase => Bpe::OpenAi(tiktoken_rs::r50k_base_singleton()),
            Encoding::Llama3 => family("llama3"),
            Encoding::Qwen2 => match family("qwen2") {
                Bpe::Family(b) => Bpe::FamilyNfc(b),
                other => other,
            },
            Encoding::DeepseekV3 => family("deepseek_v3"),
            Encoding::Tekken => family("mistral_v3"),
            Encoding::ClaudeEstimate => Bpe::Doubled(tiktoken_rs::o200k_base_singleton()),
            Encoding::Gemma3 => {
                static GEMMA3: std::sync::OnceLock<super::spm::Spm> = std::sync::OnceLock::new();
                Bpe::Spm(GEMMA3.get_or_init(super::spm::Spm::gemma3))
            }
        }
    }

    /// Tokens of the framing the provider adds around every input item (role markers and
    /// separators of the chat template), never below [`super::ITEM_OVERHEAD`], which every
    /// lower bound of a cost assumes. Measured against each family's own template where one
    /// ships (`tests/packing/test_model_families.py`): Llama 3 frames a message in 5 tokens
    /// (`<|start_header_id|>`, the role, `<|end_header_id|>`, `\n\n`, `<|eot_id|>`), Qwen in
    /// 5 (`<|im_start|>`, the role, `\n`, `<|im_end|>`, `\n`), Tekken in at most 3 per
    /// message (`<s>`, `[INST]`, `[/INST]`), DeepSeek V3 in at most 4 (a tool output's
    /// markers); OpenAI's is unpublished (3-4 in its cookbook). The Claude estimate doubles
    /// it, as it does every token.
    pub fn item_overhead(self) -> u64 {
        match self {
            Encoding::Llama3 | Encoding::Qwen2 | Encoding::Gemma3 => 5,
            Encoding::ClaudeEstimate => 2 * super::ITEM_OVERHEAD,
            _ => super::ITEM_OVERHEAD,
        }
    }

    /// The most bytes one token of this encoding covers (the longest entry of its
    /// vocabulary, special tokens excluded; checked against the compiled-in vocabularies).
    pub fn max_token_bytes(self) -> u64 {
        match self {
            Encoding::O200kBase
            | Encoding::O200kHarmony
            | Encoding::Cl100kBase
            | Encoding::P50kBase
            | Encoding::P50kEdit
            | Encoding::R50kBase
            | Encoding::Llama3
            | Encoding::Qwen2
            | Encoding::DeepseekV3
            | Encoding::ClaudeEstimate => 128,
            Encoding::Tekken => 76,
            Encoding::Gemma3 => 93,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_prefers_the_encoding_then_the_model_then_the_default() {
        let table = [
            (None, None, Ok(Encoding::O200kBase)),
            (Some("gpt-4"), None, Ok(Encoding::Cl100kBase)),
            (Some("gpt-4"), Some("r50k_base"), Ok(Encoding::R50kBase)),
            (
                Some("mixtral-8x7b"),
                Some("p50k_base"),
                Ok(Encoding::P50kBase),
            ),
            (Some("qwen3-8b"), None, Ok(Encoding::Qwen2)),
            (
                Some("mixtral-8x7b"),
                None,
                Err(TokenError::UnknownModel("mixtral-8x7b".into())),
            ),
            (
                None,
                Some("nope"),
                Err(TokenError::UnknownEncoding("nope".into())),
            ),
        ];
        for (model, encoding, want) in table {
            assert_eq!(
                Encoding::resolve(model, encoding),
                want,
                "{model:?} {encoding:?}"
            );
        }
    }

    #[test]
    fn a_background_load_builds_the_tokenizer_by_the_time_it_is_waited_for() {
        let enc = Encoding::P50kEdit;
        enc.load_in_background().wait();
        assert!(enc.is_loaded());
        // Built already: no thread, nothing to join (dropping is enough).
        drop(enc.load_in_background());
        assert_eq!(enc.preload_detached(), Ok(()));
    }

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
        assert_eq!(Encoding::for_model("llama-3"), Ok(Encoding::Llama3));
        let err = Encoding::for_model("mixtral-8x7b").unwrap_err();
        assert!(err.to_string().contains("mixtral-8x7b"));
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
    fn max_token_bytes_is_the_longest_vocabulary_entry() {
        for enc in Encoding::ALL {
            let (tokens, longest) = match enc.bpe() {
                Bpe::OpenAi(bpe) | Bpe::Doubled(bpe) => {
                    let special: std::collections::HashSet<Vec<u8>> = bpe
                        .special_tokens()
                        .iter()
                        .map(|t| t.as_bytes().to_vec())
                        .collect();
                    let lens = (0..400_000u32)
                        .filter_map(|rank| bpe.decode_bytes(&[rank]).ok())
                        .filter(|b| !special.contains(b))
                        .map(|b| b.len() as u64);
                    lens.fold((0, 0), |(n, m), l| (n + 1, m.max(l)))
                }
                Bpe::Spm(spm) => (262_144, spm.longest_piece() as u64),
                Bpe::Family(bpe) | Bpe::FamilyNfc(bpe) => {
                    // A special token is one piece only when special tokens are recognised.
                    let is_special = |b: &[u8]| {
                        std::str::from_utf8(b).is_ok_and(|t| {
                            bpe.count_with_special_tokens(t) == 1 && bpe.count(t) > 1
                        })
                    };
                    let lens = (0..400_000u32)
                        .map(|rank| bpe.decode(&[rank]))
                        .filter(|b| !b.is_empty() && !is_special(b))
                        .map(|b| b.len() as u64);
                    lens.fold((0, 0), |(n, m), l| (n + 1, m.max(l)))
                }
            };
            assert!(tokens > 50_000, "{}: {tokens} tokens", enc.name());
            assert_eq!(enc.max_token_bytes(), longest, "{}", enc.name());
        }
    }
}
