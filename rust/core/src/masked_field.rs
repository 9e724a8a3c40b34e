//! What masking changes in one item ([`MaskedField`]) and the version of the masked form
//! ([`MASK_RULE`]): the values [`crate::mask`] makes and [`crate::mask_cache`] keeps, apart
//! from both so that the masking imports the cache and the cache imports only this.

use std::sync::Arc;

use serde_json::Value;

/// Version of the masked form as far as stored masked costs depend on it (the excerpt, the
/// marker and every masked form of [`crate::mask::mask_unit_fields`]): an index snapshot
/// records the rule its masked costs were counted under, and masked costs of another rule
/// are never reused.
/// Bump it with any change that can change a masked copy's cost.
///
/// * 1: the masked forms of protoprompt 0.2.0 (`docs/masking.md`).
pub const MASK_RULE: u8 = 1;

/// What masking changes in one item: one field replaced ([`crate::mask::MASKED_FIELDS`]).
#[derive(Debug, Clone)]
pub struct MaskedField {
    /// `"output"` or `"tools"`.
    pub field: &'static str,
    /// The field's masked value (shared by every copy of the field: see
    /// [`MaskedField::detached`]).
    pub value: Arc<Value>,
    /// The length of the item's own value of the field: characters of a string, elements
    /// of a list. A copy made from a memo checks it against the item it stands for (a cheap
    /// guard against an item changed behind an index).
    pub original_len: usize,
    /// The copy's exact cost (always counted by [`crate::mask::mask_unit_fields`]; `None`
    /// only in a field made otherwise).
    pub cost: Option<u64>,
    /// Where a caller may keep `value` converted once, for every later copy (the binding
    /// keeps an immutable text's Python string here: a memo's masked field is reused turn
    /// after turn).
    pub converted: std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
}

impl PartialEq for MaskedField {
    fn eq(&self, other: &Self) -> bool {
        (self.field, &self.value, self.original_len)
            == (other.field, &other.value, other.original_len)
    }
}

impl MaskedField {
    /// The masked copy of `item` (the item with this field replaced).
    pub fn apply(&self, item: &Value) -> Value {
        let mut copy = item.clone();
        if let Value::Object(map) = &mut copy {
            map.insert(self.field.to_string(), Value::clone(&self.value));
        }
        copy
    }

    /// Whether an item's own value of the field, of length `len` (`None`: absent or without
    /// a length), is still the one this field was made from; if not, the item changed
    /// behind the index that remembered it (`Err`: what is wrong with the field).
    pub fn check_len(&self, len: Option<usize>) -> Result<(), &'static str> {
        if len == Some(self.original_len) {
            return Ok(());
        }
        Err(
            "changed since its masked copy was made (the items an index has seen must stay \
             as they are)",
        )
    }

    /// A text value as the caller converts it (`make`, run for the first copy only: a text
    /// is immutable, so one conversion serves every later copy); `None` for a value that is
    /// not a text, or when a conversion of another type was kept.
    pub fn converted_text<T: std::any::Any + Send + Sync>(
        &self,
        make: impl FnOnce(&str) -> T,
    ) -> Option<&T> {
        let Value::String(text) = &*self.value else {
            return None;
        };
        let kept = self.converted.get_or_init(|| Arc::new(make(text)));
        kept.downcast_ref::<T>()
    }

    /// A copy of its own: the value shared, nothing converted yet.
    pub fn detached(&self) -> MaskedField {
        MaskedField {
            field: self.field,
            value: Arc::clone(&self.value),
            original_len: self.original_len,
            cost: self.cost,
            converted: std::sync::OnceLock::new(),
        }
    }

    /// Approximate bytes of memory it holds.
    pub fn heap_bytes(&self) -> usize {
        fn size(v: &Value) -> usize {
            match v {
                Value::String(s) => s.len() + 24,
                Value::Array(a) => a.iter().map(size).sum::<usize>() + 24,
                Value::Object(m) => m.iter().map(|(k, v)| k.len() + size(v) + 32).sum(),
                _ => 16,
            }
        }
        size(&self.value) + std::mem::size_of::<MaskedField>()
    }
}

/// The length [`MaskedField::original_len`] records for a field's value.
pub fn value_len(v: &Value) -> usize {
    match v {
        Value::String(s) => s.chars().count(),
        Value::Array(a) => a.len(),
        Value::Object(m) => m.len(),
        _ => 0,
    }
}
