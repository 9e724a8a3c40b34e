//! The options of a pack as one checked value ([`CallOptions`]), and the rules of its
//! fields: an embedding hands each field's value as it has it ([`FieldValue`]: a Python
//! object, say) and [`CallOptions::set_field`] checks its type and range, with the messages
//! the embedding raises; the cost basis of a model and the thinking rule are worked out here
//! too ([`CallOptions::rebase`]).

use crate::mask::Masking;
use crate::pack::{PackOptions, Policy};
use crate::tokens::{strips_earlier_thinking, CostBasis, Encoding, OpaqueScale, TokenError};

/// The options of a pack (and of the index calls that take them), checked when each is set.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOptions {
    /// Budget, reservations and policy.
    pub pack: PackOptions,
    /// The encoding and the calibration of opaque payloads (from `model`, `encoding` and
    /// `opaque_scale`, see [`CallOptions::rebase`]).
    pub basis: CostBasis,
    pub model: Option<String>,
    pub encoding: Option<String>,
    pub opaque_scale: f64,
    /// History positions kept whatever the budget.
    pub pinned: Vec<usize>,
    /// How many items of the caller's list are history (`None`: all of it).
    pub history_len: Option<usize>,
    /// The caller's list holds the history from this position on.
    pub history_offset: usize,
    pub masking: Option<Masking>,
    /// The model strips earlier turns' thinking (older Claude generations): the thinking
    /// before the last user message costs 0 in this call.
    pub strips_thinking: bool,
    /// A unit sent masked leaves out its reasoning when it stands before the last user
    /// message (see [`crate::pipeline::earlier_reasoning`]).
    pub omit_reasoning: bool,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            pack: PackOptions::default(),
            basis: CostBasis {
                encoding: Encoding::O200kBase,
                opaque_scale: OpaqueScale::ONE,
            },
            model: None,
            encoding: None,
            opaque_scale: 1.0,
            pinned: Vec::new(),
            history_len: None,
            history_offset: 0,
            masking: None,
            strips_thinking: false,
            omit_reasoning: false,
        }
    }
}

/// Why [`CallOptions::rebase`] refused the options.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionsError {
    /// The model or encoding is not known.
    Token(TokenError),
    /// The calibration is out of range (for the encoding).
    Value(String),
}

impl CallOptions {
    /// Work out the cost basis of `model`, `encoding` and `opaque_scale` again (after any of
    /// them changed), and whether the model strips earlier thinking.
    pub fn rebase(&mut self) -> Result<(), OptionsError> {
        let encoding = Encoding::resolve(self.model.as_deref(), self.encoding.as_deref())
            .map_err(OptionsError::Token)?;
        let scale = OpaqueScale::checked(self.opaque_scale).map_err(OptionsError::Value)?;
        self.basis = CostBasis::checked(encoding, scale).map_err(OptionsError::Value)?;
        self.strips_thinking = self.model.as_deref().is_some_and(strips_earlier_thinking);
        Ok(())
    }

    /// Set the masking (`None`: off) and whether masked units leave out earlier reasoning.
    pub fn set_masking(&mut self, masking: Option<Masking>, omit_reasoning: bool) {
        self.masking = masking;
        self.omit_reasoning = masking.is_some() && omit_reasoning;
    }

    /// The thinking rule a pack with these options applies.
    pub fn thinking_rule(&self) -> &'static str {
        if self.strips_thinking {
            "earlier-turns-free"
        } else {
            "whole"
        }
    }

    /// The options as the embedding's `PackOptions(...)` shows them.
    pub fn describe(&self) -> String {
        let model = self
            .model
            .as_deref()
            .map_or("None".to_string(), |m| format!("'{m}'"));
        format!(
            "PackOptions(max_tokens={}, output_reserve={}, context_tokens={}, model={model}, \
             encoding='{}', policy='{}', opaque_scale={:?}, masking={})",
            self.pack.budget,
            self.pack.output_reserve,
            self.pack.context_tokens,
            self.basis.encoding.name(),
            self.pack.policy.name(),
            self.opaque_scale,
            if self.masking.is_some() { "on" } else { "None" },
        )
    }
}

/// An integer as [`FieldValue::int`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
    /// In `0..=u64::MAX`.
    Fits(u64),
    Negative,
    /// Above `u64::MAX`.
    TooBig,
}

/// One option's value as the embedding has it (a Python object, say): what the rules of
/// [`CallOptions::set_field`] ask of it. Reading it may fail with the embedding's own
/// error (`Error`: a Python exception), which the call then ends with.
pub trait FieldValue: Sized {
    type Error;
    /// The elements of an iterable value, each read when it is reached.
    type Elements: Iterator<Item = Result<Self, Self::Error>>;

    fn is_none(&self) -> bool;
    /// The value as an integer, if it is one (a bool is not).
    fn int(&self) -> Option<Int>;
    /// The value as a float, if it is a number that has one (a bool is not).
    fn number(&self) -> Option<f64>;
    /// The value as text, if it is text.
    fn text(&self) -> Option<String>;
    /// Whether the value counts as true.
    fn truthy(&self) -> Result<bool, Self::Error>;
    /// The elements of a value that is iterable and not text or bytes (`None`: it is not).
    fn elements(&self) -> Result<Option<Self::Elements>, Self::Error>;
    /// The name of the value's type, for messages.
    fn type_name(&self) -> String;
    /// The value as its source writes it (`repr`), for messages.
    fn repr(&self) -> String;
    /// The value as text (`str`), for messages.
    fn shown(&self) -> String;
}

/// Why [`CallOptions::set_field`] refused a value: its type (the embedding's `TypeError`),
/// its value (`ValueError`), or the error reading it raised.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldError<E> {
    Type(String),
    Value(String),
    Raised(E),
}

/// A token count: an integer in `0..=u64::MAX`.
fn size<V: FieldValue>(name: &str, value: &V) -> Result<u64, FieldError<V::Error>> {
    match value.int() {
        Some(Int::Fits(n)) => Ok(n),
        Some(Int::Negative) => Err(FieldError::Value(format!(
            "{name} must be >= 0, got {}",
            value.shown()
        ))),
        Some(Int::TooBig) => Err(FieldError::Value(format!(
            "{name} must be at most 2**64 - 1 tokens, got {}",
            value.shown()
        ))),
        None => Err(FieldError::Type(format!(
            "{name} must be an int, got {}",
            value.type_name()
        ))),
    }
}

fn optional_text<V: FieldValue>(
    name: &str,
    value: &V,
) -> Result<Option<String>, FieldError<V::Error>> {
    if value.is_none() {
        return Ok(None);
    }
    value.text().map(Some).ok_or_else(|| {
        FieldError::Type(format!(
            "{name} must be a str or None, got {}",
            value.type_name()
        ))
    })
}

/// A position: a non-negative integer (`what` names the accepted values in the message).
fn position<V: FieldValue>(
    name: &str,
    what: &str,
    value: &V,
) -> Result<usize, FieldError<V::Error>> {
    match value.int() {
        Some(Int::Fits(n)) => usize::try_from(n).ok(),
        _ => None,
    }
    .ok_or_else(|| FieldError::Value(format!("{name} must be {what}, got {}", value.repr())))
}

/// History positions: an iterable (not text) of non-negative integers.
fn pinned<V: FieldValue>(value: &V) -> Result<Vec<usize>, FieldError<V::Error>> {
    let refused = || {
        FieldError::Type(format!(
            "pinned must be an iterable of history positions, got {}",
            value.type_name()
        ))
    };
    let elements = value.elements().map_err(FieldError::Raised)?;
    let mut pins = Vec::new();
    for (i, p) in elements.ok_or_else(refused)?.enumerate() {
        let p = p.map_err(FieldError::Raised)?;
        pins.push(
            match p.int() {
                Some(Int::Fits(n)) => usize::try_from(n).map_err(|_| Int::TooBig),
                Some(other) => Err(other),
                None => {
                    return Err(FieldError::Type(format!(
                        "pinned[{i}] must be an int, got {}",
                        p.type_name()
                    )))
                }
            }
            .map_err(|_| {
                FieldError::Value(format!(
                    "pinned[{i}] is {}, not a history position",
                    p.repr()
                ))
            })?,
        );
    }
    Ok(pins)
}

/// A calibration of opaque payloads: a number within [`OpaqueScale`]'s bounds.
fn scale<V: FieldValue>(value: &V) -> Result<f64, FieldError<V::Error>> {
    let Some(factor) = value.number() else {
        return Err(FieldError::Type(format!(
            "opaque_scale must be a number, got {}",
            value.type_name()
        )));
    };
    let (min, max) = (OpaqueScale::MIN.factor(), OpaqueScale::MAX.factor());
    if !(min..=max).contains(&factor) {
        return Err(FieldError::Value(format!(
            "opaque_scale must be between {min:?} and {max:?}, got {}",
            value.repr()
        )));
    }
    Ok(factor)
}

impl CallOptions {
    /// The fields an embedding's options value has, in order ([`CallOptions::set_field`]
    /// checks all but `context` and `masking`, which hold the embedding's own objects).
    pub const FIELDS: [&'static str; 12] = [
        "max_tokens",
        "output_reserve",
        "context_tokens",
        "model",
        "encoding",
        "policy",
        "context",
        "pinned",
        "history_len",
        "history_offset",
        "opaque_scale",
        "masking",
    ];

    /// Check `value` for the field `name` and set it: `Ok(true)` when the cost basis must
    /// be worked out again ([`CallOptions::rebase`]). An unknown name (`context` and
    /// `masking` included) is a type error, as an unexpected keyword argument is.
    pub fn set_field<V: FieldValue>(
        &mut self,
        name: &str,
        value: &V,
    ) -> Result<bool, FieldError<V::Error>> {
        match name {
            "max_tokens" => self.pack.budget = size(name, value)?,
            "output_reserve" => self.pack.output_reserve = size(name, value)?,
            "context_tokens" => self.pack.context_tokens = size(name, value)?,
            "model" => self.model = optional_text(name, value)?,
            "encoding" => self.encoding = optional_text(name, value)?,
            "opaque_scale" => self.opaque_scale = scale(value)?,
            "policy" => {
                let policy = value
                    .text()
                    .ok_or_else(|| FieldError::Value(format!("unknown policy {}", value.repr())))?;
                self.pack.policy = Policy::parse(&policy).map_err(FieldError::Value)?;
            }
            "pinned" => self.pinned = pinned(value)?,
            "history_len" => {
                self.history_len = if value.is_none() {
                    None
                } else {
                    Some(position(name, "a non-negative int or None", value)?)
                }
            }
            "history_offset" => {
                self.history_offset = if value.truthy().map_err(FieldError::Raised)? {
                    position(name, "a non-negative int", value)?
                } else {
                    0
                }
            }
            _ => {
                return Err(FieldError::Type(format!(
                    "PackOptions got an unexpected keyword argument '{name}'"
                )))
            }
        }
        Ok(matches!(name, "model" | "encoding" | "opaque_scale"))
    }
}
