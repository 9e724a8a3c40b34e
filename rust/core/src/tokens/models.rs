//! Model names as users write them for the Agents SDK -> the encoding that counts them.
//!
//! # Rules
//!
//! A name is tried as written, then through the routing around it, in this order, the first
//! match winning:
//!
//! 1. a leading `litellm/` (the SDK's `LitellmModel` prefix) is dropped;
//! 2. the whole rest, then its last `/` segment (`openrouter/deepseek/deepseek-chat`,
//!    `together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo`);
//! 3. for each, the part after the first `:` (any-llm's `provider:model`), then the part
//!    before it (Ollama's `qwen3:32b`, Bedrock's `…-v1:0`);
//! 4. for each, without Bedrock's dotted region and vendor prefixes (`us.meta.llama3-…`).
//!
//! A candidate is first looked up as an OpenAI name (tiktoken-rs's map: `gpt-5`,
//! `ft:gpt-4o:…`, `gpt-oss-120b`), then matched case-insensitively against the families:
//!
//! | family | names | encoding |
//! |---|---|---|
//! | Meta | `llama3*`, `llama-3*` (3, 3.1, 3.2, 3.3; not Llama 2 or 4), `meta-llama-3*` | `llama3` |
//! | Qwen | `qwen2*`, `qwen-2*`, `qwen3*` (not 3.5 / 3.6: a new vocabulary), `qwq*` | `qwen2` |
//! | DeepSeek | `deepseek-chat`, `deepseek-reasoner`, `deepseek-v3*`, `deepseek-v4*`, `deepseek-r1*` | `deepseek_v3` |
//! | Anthropic | `claude*` (a conservative estimate: Claude's tokenizer is not public) | `claude_estimate` |
//! | Google | `gemma-3*`, `gemma3*` (3 and 3n), `gemini-2*`, `gemini-3*`, `gemini-live-2*` (Gemma 3's tokenizer, which Google's SDK counts Gemini with; not Gemma 1 / 2 / 4 or Gemini 1.x) | `gemma3` |
//! | Mistral | `mistral-nemo*`, `open-mistral-nemo*`, `ministral*`, `pixtral-12b*`, `mistral-small*` (not 2312 / 2402), `mistral-medium-3*` / `-25*` / `-latest`, `codestral-25*` / `-latest`, `magistral*`, `devstral*`, `voxtral*` | `tekken` |
//!
//! R1 distillations count with their base model's tokenizer (`deepseek-r1-distill-qwen-*`:
//! `qwen2`, `deepseek-r1-distill-llama-*`: `llama3`). Names whose tokenizer is not one of
//! these (Mistral Large before Tekken, Mixtral, Qwen 3.5, DeepSeek-Coder V2, Llama 4, and
//! aliases whose model changes under them such as `qwen-plus`) resolve to nothing: the
//! caller then names an encoding, and no count silently uses a wrong one.

use super::Encoding;

/// Bedrock's dotted prefixes: cross-region inference profiles and model vendors.
const DOTTED_PREFIXES: [&str; 12] = [
    "us",
    "eu",
    "apac",
    "global",
    "jp",
    "au",
    "meta",
    "mistral",
    "deepseek",
    "qwen",
    "anthropic",
    "google",
];

/// The encoding of `model` (see the module's rules), or None.
pub(crate) fn resolve(model: &str) -> Option<Encoding> {
    name_candidates(model).find_map(|candidate| {
        Encoding::for_openai_model(candidate).or_else(|| family(&candidate.to_ascii_lowercase()))
    })
}

/// The spellings of a model name as users write it for the SDK, most specific first: the
/// name without a `litellm/` route, then its last `/` segment; of each, the whole, the part
/// after its first `:` and the part before it; of each of those, as written and without
/// Bedrock `region.` / `vendor.` prefixes. Never an empty string.
fn name_candidates(model: &str) -> impl Iterator<Item = &str> {
    let trimmed = model.trim();
    let routed = strip_prefix_ci(trimmed, "litellm/").unwrap_or(trimmed);
    let last = routed.rsplit('/').next().unwrap_or(routed);
    [routed, last]
        .into_iter()
        .flat_map(colon_parts)
        .flat_map(|part| [part, without_dotted_prefixes(part)])
        .filter(|candidate| !candidate.is_empty())
}

/// `name`, then the part after its first `:`, then the part before it.
fn colon_parts(name: &str) -> impl Iterator<Item = &str> {
    let split = name.split_once(':');
    std::iter::once(name)
        .chain(split.map(|(_, after)| after))
        .chain(split.map(|(before, _)| before))
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    (s.len() >= prefix.len()
        && s.is_char_boundary(prefix.len())
        && s[..prefix.len()].eq_ignore_ascii_case(prefix))
    .then(|| &s[prefix.len()..])
}

/// `name` without leading Bedrock `region.` / `vendor.` segments.
fn without_dotted_prefixes(mut name: &str) -> &str {
    while let Some((head, rest)) = name.split_once('.') {
        if DOTTED_PREFIXES.iter().any(|p| head.eq_ignore_ascii_case(p)) {
            name = rest;
        } else {
            break;
        }
    }
    name
}

/// Whether `m` starts with `prefix` and the next character (if any) is not a digit, so that
/// `llama-3` matches `llama-3.1-8b` but not `llama-30b`.
fn starts_version(m: &str, prefix: &str) -> bool {
    m.strip_prefix(prefix)
        .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
}

/// The family encoding of a lower-case model name.
fn family(m: &str) -> Option<Encoding> {
    let m = m.strip_prefix("meta-").unwrap_or(m);
    if let Some(base) = m.strip_prefix("deepseek-r1-distill-") {
        return if base.starts_with("qwen") {
            Some(Encoding::Qwen2)
        } else if base.starts_with("llama") {
            Some(Encoding::Llama3)
        } else {
            None
        };
    }
    if ["llama3", "llama-3", "llama_3"]
        .iter()
        .any(|p| starts_version(m, p))
    {
        return Some(Encoding::Llama3);
    }
    if is_qwen2(m) {
        return Some(Encoding::Qwen2);
    }
    if ["deepseek-chat", "deepseek-reasoner"].contains(&m)
        || ["deepseek-v3", "deepseek-v4", "deepseek-r1"]
            .iter()
            .any(|p| starts_version(m, p))
    {
        return Some(Encoding::DeepseekV3);
    }
    if m.starts_with("claude") {
        return Some(Encoding::ClaudeEstimate);
    }
    if ["gemma-3", "gemma3", "gemini-2", "gemini-3", "gemini-live-2"]
        .iter()
        .any(|p| starts_version(m, p))
    {
        return Some(Encoding::Gemma3);
    }
    is_tekken(m).then_some(Encoding::Tekken)
}

fn is_qwen2(m: &str) -> bool {
    if m.starts_with("qwq") || starts_version(m, "qwen2") || starts_version(m, "qwen-2") {
        return true;
    }
    // Qwen 3 and its variants (coder, max, next, vl), but not Qwen 3.5 / 3.6.
    ["qwen3", "qwen-3"].iter().any(|p| {
        m.strip_prefix(p).is_some_and(|rest| {
            !rest.starts_with(|c: char| c.is_ascii_digit())
                && !rest.starts_with(".5")
                && !rest.starts_with(".6")
        })
    })
}

fn is_tekken(m: &str) -> bool {
    let m = m.strip_prefix("open-").unwrap_or(m);
    if [
        "mistral-nemo",
        "ministral",
        "pixtral-12b",
        "magistral",
        "devstral",
        "voxtral",
    ]
    .iter()
    .any(|p| m.starts_with(p))
    {
        return true;
    }
    if let Some(rest) = m.strip_prefix("mistral-small") {
        // Mistral Small 2312 and 2402 use the SentencePiece tokenizer of Mistral 7B.
        return !rest.starts_with("-2312") && !rest.starts_with("-2402");
    }
    if let Some(rest) = m.strip_prefix("mistral-medium-") {
        return rest.starts_with('3') || rest.starts_with("25") || rest == "latest";
    }
    m.strip_prefix("codestral-")
        .is_some_and(|rest| rest.starts_with("25") || rest == "latest")
}

/// Whether `model` (written as for [`resolve`]) is a Claude generation that strips earlier
/// turns' thinking from the context: Claude 3.x (3.7 Sonnet thinks), Sonnet 4 / 4.5, Haiku
/// 4.5, Opus 4 / 4.1 (Anthropic's "Context windows" page:
/// `context_window = (input_tokens - previous_thinking_tokens) + current_turn_tokens`).
/// Opus 4.5 and later, Sonnet 4.6 and later keep it in context; an unknown or newer Claude
/// model, or any other model, is `false` (its thinking is counted whole, the conservative
/// side).
pub fn strips_earlier_thinking(model: &str) -> bool {
    name_candidates(model)
        .find_map(|candidate| {
            let lower = candidate.to_ascii_lowercase();
            lower.strip_prefix("claude-").map(claude_strips)
        })
        .unwrap_or(false)
}

/// [`strips_earlier_thinking`] of a Claude name after `claude-`: its family word and its
/// version numbers (the small numbers before a date or a suffix), in either order
/// (`3-7-sonnet`, `sonnet-4-5-20250929`, `opus-4@20250514`, `4-sonnet`).
fn claude_strips(rest: &str) -> bool {
    let mut family = None;
    let mut version: Vec<u32> = Vec::new();
    let mut numbers_done = false;
    for token in rest.split(['-', '.', '@', '_', ':']) {
        if ["opus", "sonnet", "haiku"].contains(&token) {
            family.get_or_insert(token);
            if !version.is_empty() {
                numbers_done = true;
            }
        } else if !numbers_done && token.len() <= 2 && token.bytes().all(|b| b.is_ascii_digit()) {
            version.extend(token.parse::<u32>().ok());
        } else if !version.is_empty() {
            numbers_done = true;
        }
        if numbers_done && family.is_some() {
            break;
        }
    }
    let (Some(&major), minor) = (version.first(), version.get(1).copied().unwrap_or(0)) else {
        return false;
    };
    match (major, family) {
        (3, _) => true,
        (4, Some("sonnet")) => minor == 0 || minor == 5,
        (4, Some("opus")) => minor <= 1,
        (4, Some("haiku")) => minor == 5,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_as_users_write_them() {
        let table = [
            // OpenAI, bare and routed.
            ("gpt-4o", Some(Encoding::O200kBase)),
            ("litellm/openai/gpt-4o", Some(Encoding::O200kBase)),
            ("openai:gpt-4.1-mini", Some(Encoding::O200kBase)),
            (
                "ft:gpt-4o-mini-2024-07-18:org::abc",
                Some(Encoding::O200kBase),
            ),
            ("gpt-4", Some(Encoding::Cl100kBase)),
            // DeepSeek.
            ("litellm/deepseek/deepseek-chat", Some(Encoding::DeepseekV3)),
            ("deepseek:deepseek-reasoner", Some(Encoding::DeepseekV3)),
            ("deepseek-ai/DeepSeek-V3.1", Some(Encoding::DeepseekV3)),
            (
                "litellm/openrouter/deepseek/deepseek-r1",
                Some(Encoding::DeepseekV3),
            ),
            ("deepseek-v4-pro", Some(Encoding::DeepseekV3)),
            ("deepseek-r1-distill-qwen-32b", Some(Encoding::Qwen2)),
            ("deepseek-r1-distill-llama-70b", Some(Encoding::Llama3)),
            ("deepseek-coder-v2", None),
            // Qwen.
            ("qwen3-32b", Some(Encoding::Qwen2)),
            ("litellm/ollama/qwen3:32b", Some(Encoding::Qwen2)),
            ("Qwen/Qwen2.5-72B-Instruct", Some(Encoding::Qwen2)),
            ("qwen3-coder-480b-a35b", Some(Encoding::Qwen2)),
            ("qwq-32b", Some(Encoding::Qwen2)),
            ("qwen3.5-plus", None),
            ("qwen-plus", None),
            // Llama 3.
            (
                "litellm/groq/llama-3.3-70b-versatile",
                Some(Encoding::Llama3),
            ),
            (
                "together_ai/meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo",
                Some(Encoding::Llama3),
            ),
            ("us.meta.llama3-1-70b-instruct-v1:0", Some(Encoding::Llama3)),
            ("llama3.2:3b", Some(Encoding::Llama3)),
            ("llama-30b", None),
            ("llama-4-scout", None),
            ("llama-2-70b", None),
            // Mistral.
            ("mistral-small-latest", Some(Encoding::Tekken)),
            ("mistral:mistral-medium-latest", Some(Encoding::Tekken)),
            ("litellm/mistral/open-mistral-nemo", Some(Encoding::Tekken)),
            (
                "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
                Some(Encoding::Tekken),
            ),
            ("codestral-2501", Some(Encoding::Tekken)),
            ("magistral-medium-latest", Some(Encoding::Tekken)),
            ("mistral-small-2402", None),
            ("mistral-large-2411", None),
            ("open-mixtral-8x22b", None),
            // Gemma 3 and Gemini 2.x / 3.
            ("gemini-2.5-pro", Some(Encoding::Gemma3)),
            ("litellm/gemini/gemini-2.5-flash", Some(Encoding::Gemma3)),
            ("vertex_ai/gemini-2.0-flash-001", Some(Encoding::Gemma3)),
            (
                "litellm/vertex_ai/gemini-3-pro-preview",
                Some(Encoding::Gemma3),
            ),
            ("google:gemini-2.5-flash-lite", Some(Encoding::Gemma3)),
            ("openrouter/google/gemini-2.5-pro", Some(Encoding::Gemma3)),
            ("models/gemini-2.5-flash", Some(Encoding::Gemma3)),
            ("gemini-live-2.5-flash", Some(Encoding::Gemma3)),
            ("google/gemma-3-27b-it", Some(Encoding::Gemma3)),
            ("gemma3:12b", Some(Encoding::Gemma3)),
            ("litellm/ollama/gemma3:4b", Some(Encoding::Gemma3)),
            ("gemma-3n-e4b-it", Some(Encoding::Gemma3)),
            ("gemini-1.5-pro", None),
            ("gemini-pro", None),
            ("gemma-2-9b-it", None),
            ("gemma-30b", None),
            // Nothing known.
            ("", None),
            ("litellm/", None),
            // Claude: the estimate.
            ("claude-sonnet-4-5", Some(Encoding::ClaudeEstimate)),
            (
                "litellm/anthropic/claude-opus-4-1-20250805",
                Some(Encoding::ClaudeEstimate),
            ),
            ("anthropic:claude-haiku-4-5", Some(Encoding::ClaudeEstimate)),
            (
                "us.anthropic.claude-sonnet-4-20250514-v1:0",
                Some(Encoding::ClaudeEstimate),
            ),
            (
                "litellm/vertex_ai/claude-opus-4@20250514",
                Some(Encoding::ClaudeEstimate),
            ),
        ];
        for (name, want) in table {
            assert_eq!(resolve(name), want, "{name:?}");
        }
    }

    #[test]
    fn claude_generations_that_strip_earlier_thinking() {
        for m in [
            "litellm/anthropic/claude-sonnet-4-5-20250929",
            "anthropic/claude-3-7-sonnet",
            "claude-3-7-sonnet-latest",
            "claude-opus-4-1",
            "anthropic:claude-haiku-4-5",
            "litellm/vertex_ai/claude-opus-4@20250514",
            "us.anthropic.claude-sonnet-4-20250514-v1:0",
            "claude-sonnet-4-20250514",
            "claude-4-sonnet",
            "CLAUDE-OPUS-4-1-20250805",
        ] {
            assert!(strips_earlier_thinking(m), "{m}");
        }
        for m in [
            "claude-opus-4-5",
            "litellm/anthropic/claude-opus-4-5-20251101",
            "claude-sonnet-4-6",
            "claude-opus-4-6",
            "claude-opus-5",
            "claude-haiku-4-6",
            "claude",
            "claude-sonnet-latest",
            "gpt-5",
            "litellm/deepseek/deepseek-chat",
        ] {
            assert!(!strips_earlier_thinking(m), "{m}");
        }
    }
}
