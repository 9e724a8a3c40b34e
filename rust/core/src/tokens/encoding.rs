//! The encodings tiktoken-rs ships: names, the model -> encoding map, and the process-wide
//! tokenizers, built lazily, once, inside an embedding's build guard.

use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
use tiktoken_rs::CoreBPE;

use super::TokenError;

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
    pub(crate) fn bpe(self) -> &'static CoreBPE {
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
            (Some("llama-3"), Some("p50k_base"), Ok(Encoding::P50kBase)),
            (
                Some("llama-3"),
                None,
                Err(TokenError::UnknownModel("llama-3".into())),
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
}
