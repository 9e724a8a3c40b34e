//! The canonical text of an item (see the cost model in [`crate::tokens`]): every
//! provider-bound field as plain text, media parts and opaque payloads costed apart
//! (`media`, `opaque`).

use serde_json::{Map, Value};

use super::media::media_cost;
use super::opaque::{
    is_claude_thinking, payload_cost, payload_kind, redacted_thinking, PayloadCost,
};
use super::{Encoding, ItemCost, TokenError, MAX_DEPTH};

/// Text, media and opaque payloads of an item in the canonical form described in the
/// module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Canonical {
    pub text: String,
    pub media_tokens: u64,
    /// Tokens of the opaque payloads by their decoded size (see [`super::opaque`]).
    pub opaque_tokens: u64,
    /// An opaque payload that is not valid base64, counted in `text` instead (its field).
    pub fallback: Option<&'static str>,
    /// The framing of the item under its encoding ([`Encoding::item_overhead`]).
    pub overhead: u64,
}

/// Render an item into its canonical text (plus media tokens, costed by the published rules).
pub fn canonical(item: &Value, enc: Encoding) -> Result<Canonical, TokenError> {
    let Value::Object(map) = item else {
        return Err(TokenError::BadItem {
            field: "(item)".to_string(),
            message: "an item must be a JSON object".to_string(),
        });
    };
    let mut out = Canonical {
        overhead: enc.item_overhead(),
        ..Canonical::default()
    };
    let mut path = String::new();
    render_object(map, true, enc, &mut out, &mut path, 0)?;
    Ok(out)
}

impl Canonical {
    /// The item's cost given the token count of [`Canonical::text`].
    pub fn cost(&self, text_tokens: u64) -> ItemCost {
        ItemCost {
            text: text_tokens,
            media: self.media_tokens,
            overhead: self.overhead,
            opaque: self.opaque_tokens,
            fallback: self.fallback,
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
        if top && key == "provider_data" && is_claude_thinking(map) {
            // Claude's redacted thinking travels in the raw blocks the SDK sends back.
            let redacted = redacted_thinking(map);
            if !redacted.is_empty() {
                out.text.push_str("redacted_thinking: ");
                out.text.push_str(&redacted.join("\n"));
                out.text.push('\n');
            }
            continue;
        }
        if top && key == "provider_data" {
            // Gemini's thought signature rides on its function call and is sent back with it.
            if let Some(sig) = value.get("thought_signature").and_then(Value::as_str) {
                out.text.push_str("thought_signature: ");
                out.text.push_str(sig);
                out.text.push('\n');
            }
        }
        if top && is_stripped_top_level(key, value) {
            continue;
        }
        let saved = push_path(path, key);
        out.text.push_str(key);
        out.text.push_str(": ");
        if !(top && costed_apart(map, key, value, out)) {
            render_value(value, enc, out, path, depth + 1)?;
        }
        out.text.push('\n');
        path.truncate(saved);
    }
    Ok(())
}

/// Cost an opaque payload (a top-level field, see [`super::opaque`]) apart from the text:
/// `true` when it was (its key stays in the text, its value does not). A payload that is
/// not valid base64 is left to the text, and the item says so ([`Canonical::fallback`]).
fn costed_apart(map: &Map<String, Value>, key: &str, value: &Value, out: &mut Canonical) -> bool {
    let (Some(kind), Value::String(payload)) = (payload_kind(map, key), value) else {
        return false;
    };
    match payload_cost(kind, payload) {
        PayloadCost::Opaque(n) => out.opaque_tokens = out.opaque_tokens.saturating_add(n),
        PayloadCost::Media(n) => out.media_tokens = out.media_tokens.saturating_add(n),
        PayloadCost::Text => {
            out.fallback = Some(kind.field());
            return false;
        }
    }
    true
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::{item_cost, ITEM_OVERHEAD};
    use serde_json::json;

    #[test]
    fn claude_thinking_is_never_decoded_as_an_openai_payload() {
        // As the SDK's Chat Completions converter stores Claude's thinking (LiteLLM): the
        // signatures joined in encrypted_content, the raw blocks in provider_data.
        let sig = "EqQBCkgIARABGAIiQL".repeat(20);
        let item = json!({
            "type": "reasoning",
            "id": "__fake_id__",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "The user wants the weather."}],
            "encrypted_content": format!("{sig}\n{sig}"),
            "provider_data": {"thinking_blocks": [
                {"type": "thinking", "thinking": "The user wants the weather.", "signature": sig},
                {"type": "redacted_thinking", "data": "RkVEQ0JB".repeat(30)},
            ]},
        });
        let enc = Encoding::O200kBase;
        let c = canonical(&item, enc).unwrap();
        assert_eq!(c.opaque_tokens, 0);
        assert_eq!(c.fallback, None);
        assert!(c.text.contains(&sig), "the signatures are counted as text");
        assert!(
            c.text.contains(&"RkVEQ0JB".repeat(30)),
            "redacted thinking too"
        );
        assert!(c.text.contains("The user wants the weather."));
        // The same payload on an OpenAI reasoning item is decoded (and costs far less).
        let mut openai = item.clone();
        openai.as_object_mut().unwrap().remove("provider_data");
        openai["encrypted_content"] = json!(sig);
        let o = canonical(&openai, enc).unwrap();
        assert!(!o.text.contains(&sig));
        assert!(item_cost(&item, enc).unwrap().total() > item_cost(&openai, enc).unwrap().total());
    }

    #[test]
    fn a_gemini_thought_signature_is_counted_with_its_call() {
        let sig = "CiQBVKhc7".repeat(40);
        let call = json!({"type": "function_call", "call_id": "c1", "name": "f",
            "arguments": "{}", "provider_data": {"thought_signature": sig, "model": "gemini"}});
        let c = canonical(&call, Encoding::O200kBase).unwrap();
        assert!(c.text.contains(&format!("thought_signature: {sig}")));
        assert!(
            !c.text.contains("gemini"),
            "the rest of provider_data is not sent"
        );
        assert_eq!(c.opaque_tokens, 0);
    }

    #[test]
    fn the_framing_is_the_encodings() {
        let item = json!({"role": "user", "content": "hello"});
        for (enc, overhead) in [
            (Encoding::O200kBase, 4),
            (Encoding::Llama3, 5),
            (Encoding::Qwen2, 5),
            (Encoding::DeepseekV3, 4),
            (Encoding::Tekken, 4),
            (Encoding::ClaudeEstimate, 8),
        ] {
            let cost = item_cost(&item, enc).unwrap();
            assert_eq!(cost.overhead, overhead, "{}", enc.name());
            assert!(cost.overhead >= ITEM_OVERHEAD);
        }
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
    fn opaque_payloads_are_costed_by_their_decoded_size() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE;
        // 4000 bytes past the envelope, random-looking as ciphertext is.
        let mut seed = 23u64;
        let bytes: Vec<u8> = (0..4650)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 56) as u8
            })
            .collect();
        let payload = b64.encode(bytes);
        let enc = Encoding::O200kBase;
        for ty in ["reasoning", "compaction"] {
            let item =
                json!({"type": ty, "id": "x_1", "summary": [], "encrypted_content": payload});
            let c = canonical(&item, enc).unwrap();
            assert_eq!(
                c.text,
                format!("encrypted_content: \nid: x_1\nsummary: \ntype: {ty}\n")
            );
            assert_eq!((c.opaque_tokens, c.fallback), (1250, None), "{ty}");
            let cost = item_cost(&item, enc).unwrap();
            assert_eq!(cost.opaque, 1250);
            assert_eq!(cost.total(), cost.text + ITEM_OVERHEAD + 1250);
            // The same payload read as text costs far more: the old rule.
            assert!(enc.count(&payload).unwrap() > 3 * 1250);
        }
        // Not valid base64: counted as text, and said so.
        let bad = json!({"type": "reasoning", "summary": [], "encrypted_content": "enc!"});
        let c = canonical(&bad, enc).unwrap();
        assert!(c.text.contains("encrypted_content: enc!\n"));
        assert_eq!(
            (c.opaque_tokens, c.fallback),
            (0, Some("encrypted_content"))
        );
        // Only the top-level field of these item types is decoded; null is text.
        for item in [
            json!({"role": "user", "content": "x", "encrypted_content": payload}),
            json!({"type": "function_call_output", "call_id": "c", "output": {"encrypted_content": payload}}),
            json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": payload}]}),
        ] {
            let c = canonical(&item, enc).unwrap();
            assert!(c.text.contains(&payload), "{item}");
            assert_eq!((c.opaque_tokens, c.fallback), (0, None));
        }
        let null = canonical(
            &json!({"type": "reasoning", "encrypted_content": null}),
            enc,
        )
        .unwrap();
        assert_eq!(null.text, "encrypted_content: null\ntype: reasoning\n");
    }

    #[test]
    fn image_generation_results_cost_as_images() {
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
        let enc = Encoding::O200kBase;
        let item = json!({"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": png});
        let c = canonical(&item, enc).unwrap();
        assert_eq!(
            c.text,
            "id: ig_1\nresult: \nstatus: completed\ntype: image_generation_call\n"
        );
        assert_eq!(
            (c.media_tokens, c.opaque_tokens, c.fallback),
            (255, 0, None)
        );
        let unreadable = json!({"type": "image_generation_call", "id": "ig_1", "result": "abcd"});
        let c = canonical(&unreadable, enc).unwrap();
        assert!(c.text.contains("result: abcd\n"));
        assert_eq!((c.media_tokens, c.fallback), (0, Some("result")));
        let none = json!({"type": "image_generation_call", "id": "ig_1", "result": null});
        assert_eq!(canonical(&none, enc).unwrap().fallback, None);
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
