//! A front end's JSON-like values read into [`serde_json::Value`]s ([`json_value`],
//! [`json_item`]): the walk, its depth limit, the field paths errors name and their messages
//! are here; a front end only says what each of its values is ([`JsonSource::shape`]).

use serde_json::{Map, Number, Value};

use crate::items::{ItemError, ItemValue, NotText};
use crate::tokens::{quietly, MAX_DEPTH};

/// What one value of a front end is, as [`json_value`] reads it.
pub enum Shape<'a, V: JsonSource> {
    Null,
    /// A string; `Err`: it is not valid text.
    Text(Result<&'a str, NotText>),
    Bool(bool),
    Int(i64),
    UInt(u64),
    /// An integer beyond 64 bits, as its exact decimal text (it is counted as text).
    BigInt(String),
    Float(f64),
    /// A mapping's entries (a key is read with [`ItemValue::text`]).
    Map(V::Entries),
    /// A list's elements; reading one may fail ([`JsonSource::failed`]).
    List(V::Items),
    /// Anything else: not a JSON value.
    Other,
}

/// A value of a front end, read by [`json_value`].
pub trait JsonSource: ItemValue {
    /// The front end's own failure while reading a list's element.
    type Fault;
    type Entries: Iterator<Item = (Self, Self)>;
    type Items: Iterator<Item = Result<Self, Self::Fault>>;

    /// What the value is; `at()` is the field the front end's own errors name.
    fn shape(&self, at: &dyn Fn() -> String) -> Result<Shape<'_, Self>, Self::Error>;
    /// The error for `fault` at `field`.
    fn failed(field: String, fault: Self::Fault) -> Self::Error;
}

/// One item as a JSON value: it must be a mapping.
pub fn json_item<V: JsonSource>(item: &V) -> Result<Value, V::Error> {
    if item.mapping("(item)")?.is_none() {
        let message = format!("an item must be a mapping (dict), got {}", item.type_name());
        return Err(error("(item)".to_string(), message));
    }
    json_value(item)
}

/// `value` as a JSON value, errors naming the field path inside it ("(item)": the value
/// itself). A panic while it is read (a front end's mapping changed under its iterator) is
/// caught, silently, and is an error naming the item.
pub fn json_value<V: JsonSource>(value: &V) -> Result<Value, V::Error> {
    let caught = quietly(std::panic::AssertUnwindSafe(|| {
        walk(value, &mut String::new(), 0)
    }));
    caught.unwrap_or_else(|_| {
        let message = "changed while it was being read (by its own code or another thread)";
        Err(error("(item)".to_string(), message.to_string()))
    })
}

fn error<E: From<ItemError>>(field: String, message: String) -> E {
    E::from(ItemError { field, message })
}

fn here(path: &str) -> String {
    if path.is_empty() {
        "(item)".to_string()
    } else {
        path.to_string()
    }
}

fn walk<V: JsonSource>(value: &V, path: &mut String, depth: usize) -> Result<Value, V::Error> {
    let fail = |path: &str, message: String| error(here(path), message);
    if depth > MAX_DEPTH {
        return Err(fail(
            path,
            format!("nesting deeper than {MAX_DEPTH} levels"),
        ));
    }
    Ok(match value.shape(&|| here(path))? {
        Shape::Null => Value::Null,
        Shape::Text(Ok(s)) => Value::String(s.to_string()),
        Shape::Text(Err(NotText)) => {
            let message = "is not valid UTF-8 text (lone surrogate?)";
            return Err(fail(path, message.to_string()));
        }
        Shape::Bool(b) => Value::Bool(b),
        Shape::Int(i) => Value::Number(i.into()),
        Shape::UInt(u) => Value::Number(u.into()),
        Shape::BigInt(text) => Value::String(text),
        Shape::Float(v) => match Number::from_f64(v) {
            Some(n) => Value::Number(n),
            None => {
                return Err(fail(
                    path,
                    format!("{v} is not a JSON number (NaN or infinity)"),
                ))
            }
        },
        Shape::Map(entries) => {
            let mut map = Map::new();
            for (k, v) in entries {
                let key = match k.text() {
                    Some(Ok(key)) => key.to_string(),
                    Some(Err(NotText)) => {
                        return Err(fail(path, "has a key that is not valid UTF-8".to_string()))
                    }
                    None => {
                        let message = format!("has a non-string key of type {}", k.type_name());
                        return Err(fail(path, message));
                    }
                };
                let saved = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&key);
                let value = walk(&v, path, depth + 1)?;
                path.truncate(saved);
                map.insert(key, value);
            }
            Value::Object(map)
        }
        Shape::List(items) => {
            let mut out = Vec::new();
            for (i, v) in items.enumerate() {
                let v = v.map_err(|e| V::failed(here(path), e))?;
                let saved = path.len();
                path.push_str(&format!("[{i}]"));
                out.push(walk(&v, path, depth + 1)?);
                path.truncate(saved);
            }
            Value::Array(out)
        }
        Shape::Other => {
            return Err(fail(
                path,
                format!("{} is not a JSON value", value.type_name()),
            ));
        }
    })
}
