//! The rules of the options' fields ([`protoprompt_core::options`]): each field's type and
//! range checked by [`CallOptions::set_field`], with the messages an embedding raises, over
//! a stand-in for the embedding's values.

use protoprompt_core::facade::{CallOptions, FieldError, FieldValue, Int};
use protoprompt_core::pack::Policy;

/// A stand-in for a Python value: what `set_field` asks of one.
#[derive(Debug, Clone)]
enum V {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(&'static str),
    List(Vec<V>),
    /// An iterable whose reading fails at this element.
    Failing(usize),
}

impl FieldValue for V {
    type Error = String;
    type Elements = std::vec::IntoIter<Result<V, String>>;

    fn is_none(&self) -> bool {
        matches!(self, V::None)
    }

    fn int(&self) -> Option<Int> {
        match *self {
            V::Int(n) if n < 0 => Some(Int::Negative),
            V::Int(n) => Some(u64::try_from(n).map_or(Int::TooBig, Int::Fits)),
            _ => None,
        }
    }

    fn number(&self) -> Option<f64> {
        match *self {
            V::Int(n) => Some(n as f64),
            V::Float(f) => Some(f),
            _ => None,
        }
    }

    fn text(&self) -> Option<String> {
        match self {
            V::Str(s) => Some(s.to_string()),
            _ => None,
        }
    }

    fn truthy(&self) -> Result<bool, String> {
        Ok(match self {
            V::None => false,
            V::Bool(b) => *b,
            V::Int(n) => *n != 0,
            V::Float(f) => *f != 0.0,
            V::Str(s) => !s.is_empty(),
            V::List(l) => !l.is_empty(),
            V::Failing(_) => return Err("truthiness failed".into()),
        })
    }

    fn elements(&self) -> Result<Option<Self::Elements>, String> {
        Ok(match self {
            V::List(l) => Some(l.iter().cloned().map(Ok).collect::<Vec<_>>().into_iter()),
            V::Failing(at) => {
                let mut out: Vec<Result<V, String>> =
                    (0..*at).map(|i| Ok(V::Int(i as i128))).collect();
                out.push(Err("iteration failed".into()));
                Some(out.into_iter())
            }
            _ => None,
        })
    }

    fn type_name(&self) -> String {
        match self {
            V::None => "NoneType",
            V::Bool(_) => "bool",
            V::Int(_) => "int",
            V::Float(_) => "float",
            V::Str(_) => "str",
            V::List(_) | V::Failing(_) => "list",
        }
        .to_string()
    }

    fn repr(&self) -> String {
        match self {
            V::Str(s) => format!("'{s}'"),
            other => other.shown(),
        }
    }

    fn shown(&self) -> String {
        match self {
            V::None => "None".into(),
            V::Bool(b) => if *b { "True" } else { "False" }.into(),
            V::Int(n) => n.to_string(),
            V::Float(f) => format!("{f:?}"),
            V::Str(s) => s.to_string(),
            V::List(_) | V::Failing(_) => "[...]".into(),
        }
    }
}

fn set(name: &str, value: V) -> Result<(bool, CallOptions), FieldError<String>> {
    let mut o = CallOptions::default();
    let rebase = o.set_field(name, &value)?;
    Ok((rebase, o))
}

fn type_error(name: &str, value: V) -> String {
    match set(name, value) {
        Err(FieldError::Type(m)) => m,
        other => panic!("expected a type error for {name}, got {other:?}"),
    }
}

fn value_error(name: &str, value: V) -> String {
    match set(name, value) {
        Err(FieldError::Value(m)) => m,
        other => panic!("expected a value error for {name}, got {other:?}"),
    }
}

#[test]
fn token_counts_are_ints_in_the_u64_range() {
    let (rebase, o) = set("max_tokens", V::Int(u64::MAX.into())).unwrap();
    assert_eq!((rebase, o.pack.budget), (false, u64::MAX));
    assert_eq!(
        set("output_reserve", V::Int(7))
            .unwrap()
            .1
            .pack
            .output_reserve,
        7
    );
    assert_eq!(
        set("context_tokens", V::Int(0))
            .unwrap()
            .1
            .pack
            .context_tokens,
        0
    );
    assert_eq!(
        type_error("max_tokens", V::Bool(true)),
        "max_tokens must be an int, got bool"
    );
    assert_eq!(
        type_error("output_reserve", V::Float(1.0)),
        "output_reserve must be an int, got float"
    );
    assert_eq!(
        value_error("max_tokens", V::Int(-1)),
        "max_tokens must be >= 0, got -1"
    );
    assert_eq!(
        value_error("context_tokens", V::Int(1 << 64)),
        "context_tokens must be at most 2**64 - 1 tokens, got 18446744073709551616"
    );
}

#[test]
fn model_encoding_and_scale_change_the_basis() {
    let (rebase, o) = set("model", V::Str("gpt-4o")).unwrap();
    assert_eq!((rebase, o.model.as_deref()), (true, Some("gpt-4o")));
    assert_eq!(
        set("encoding", V::None).unwrap(),
        (true, CallOptions::default())
    );
    assert_eq!(
        type_error("encoding", V::Int(3)),
        "encoding must be a str or None, got int"
    );
    let (rebase, o) = set("opaque_scale", V::Int(2)).unwrap();
    assert_eq!((rebase, o.opaque_scale), (true, 2.0));
    assert_eq!(
        type_error("opaque_scale", V::Bool(true)),
        "opaque_scale must be a number, got bool"
    );
    assert_eq!(
        value_error("opaque_scale", V::Float(100.0)),
        "opaque_scale must be between 0.25 and 2.0, got 100.0"
    );
}

#[test]
fn policy_positions_and_pins() {
    assert_eq!(
        set("policy", V::Str("greedy")).unwrap().1.pack.policy,
        Policy::Greedy
    );
    assert_eq!(value_error("policy", V::Int(1)), "unknown policy 1");
    assert!(value_error("policy", V::Str("best")).contains("\"contiguous\" or \"greedy\""));

    assert_eq!(set("history_len", V::None).unwrap().1.history_len, None);
    assert_eq!(
        set("history_len", V::Int(4)).unwrap().1.history_len,
        Some(4)
    );
    assert_eq!(
        value_error("history_len", V::Str("4")),
        "history_len must be a non-negative int or None, got '4'"
    );
    // A false value is offset 0, whatever its type; a true one must be a position.
    assert_eq!(set("history_offset", V::None).unwrap().1.history_offset, 0);
    assert_eq!(
        set("history_offset", V::Int(9)).unwrap().1.history_offset,
        9
    );
    assert_eq!(
        value_error("history_offset", V::Int(-2)),
        "history_offset must be a non-negative int, got -2"
    );
    assert_eq!(
        set("history_offset", V::Failing(0)),
        Err(FieldError::Raised("truthiness failed".into()))
    );

    let pins = V::List(vec![V::Int(3), V::Int(0)]);
    assert_eq!(set("pinned", pins).unwrap().1.pinned, vec![3, 0]);
    assert_eq!(
        type_error("pinned", V::Str("01")),
        "pinned must be an iterable of history positions, got str"
    );
    assert_eq!(
        type_error("pinned", V::List(vec![V::Int(1), V::Bool(false)])),
        "pinned[1] must be an int, got bool"
    );
    assert_eq!(
        value_error("pinned", V::List(vec![V::Int(-1)])),
        "pinned[0] is -1, not a history position"
    );
    // The error reading an element is the call's; elements before it were checked.
    assert_eq!(
        set("pinned", V::Failing(2)),
        Err(FieldError::Raised("iteration failed".into()))
    );
}

#[test]
fn unknown_and_embedding_fields_are_unexpected_keywords() {
    for name in ["budget", "context", "masking"] {
        assert_eq!(
            type_error(name, V::None),
            format!("PackOptions got an unexpected keyword argument '{name}'")
        );
    }
    assert_eq!(CallOptions::FIELDS.len(), 12);
    assert_eq!(CallOptions::FIELDS[0], "max_tokens");
}
