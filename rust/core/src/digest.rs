//! Content digests of JSON-like values: what a cache keys on when the value it describes may
//! change between two uses (a tool schema edited in place, an item of a model call's input
//! edited by another filter).
//!
//! A digest is SipHash-1-3 (128 bits) over a prefix-free encoding of the value: every value
//! writes a tag byte, strings, maps and lists also their length first, so two different
//! values never feed the hasher the same bytes. The key is drawn once per process: nobody who
//! chooses the content (a tool's output, a web page) can craft two values with one digest,
//! and digests are never stored (they mean nothing to another process).
//!
//! A value that has no JSON form (an object the caller cannot read, an integer too large to
//! render) is [`Digester::opaque`]: its digest differs from every other digest ever made, so
//! whatever describes it is never reused.
//!
//! Key order is part of the digest: the same content in another key order digests
//! differently, which only costs a recount.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use serde_json::Value;
use siphasher::sip128::{Hasher128, SipHasher13};

/// Bytes of one digest.
pub const DIGEST_BYTES: usize = 16;

/// The digest of one value.
pub type Digest = [u8; DIGEST_BYTES];

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const INT: u8 = 3;
const UINT: u8 = 4;
const FLOAT: u8 = 5;
const TEXT: u8 = 6;
const MAP: u8 = 7;
const LIST: u8 = 8;
const OPAQUE: u8 = 9;
const HASHED_TEXT: u8 = 10;

fn process_key() -> &'static [u8; 16] {
    static KEY: OnceLock<[u8; 16]> = OnceLock::new();
    KEY.get_or_init(|| {
        let state = RandomState::new();
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&state.hash_one(0x70726f746fu64).to_le_bytes());
        key[8..].copy_from_slice(&state.hash_one(0x70726f6d7074u64).to_le_bytes());
        key
    })
}

/// Feeds one value, depth first, into a digest. The encoding is collected in a buffer and
/// hashed at the end (one bulk hash is several times faster than many small writes).
pub struct Digester {
    buf: Vec<u8>,
}

impl Default for Digester {
    fn default() -> Self {
        Digester::new()
    }
}

impl Digester {
    pub fn new() -> Digester {
        Digester {
            buf: Vec::with_capacity(256),
        }
    }

    fn tag(&mut self, tag: u8) {
        self.buf.push(tag);
    }

    fn u64(&mut self, value: u64) {
        self.buf.extend_from_slice(&value.to_le_bytes());
    }

    pub fn null(&mut self) {
        self.tag(NULL);
    }

    pub fn bool(&mut self, value: bool) {
        self.tag(if value { TRUE } else { FALSE });
    }

    pub fn int(&mut self, value: i64) {
        self.tag(INT);
        self.u64(value as u64);
    }

    pub fn uint(&mut self, value: u64) {
        self.tag(UINT);
        self.u64(value);
    }

    pub fn float(&mut self, value: f64) {
        self.tag(FLOAT);
        self.u64(value.to_bits());
    }

    pub fn text(&mut self, value: &str) {
        self.tag(TEXT);
        self.u64(value.len() as u64);
        self.buf.extend_from_slice(value.as_bytes());
    }

    /// A text known by its length in characters and a keyed 64-bit hash of it computed
    /// elsewhere (the Python binding uses the interpreter's own string hash, cached in every
    /// string object and keyed per process: an unchanged string costs nothing to digest
    /// again). Never equal to a [`Digester::text`].
    pub fn hashed_text(&mut self, chars: u64, hash: u64) {
        self.tag(HASHED_TEXT);
        self.u64(chars);
        self.u64(hash);
    }

    /// A map of `len` entries follows: `len` pairs of [`Digester::key`] and a value.
    pub fn map(&mut self, len: usize) {
        self.tag(MAP);
        self.u64(len as u64);
    }

    pub fn key(&mut self, key: &str) {
        self.u64(key.len() as u64);
        self.buf.extend_from_slice(key.as_bytes());
    }

    /// A list of `len` values follows.
    pub fn list(&mut self, len: usize) {
        self.tag(LIST);
        self.u64(len as u64);
    }

    /// A JSON value, depth first (what [`value_digest`] digests).
    pub fn value(&mut self, value: &Value) {
        feed(self, value);
    }

    /// A value without a JSON form: the digest will equal no other.
    pub fn opaque(&mut self) {
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        self.tag(OPAQUE);
        self.u64(SERIAL.fetch_add(1, Ordering::Relaxed));
    }

    pub fn finish(self) -> Digest {
        let mut hasher = SipHasher13::new_with_key(process_key());
        hasher.write(&self.buf);
        hasher.finish128().as_bytes()
    }
}

/// The digest of a JSON value (the same digest the binding computes for the Python value it
/// came from).
pub fn value_digest(value: &Value) -> Digest {
    let mut d = Digester::new();
    feed(&mut d, value);
    d.finish()
}

fn feed(d: &mut Digester, value: &Value) {
    match value {
        Value::Null => d.null(),
        Value::Bool(b) => d.bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                d.int(i);
            } else if let Some(u) = n.as_u64() {
                d.uint(u);
            } else {
                d.float(n.as_f64().unwrap_or(f64::NAN));
            }
        }
        Value::String(s) => d.text(s),
        Value::Array(items) => {
            d.list(items.len());
            for v in items {
                feed(d, v);
            }
        }
        Value::Object(map) => {
            d.map(map.len());
            for (k, v) in map {
                d.key(k);
                feed(d, v);
            }
        }
    }
}

/// How many leading digests of `current` equal those of `previous` (both concatenations of
/// [`DIGEST_BYTES`]-byte digests).
pub fn common_prefix(current: &[u8], previous: &[u8]) -> usize {
    current
        .chunks_exact(DIGEST_BYTES)
        .zip(previous.chunks_exact(DIGEST_BYTES))
        .take_while(|(a, b)| a == b)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn equal_values_digest_equally_and_any_change_differs() {
        let a = json!({"role": "user", "content": [{"type": "input_text", "text": "hi"}]});
        assert_eq!(value_digest(&a), value_digest(&a.clone()));
        let variants = [
            json!({"role": "user", "content": [{"type": "input_text", "text": "hi!"}]}),
            json!({"role": "user", "content": [{"type": "input_text", "text": "hi"}, {}]}),
            json!({"role": "user", "content": [{"type": "input_text", "text": "hi", "x": null}]}),
            json!({"role": "user", "content": [{"type": "input_text"}]}),
            json!({"role": "user", "content": "hi"}),
            json!({"role": "user"}),
        ];
        for v in &variants {
            assert_ne!(value_digest(&a), value_digest(v), "{v}");
        }
    }

    #[test]
    fn the_encoding_is_prefix_free() {
        // Concatenations that would feed the same bytes without lengths and tags.
        let pairs = [
            (json!(["ab", "c"]), json!(["a", "bc"])),
            (json!(["a", ["b"]]), json!([["a"], "b"])),
            (json!({"ab": "c"}), json!({"a": "bc"})),
            (json!([1]), json!([1.0])),
            (json!([1]), json!(["1"])),
            (json!([true]), json!([1])),
            (json!([null]), json!([])),
            (json!([[]]), json!([{}])),
            (json!(-1), json!(u64::MAX)),
        ];
        for (a, b) in &pairs {
            assert_ne!(value_digest(a), value_digest(b), "{a} vs {b}");
        }
    }

    #[test]
    fn opaque_values_equal_nothing() {
        let one = || {
            let mut d = Digester::new();
            d.list(1);
            d.opaque();
            d.finish()
        };
        assert_ne!(one(), one());
    }

    #[test]
    fn common_prefix_counts_whole_digests() {
        let a = [value_digest(&json!(1)), value_digest(&json!(2))].concat();
        let b = [value_digest(&json!(1)), value_digest(&json!(3))].concat();
        assert_eq!(common_prefix(&a, &b), 1);
        assert_eq!(common_prefix(&a, &a), 2);
        assert_eq!(common_prefix(&a, &a[..DIGEST_BYTES]), 1);
        assert_eq!(common_prefix(&a, &[]), 0);
    }
}
