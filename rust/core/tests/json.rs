//! A front end's values read as JSON (`protoprompt_core::json`): values, the field paths and
//! messages of errors, the depth limit, a front end's own failures and panics.

use protoprompt_core::items::{Fault, ItemValue, NotText};
use protoprompt_core::json::{json_item, json_value, JsonSource, Shape};
use serde_json::json;

/// A toy front end's value.
#[derive(Clone)]
enum Toy {
    Null,
    Str(&'static str),
    BadStr,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Big(&'static str),
    Float(f64),
    Map(Vec<(Toy, Toy)>),
    List(Vec<Result<Toy, &'static str>>),
    Object,
    Panics,
}

/// An error: field, message, and the front end's fault behind it.
type Failed = Fault<&'static str>;

impl ItemValue for Toy {
    type Error = Failed;
    type Map = ();

    fn is_null(&self) -> bool {
        matches!(self, Toy::Null)
    }

    fn text(&self) -> Option<Result<&str, NotText>> {
        match self {
            Toy::Str(s) => Some(Ok(s)),
            Toy::BadStr => Some(Err(NotText)),
            _ => None,
        }
    }

    fn type_name(&self) -> String {
        match self {
            Toy::Int(_) | Toy::UInt(_) | Toy::Big(_) => "int",
            Toy::List(_) => "list",
            Toy::Map(_) => "dict",
            _ => "object",
        }
        .to_string()
    }

    fn mapping(&self, _field: &str) -> Result<Option<()>, Failed> {
        Ok(matches!(self, Toy::Map(_)).then_some(()))
    }

    fn entry(_map: &(), _key: &str, _field: &str) -> Result<Option<Toy>, Failed> {
        Ok(None)
    }
}

impl JsonSource for Toy {
    type Fault = &'static str;
    type Entries = std::vec::IntoIter<(Toy, Toy)>;
    type Items = std::vec::IntoIter<Result<Toy, &'static str>>;

    fn shape(&self, _at: &dyn Fn() -> String) -> Result<Shape<'_, Toy>, Failed> {
        Ok(match self {
            Toy::Null => Shape::Null,
            Toy::Str(_) | Toy::BadStr => Shape::Text(self.text().unwrap()),
            Toy::Bool(b) => Shape::Bool(*b),
            Toy::Int(i) => Shape::Int(*i),
            Toy::UInt(u) => Shape::UInt(*u),
            Toy::Big(s) => Shape::BigInt(s.to_string()),
            Toy::Float(f) => Shape::Float(*f),
            Toy::Map(m) => Shape::Map(m.clone().into_iter()),
            Toy::List(l) => Shape::List(l.clone().into_iter()),
            Toy::Object => Shape::Other,
            Toy::Panics => panic!("changed under its iterator"),
        })
    }

    fn failed(field: String, fault: &'static str) -> Failed {
        Fault::raised(field, fault)
    }
}

fn map(entries: Vec<(&'static str, Toy)>) -> Toy {
    Toy::Map(entries.into_iter().map(|(k, v)| (Toy::Str(k), v)).collect())
}

fn list(items: Vec<Toy>) -> Toy {
    Toy::List(items.into_iter().map(Ok).collect())
}

fn failed(field: &str, message: &str) -> Failed {
    Fault::new(field, message)
}

#[test]
fn values_read_as_json_in_their_order() {
    let item = map(vec![
        ("z", Toy::Null),
        (
            "a",
            list(vec![Toy::Int(-3), Toy::UInt(u64::MAX), Toy::Big("1")]),
        ),
        ("f", Toy::Float(0.5)),
        ("t", Toy::Str("x")),
        ("b", Toy::Bool(true)),
    ]);
    let got = json_item(&item).unwrap();
    assert_eq!(
        got,
        json!({"z": null, "a": [-3, u64::MAX, "1"], "f": 0.5, "t": "x", "b": true})
    );
    assert_eq!(json_value(&Toy::Str("s")).unwrap(), json!("s"));
}

#[test]
fn errors_name_the_field_path() {
    let nan = map(vec![(
        "a",
        list(vec![Toy::Int(1), map(vec![("b", Toy::Float(f64::NAN))])]),
    )]);
    let message = "NaN is not a JSON number (NaN or infinity)";
    assert_eq!(json_value(&nan), Err(failed("a[1].b", message)));
    let text = list(vec![Toy::BadStr]);
    let message = "is not valid UTF-8 text (lone surrogate?)";
    assert_eq!(json_value(&text), Err(failed("[0]", message)));
    let other = map(vec![("o", Toy::Object)]);
    assert_eq!(
        json_value(&other),
        Err(failed("o", "object is not a JSON value"))
    );
    assert_eq!(
        json_value(&Toy::Object),
        Err(failed("(item)", "object is not a JSON value"))
    );
}

#[test]
fn keys_must_be_text() {
    let int_key = Toy::Map(vec![(Toy::Int(1), Toy::Null)]);
    let message = "has a non-string key of type int";
    assert_eq!(json_value(&int_key), Err(failed("(item)", message)));
    let bad_key = map(vec![("k", Toy::Map(vec![(Toy::BadStr, Toy::Null)]))]);
    let message = "has a key that is not valid UTF-8";
    assert_eq!(json_value(&bad_key), Err(failed("k", message)));
}

#[test]
fn a_front_end_fault_is_the_error_of_its_list() {
    let item = map(vec![(
        "a",
        Toy::List(vec![Ok(Toy::Int(1)), Err("iteration raised")]),
    )]);
    let want = Fault::caused("a", "iteration raised", "iteration raised");
    assert_eq!(json_value(&item), Err(want));
}

#[test]
fn nesting_is_limited() {
    let nest = |levels: usize| (0..levels).fold(Toy::Int(0), |inner, _| list(vec![inner]));
    assert!(json_value(&nest(64)).is_ok());
    let field = "[0]".repeat(65);
    let message = "nesting deeper than 64 levels";
    assert_eq!(json_value(&nest(66)), Err(failed(&field, message)));
}

#[test]
fn an_item_is_a_mapping() {
    let message = "an item must be a mapping (dict), got list";
    assert_eq!(json_item(&list(vec![])), Err(failed("(item)", message)));
}

#[test]
fn a_panic_while_reading_names_the_item() {
    let item = map(vec![("a", list(vec![Toy::Panics]))]);
    let message = "changed while it was being read (by its own code or another thread)";
    assert_eq!(json_item(&item), Err(failed("(item)", message)));
}
