//! The canonical text of an item (see the cost model in [`crate::tokens`]): every
//! provider-bound field as plain text, media parts costed apart (`media`).

use serde_json::{Map, Value};

use super::media::media_cost;
use super::{Encoding, ItemCost, TokenError, ITEM_OVERHEAD, MAX_DEPTH};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::item_cost;
    use serde_json::json;

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
    fn deep_nesting_is_an_error() {
        let mut v = json!("leaf");
        for _ in 0..(MAX_DEPTH + 5) {
            v = json!({ "k": v });
        }
        let err = canonical(&json!({"type":"x","output": v}), Encoding::O200kBase).unwrap_err();
        assert!(matches!(err, TokenError::BadItem { .. }));
    }
}
