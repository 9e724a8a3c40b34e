//! SentencePiece BPE (Gemma 3's tokenizer, which Gemini's local token counting uses too),
//! in pure Rust, read from the model file compiled into the core.
//!
//! # The model
//!
//! `vocab/gemma3.spiece.model.zst` is Gemma 3's SentencePiece model
//! (`gemma3_cleaned_262144_v2.spiece.model`, 262,144 pieces, SHA-256
//! `1299c11d7cf632ef3b4e11937501358ada021bbdf7c47638d13c0ee982f2e79c`: the file
//! `google/gemma_pytorch` publishes and the `google-genai` SDK's local tokenizer loads, as
//! the `gemini-tokenizer` crate embeds it; Apache-2.0), zstd-compressed (1.8 MB). It is
//! decompressed and parsed only on the first count under `gemma3`.
//!
//! # The algorithm (SentencePiece's `bpe::Model::SampleEncode` without dropout)
//!
//! 1. Normalise: Gemma's normaliser is the identity with whitespace escaped (no dummy prefix,
//!    no whitespace removal): every `' '` becomes `▁` (U+2581).
//! 2. Split into symbols, left to right: the longest user-defined piece at the position
//!    (`<start_of_turn>`, runs of `\n` or `▁`, HTML tags...), which is never merged, else one
//!    character.
//! 3. Merge: repeatedly the adjacent pair whose concatenation is a piece with the highest
//!    score (ties: the leftmost), until no adjacent pair is a piece.
//! 4. Each symbol is its piece; a character with no piece becomes its UTF-8 bytes
//!    (`<0xNN>` pieces, byte fallback).
//!
//! No merge crosses a point between two bytes that no piece holds side by side
//! ([`Spm::can_split`]): counting the two sides apart gives the count of the whole, which
//! lets long texts be counted in segments like the BPE encodings.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rustc_hash::{FxHashMap, FxHashSet};

/// The compressed model file (see the module documentation).
static GEMMA3_MODEL: &[u8] = include_bytes!("../../vocab/gemma3.spiece.model.zst");

/// SentencePiece's whitespace symbol, `▁` (U+2581).
const SPACE: &[u8] = "\u{2581}".as_bytes();

/// Piece types of SentencePiece's `ModelProto.SentencePiece.Type`.
const NORMAL: u64 = 1;
const UNKNOWN: u64 = 2;
const USER_DEFINED: u64 = 4;
const BYTE: u64 = 6;
const UNUSED: u64 = 5;

/// A SentencePiece BPE model, built once per process.
pub(crate) struct Spm {
    /// Normal and user-defined pieces: id and score.
    pieces: FxHashMap<&'static [u8], (u32, f32)>,
    /// User-defined pieces (matched whole in the text, never merged) and every prefix of one.
    user: FxHashSet<&'static [u8]>,
    user_prefixes: FxHashSet<&'static [u8]>,
    user_first: [bool; 256],
    /// Every id's piece and type (decoded on demand: `▁` as a space, `<0xNN>` as its
    /// byte; control and unknown pieces stand for no text).
    ids: Vec<(&'static [u8], u8)>,
    /// The id of each byte's `<0xNN>` piece.
    byte_ids: [u32; 256],
    /// Bit `a * 256 + b`: some piece holds byte `a` followed by byte `b`.
    adjacent: Vec<u64>,
    /// The longest piece, in bytes of normalised text.
    longest: usize,
}

/// Why the model could not be read.
fn bad(what: &str) -> String {
    format!("the SentencePiece model is not one this reader supports: {what}")
}

/// A protobuf reader for the few fields of `ModelProto` this needs.
struct Proto<'a>(&'a [u8]);

impl<'a> Proto<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self
                .0
                .split_first()
                .ok_or_else(|| bad("truncated varint"))?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("varint too long"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err(bad("truncated field"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// The next field: its number and its value (a varint, or the bytes of a
    /// length-delimited or fixed-size field).
    fn field(&mut self) -> Result<Option<(u64, Field<'a>)>, String> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => Field::Bytes(self.take(8)?),
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| bad("length"))?;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Bytes(self.take(4)?),
            _ => return Err(bad("wire type")),
        };
        Ok(Some((key >> 3, value)))
    }
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// One `SentencePiece` message: piece, score, type.
fn piece(bytes: &[u8]) -> Result<(&[u8], f32, u64), String> {
    let (mut text, mut score, mut kind) = (&[][..], 0f32, NORMAL);
    let mut p = Proto(bytes);
    while let Some((n, f)) = p.field()? {
        match (n, f) {
            (1, Field::Bytes(b)) => text = b,
            (2, Field::Bytes(b)) if b.len() == 4 => {
                score = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            (3, Field::Varint(v)) => kind = v,
            _ => {}
        }
    }
    Ok((text, score, kind))
}

/// Checks that the normaliser is the identity with whitespace escaped, no dummy prefix and
/// no whitespace removal (Gemma's), and that the trainer was BPE with byte fallback.
fn check_specs(trainer: &[u8], normalizer: &[u8]) -> Result<(), String> {
    let (mut bpe, mut byte_fallback) = (false, false);
    let mut p = Proto(trainer);
    while let Some((n, f)) = p.field()? {
        match (n, f) {
            (3, Field::Varint(v)) => bpe = v == 2,
            (35, Field::Varint(v)) => byte_fallback = v != 0,
            _ => {}
        }
    }
    // The defaults of NormalizerSpec: a dummy prefix, whitespace removed and escaped.
    let (mut charsmap, mut prefix, mut remove, mut escape) = (false, true, true, true);
    let mut p = Proto(normalizer);
    while let Some((n, f)) = p.field()? {
        match (n, f) {
            (2, Field::Bytes(b)) => charsmap = !b.is_empty(),
            (3, Field::Varint(v)) => prefix = v != 0,
            (4, Field::Varint(v)) => remove = v != 0,
            (5, Field::Varint(v)) => escape = v != 0,
            _ => {}
        }
    }
    match () {
        () if !bpe => Err(bad("not a BPE model")),
        () if !byte_fallback => Err(bad("no byte fallback")),
        () if charsmap || prefix || remove || !escape => Err(bad("normaliser")),
        () => Ok(()),
    }
}

/// The text a piece stands for: `▁` as a space, `<0xNN>` as its byte.
fn piece_text(piece: &[u8], kind: u64) -> Vec<u8> {
    match kind {
        BYTE => std::str::from_utf8(piece)
            .ok()
            .and_then(|s| s.strip_prefix("<0x")?.strip_suffix('>'))
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .map(|b| vec![b])
            .unwrap_or_default(),
        NORMAL | USER_DEFINED => {
            let s = String::from_utf8_lossy(piece);
            s.replace('\u{2581}', " ").into_bytes()
        }
        _ => Vec::new(),
    }
}

impl Spm {
    /// Gemma 3's model (decompressed and parsed; panics only if the compiled-in file is
    /// damaged, which the core's tests rule out).
    pub(crate) fn gemma3() -> Spm {
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(GEMMA3_MODEL)
            .expect("the compiled-in Gemma 3 model is valid zstd");
        // The model's size: read in one allocation, kept as is.
        let mut data = Vec::with_capacity(4_689_074);
        std::io::Read::read_to_end(&mut decoder, &mut data)
            .expect("the compiled-in Gemma 3 model is valid zstd");
        // Built once per process and kept for its life.
        let data: &'static [u8] = Box::leak(data.into_boxed_slice());
        Spm::parse(data).expect("the compiled-in Gemma 3 model is a supported one")
    }

    /// Read a serialised `ModelProto`.
    pub(crate) fn parse(data: &'static [u8]) -> Result<Spm, String> {
        let mut spm = Spm {
            pieces: FxHashMap::default(),
            user: FxHashSet::default(),
            user_prefixes: FxHashSet::default(),
            user_first: [false; 256],
            ids: Vec::with_capacity(262_144),
            byte_ids: [u32::MAX; 256],
            adjacent: vec![0; 65536 / 64],
            longest: 0,
        };
        let (mut trainer, mut normalizer) = (&[][..], &[][..]);
        let mut unknown = false;
        let mut p = Proto(data);
        while let Some((n, f)) = p.field()? {
            match (n, f) {
                (1, Field::Bytes(b)) => {
                    let id = u32::try_from(spm.ids.len()).map_err(|_| bad("too many pieces"))?;
                    let (text, score, kind) = piece(b)?;
                    unknown |= kind == UNKNOWN;
                    spm.add(id, text, score, kind)?;
                }
                (2, Field::Bytes(b)) => trainer = b,
                (3, Field::Bytes(b)) => normalizer = b,
                _ => {}
            }
        }
        check_specs(trainer, normalizer)?;
        if !unknown || spm.byte_ids.contains(&u32::MAX) {
            return Err(bad("no unknown piece or not 256 byte pieces"));
        }
        Ok(spm)
    }

    fn add(&mut self, id: u32, text: &'static [u8], score: f32, kind: u64) -> Result<(), String> {
        if !(NORMAL..=BYTE).contains(&kind) {
            return Err(bad("a piece type"));
        }
        if kind == UNUSED {
            return Err(bad("unused pieces"));
        }
        if kind == NORMAL || kind == USER_DEFINED {
            if text.is_empty() || std::str::from_utf8(text).is_err() {
                return Err(bad("a piece that is not text"));
            }
            self.pieces.insert(text, (id, score));
            self.longest = self.longest.max(text.len());
            for w in text.windows(2) {
                let bit = usize::from(w[0]) * 256 + usize::from(w[1]);
                self.adjacent[bit / 64] |= 1 << (bit % 64);
            }
        }
        if kind == USER_DEFINED {
            if text.contains(&b' ') {
                return Err(bad("a user-defined piece with a space"));
            }
            self.user.insert(text);
            self.user_first[usize::from(text[0])] = true;
            for end in 1..=text.len() {
                self.user_prefixes.insert(&text[..end]);
            }
        }
        if kind == BYTE {
            let &[b] = piece_text(text, kind).as_slice() else {
                return Err(bad("a byte piece"));
            };
            self.byte_ids[usize::from(b)] = id;
        }
        self.ids.push((text, kind as u8)); // 1..=6, checked above
        Ok(())
    }

    /// Whether counting `bytes[..i]` and `bytes[i..]` apart gives the count of the whole:
    /// `i` starts a character and no piece holds the bytes on either side of it side by
    /// side (a space stands for `▁`), so no symbol can span it.
    pub(crate) fn can_split(&self, bytes: &[u8], i: usize) -> bool {
        if i == 0 || i >= bytes.len() || (bytes[i] & 0xC0) == 0x80 {
            return false;
        }
        let before = if bytes[i - 1] == b' ' {
            SPACE[2]
        } else {
            bytes[i - 1]
        };
        let at = if bytes[i] == b' ' { SPACE[0] } else { bytes[i] };
        let bit = usize::from(before) * 256 + usize::from(at);
        self.adjacent[bit / 64] & (1 << (bit % 64)) == 0
    }

    /// The most bytes of text one token stands for (the longest piece; a literal `▁` in
    /// the text is three bytes, as in the piece).
    #[cfg(test)]
    pub(crate) fn longest_piece(&self) -> usize {
        self.longest
    }

    /// The tokens of `text`.
    pub(crate) fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        self.segment(text, |piece| match self.pieces.get(piece) {
            Some(&(id, _)) => out.push(id),
            None => out.extend(piece.iter().map(|&b| self.byte_ids[usize::from(b)])),
        });
        out
    }

    /// The number of tokens of `text` (as [`Spm::encode`] would give). Short chunks are
    /// counted through a small per-thread memo ([`CHUNK_MEMO`]): text repeats its words.
    pub(crate) fn count(&self, text: &str) -> usize {
        let mut scratch = Scratch::default();
        let mut n = 0;
        for chunk in self.chunks(text) {
            let mut merge = || {
                let mut k = 0;
                self.merge(chunk, &mut scratch, &mut |piece: &[u8]| {
                    k += if self.pieces.contains_key(piece) {
                        1
                    } else {
                        piece.len()
                    }
                });
                k
            };
            n += if chunk.len() <= MEMO_KEY {
                memo_count(chunk.as_bytes(), merge)
            } else {
                merge()
            };
        }
        n
    }

    /// `text` in chunks that end where no symbol can span ([`Spm::can_split`]): merged
    /// apart, they give the symbols of the whole text.
    fn chunks<'t>(&self, text: &'t str) -> impl Iterator<Item = &'t str> + use<'t, '_> {
        let bytes = text.as_bytes();
        let mut start = 0;
        (1..=bytes.len())
            .filter(move |&i| i == bytes.len() || self.can_split(bytes, i))
            .map(move |i| {
                let chunk = &text[start..i];
                start = i;
                chunk
            })
    }

    /// The bytes of text `tokens` stand for (`▁` as a space); a token the model lacks, or a
    /// control token, is an error.
    pub(crate) fn decode_bytes(&self, tokens: &[u32]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        for &t in tokens {
            let text = self
                .ids
                .get(t as usize)
                .map(|&(piece, kind)| piece_text(piece, u64::from(kind)))
                .unwrap_or_default();
            if text.is_empty() {
                return Err(format!("token {t} is not in the vocabulary"));
            }
            out.extend_from_slice(&text);
        }
        Ok(out)
    }

    /// The length of the longest user-defined piece `s` starts with (0: none).
    fn user_match(&self, s: &[u8]) -> usize {
        if !self.user_first[usize::from(s[0])] {
            return 0;
        }
        let mut best = 0;
        for end in 1..=s.len() {
            let prefix = &s[..end];
            if !self.user_prefixes.contains(prefix) {
                break;
            }
            if self.user.contains(prefix) {
                best = end;
            }
        }
        best
    }

    /// Merge `text` into its final symbols and hand each one's normalised bytes to `emit`,
    /// in order, chunk by chunk (one set of buffers).
    fn segment(&self, text: &str, mut emit: impl FnMut(&[u8])) {
        let mut scratch = Scratch::default();
        for chunk in self.chunks(text) {
            self.merge(chunk, &mut scratch, &mut emit);
        }
    }

    /// SentencePiece's merge of one chunk of text (steps 1-3 of the module's algorithm).
    fn merge(&self, text: &str, scratch: &mut Scratch, emit: &mut impl FnMut(&[u8])) {
        if text.is_empty() {
            return;
        }
        scratch.norm.clear();
        for c in text.chars() {
            scratch.norm.push(if c == ' ' { '\u{2581}' } else { c });
        }
        let s = scratch.norm.as_bytes();
        let symbols = &mut scratch.symbols;
        symbols.clear();
        let mut at = 0usize;
        while at < s.len() {
            let user = self.user_match(&s[at..]);
            let len = if user > 0 {
                user
            } else {
                utf8_len(s[at]).min(s.len() - at)
            };
            let i = symbols.len() as i32;
            symbols.push(Symbol {
                start: at as u32,
                len: len as u32,
                prev: i - 1,
                next: if at + len < s.len() { i + 1 } else { -1 },
                freeze: user > 0,
            });
            at += len;
        }
        let agenda = &mut scratch.agenda;
        agenda.clear();
        for i in 1..symbols.len() {
            self.push_pair(s, symbols, agenda, i as i32 - 1, i as i32);
        }
        while let Some(top) = agenda.pop() {
            let (l, r) = (top.left as usize, top.right as usize);
            if symbols[l].len == 0
                || symbols[r].len == 0
                || symbols[l].len + symbols[r].len != top.size
            {
                continue;
            }
            symbols[l].len += symbols[r].len;
            let next = symbols[r].next;
            symbols[l].next = next;
            if next >= 0 {
                symbols[next as usize].prev = top.left;
            }
            symbols[r].len = 0;
            self.push_pair(s, symbols, agenda, symbols[l].prev, top.left);
            self.push_pair(s, symbols, agenda, top.left, symbols[l].next);
        }
        let mut i = 0i32;
        while i >= 0 {
            let sym = &symbols[i as usize];
            emit(&s[sym.start as usize..(sym.start + sym.len) as usize]);
            i = sym.next;
        }
    }

    fn push_pair(
        &self,
        s: &[u8],
        symbols: &[Symbol],
        agenda: &mut BinaryHeap<Pair>,
        left: i32,
        right: i32,
    ) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (&symbols[left as usize], &symbols[right as usize]);
        if l.freeze || r.freeze {
            return;
        }
        let size = l.len + r.len;
        let piece = &s[l.start as usize..(l.start + size) as usize];
        if let Some(&(_, score)) = self.pieces.get(piece) {
            agenda.push(Pair {
                score,
                left,
                right,
                size,
            });
        }
    }
}

/// Bytes of the UTF-8 character that starts with byte `b`.
fn utf8_len(b: u8) -> usize {
    match b {
        0xF0.. => 4,
        0xE0.. => 3,
        0xC0.. => 2,
        _ => 1,
    }
}

/// Longest chunk [`CHUNK_MEMO`] keeps.
const MEMO_KEY: usize = 46;
/// Slots of [`CHUNK_MEMO`] (a power of two).
const MEMO_SLOTS: usize = 4096;

/// A chunk's bytes (`len` of them) and its count; `len` 0 is an empty slot.
#[derive(Clone, Copy)]
struct MemoSlot {
    len: u8,
    count: u8,
    key: [u8; MEMO_KEY],
}

thread_local! {
    /// Counts of short chunks, direct-mapped by a hash of their bytes (a new chunk
    /// overwrites its slot). Only Gemma 3's model counts, so the bytes are the whole key.
    static CHUNK_MEMO: std::cell::RefCell<Vec<MemoSlot>> = std::cell::RefCell::new(
        vec![MemoSlot { len: 0, count: 0, key: [0; MEMO_KEY] }; MEMO_SLOTS],
    );
}

/// The count of `chunk` (at most [`MEMO_KEY`] bytes) from the memo, else `merge`'s.
fn memo_count(chunk: &[u8], merge: impl FnOnce() -> usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    chunk.hash(&mut h);
    let x = h.finish();
    let slot = ((x ^ (x >> 32)) as usize) & (MEMO_SLOTS - 1);
    let hit = CHUNK_MEMO.with(|m| {
        let m = m.borrow();
        let s = &m[slot];
        (usize::from(s.len) == chunk.len() && &s.key[..chunk.len()] == chunk)
            .then_some(usize::from(s.count))
    });
    if let Some(n) = hit {
        return n;
    }
    let n = merge();
    if let Ok(count) = u8::try_from(n) {
        CHUNK_MEMO.with(|m| {
            let s = &mut m.borrow_mut()[slot];
            s.len = chunk.len() as u8;
            s.count = count;
            s.key[..chunk.len()].copy_from_slice(chunk);
        });
    }
    n
}

/// Buffers one text's chunks are merged in.
#[derive(Default)]
struct Scratch {
    norm: String,
    symbols: Vec<Symbol>,
    agenda: BinaryHeap<Pair>,
}

struct Symbol {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
    freeze: bool,
}

/// A candidate merge: the highest score first, then the leftmost.
struct Pair {
    score: f32,
    left: i32,
    right: i32,
    size: u32,
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_in_model_is_gemma_3s() {
        let spm = Spm::gemma3();
        assert_eq!(spm.ids.len(), 262_144);
        assert!(spm.user.contains("<start_of_turn>".as_bytes()));
        // Known counts (SentencePiece's own on the same model file).
        assert_eq!(spm.count("What is your name?"), 5);
        assert_eq!(spm.count(""), 0);
        let tokens = spm.encode("Hello,  world!\n\n<start_of_turn>");
        assert_eq!(
            spm.decode_bytes(&tokens).unwrap(),
            b"Hello,  world!\n\n<start_of_turn>"
        );
        // A character with no piece of its own falls back to its bytes.
        let rare = "\u{10FFFD}";
        assert_eq!(spm.count(rare), 4);
        assert_eq!(
            spm.decode_bytes(&spm.encode(rare)).unwrap(),
            rare.as_bytes()
        );
        assert!(spm.decode_bytes(&[2]).is_err(), "<bos> stands for no text");
    }

    #[test]
    fn a_damaged_model_is_an_error() {
        assert!(Spm::parse(b"\x0a\xff").is_err());
        assert!(Spm::parse(b"").is_err());
    }
}
