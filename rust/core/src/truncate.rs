//! Token-exact cuts for model-facing copies of oversized tool outputs (the stored item is
//! never changed).
//!
//! * [`split_tokens`]: a text's first and last tokens. A text is tokenised once, in the same
//!   pre-tokenizer-safe segments as counting (so the tokens are exactly those of the whole
//!   text); the head is the text of its first `head` tokens and the tail the text of its last
//!   `tail` tokens, each moved inwards to a character boundary when a token ends inside a
//!   multi-byte character. Re-tokenising a head can merge across the cut differently, so
//!   callers check the final count; this gives them the pieces.
//! * [`head_text`] and [`tail_text`]: the same pieces without tokenising the whole text: only
//!   a prefix (or suffix) that ends (or starts) where the pre-tokenizer splits too, so its
//!   tokens are exactly the first (or last) tokens of the whole text. [`excerpt`] builds a
//!   head and tail around a marker within an exact token limit (masking of old tool outputs).
//! * [`cut_text`]: a text cut to at most `max_tokens` tokens, head and tail around a marker
//!   that says how many tokens were removed (the count is checked, so it always holds).
//! * [`fit_output`]: a tool-output item cut to a token target, in this order until it fits:
//!   media parts (images, files, audio) become text markers, newest first, when the output
//!   would not fit even with every text cut to [`MIN_KEPT_TOKENS`]; then, for an output made
//!   of many parts, the middle parts give way to one marker part saying how many parts and
//!   tokens were removed (the first and last parts are kept: a listing's start and its end);
//!   then the texts are cut, largest first, to fill the room exactly, down to nothing if
//!   that is what fits.

use serde_json::{Map, Value};

use crate::tokens::{
    is_exact_split, item_cost, quietly, segments, Encoding, TokenError, SEGMENT_BYTES, SPLIT_WINDOW,
};

/// A text cut to its first and last tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split<'a> {
    /// The text of the first `head` tokens (at most), ending at a character boundary.
    pub head: &'a str,
    /// The text of the last `tail` tokens (at most), starting at a character boundary.
    pub tail: &'a str,
    /// Tokens of the whole text.
    pub total: u64,
    /// Whether anything lies between head and tail (`false`: head is the whole text).
    pub cut: bool,
}

/// Split `text` into its first `head` and last `tail` tokens under `enc`.
///
/// When `head + tail` covers the whole text, `head` is the text and `tail` is empty.
pub fn split_tokens(
    enc: Encoding,
    text: &str,
    head: u64,
    tail: u64,
) -> Result<Split<'_>, TokenError> {
    let tokens = encode(enc, text)?;
    let total = tokens.len() as u64;
    // An estimate's tokens come in pairs (filler, token): a tail of whole pairs only.
    let tail = tail - tail % enc.tokens_per_piece();
    if head.saturating_add(tail) >= total {
        return Ok(Split {
            head: text,
            tail: "",
            total,
            cut: false,
        });
    }
    let bpe = enc.bpe();
    let byte_len = |ts: &[u32]| -> Result<usize, TokenError> {
        bpe.decode_bytes(ts)
            .map(|b| b.len())
            .map_err(TokenError::Tokenizer)
    };
    let n = tokens.len();
    let mut head_end = byte_len(&tokens[..head as usize])?.min(text.len());
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let tail_len = byte_len(&tokens[n - tail as usize..])?.min(text.len());
    let mut tail_start = text.len() - tail_len;
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let tail_start = tail_start.max(head_end);
    Ok(Split {
        head: &text[..head_end],
        tail: &text[tail_start..],
        total,
        cut: true,
    })
}

/// Bytes a head or tail of `n` tokens is first looked for in (more is read until found): a
/// token is about four bytes of text on average.
fn first_span(n: u64) -> usize {
    (n as usize).saturating_mul(6).max(64)
}

/// Byte length of the text of `tokens`.
fn decoded_len(enc: Encoding, tokens: &[u32]) -> Result<usize, TokenError> {
    enc.bpe()
        .decode_bytes(tokens)
        .map(|b| b.len())
        .map_err(TokenError::Tokenizer)
}

/// The text of the first `n` tokens of `text` under `enc` (all of it when it has no more),
/// ending at a character boundary (moved back when a token ends inside a character): what
/// [`split_tokens`] gives as the head, tokenising only a prefix of the text, in the
/// segments counting uses (which end where the pre-tokenizer splits too).
pub fn head_text(enc: Encoding, text: &str, n: u64) -> Result<&str, TokenError> {
    if n == 0 {
        return Ok("");
    }
    let (tokens, _) = prefix_tokens(enc, text, n)?;
    head_of(enc, text, &tokens, n)
}

/// The first tokens of `text`: at least `n` of them (all of them when it has fewer), and
/// whether they are all of the text's. Tokenised segment by segment (segments end where the
/// pre-tokenizer splits, so these are exactly the whole text's first tokens).
fn prefix_tokens(enc: Encoding, text: &str, n: u64) -> Result<(Vec<u32>, bool), TokenError> {
    let bpe = enc.bpe();
    let mut tokens = Vec::new();
    let mut parts = segments(enc, text, first_span(n), SPLIT_WINDOW);
    for part in parts.by_ref() {
        encode_piece(bpe, part, &mut tokens)?;
        if tokens.len() as u64 >= n {
            break;
        }
    }
    let all = parts.next().is_none();
    Ok((tokens, all))
}

/// The text of the first `n` of `tokens` (a prefix's tokens of `text`), moved back to a
/// character boundary.
fn head_of<'a>(
    enc: Encoding,
    text: &'a str,
    tokens: &[u32],
    n: u64,
) -> Result<&'a str, TokenError> {
    let take = tokens.len().min(n as usize);
    let mut end = decoded_len(enc, &tokens[..take])?.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Ok(&text[..end])
}

/// The text of the last `n` tokens of `text` under `enc` (all of it when it has no more),
/// starting at a character boundary (moved forward when a token starts inside a
/// character): what [`split_tokens`] gives as the tail, tokenising only a suffix that starts
/// where the pre-tokenizer splits too ([`is_exact_split`]), else the whole text.
pub fn tail_text(enc: Encoding, text: &str, n: u64) -> Result<&str, TokenError> {
    if n == 0 {
        return Ok("");
    }
    let bytes = text.as_bytes();
    let mut span = first_span(n);
    loop {
        let lo = text.len().saturating_sub(span);
        let start = if lo == 0 {
            0
        } else {
            (lo.saturating_sub(SPLIT_WINDOW)..=lo)
                .rev()
                .find(|&i| is_exact_split(enc, bytes, i))
                .unwrap_or(0)
        };
        let tokens = encode(enc, &text[start..])?;
        if tokens.len() as u64 >= n || start == 0 {
            let mut take = tokens.len().min(n as usize);
            // An estimate's tokens come in pairs (filler, token): whole pairs only.
            take -= take % enc.tokens_per_piece() as usize;
            let len = decoded_len(enc, &tokens[tokens.len() - take..])?.min(text.len());
            let mut begin = text.len() - len;
            while !text.is_char_boundary(begin) {
                begin += 1;
            }
            return Ok(&text[begin..]);
        }
        span = span.saturating_mul(4);
    }
}

/// A text cut to a head and tail around a marker ([`excerpt`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excerpt {
    /// Head, marker, tail: at most the limit's tokens.
    pub text: String,
    /// The number the marker states: what `removed` said of this text (when the fixed
    /// point was reached; else of the text before).
    pub removed: u64,
    /// What `removed` says of this very text.
    pub actual: u64,
}

/// Whether `text` has at most `n` tokens, and how many it has then: only a prefix of the
/// text is tokenised (segments that end where the pre-tokenizer splits, as counting does).
pub fn tokens_up_to(enc: Encoding, text: &str, n: u64) -> Result<Option<u64>, TokenError> {
    let (tokens, all) = prefix_tokens(enc, text, n.saturating_add(1))?;
    Ok((all && tokens.len() as u64 <= n).then_some(tokens.len() as u64))
}

/// The candidate `head + marker(n) + tail` whose `n` is what `removed` says of it: a fixed
/// point, found in at most [`FIXED_POINT_ROUNDS`] rounds from `n = upper` (the number's
/// digits barely change the candidate; if the rounds run out, the last number is kept).
fn fixed_point(
    head: &str,
    tail: &str,
    short: bool,
    upper: u64,
    marker: &dyn Fn(u64, bool) -> String,
    removed: &mut dyn FnMut(&str) -> Result<u64, TokenError>,
) -> Result<(String, u64, u64), TokenError> {
    let build = |n: u64| format!("{head}{}{tail}", marker(n, short));
    let mut n = upper;
    for _ in 0..FIXED_POINT_ROUNDS {
        let next = removed(&build(n))?;
        if next == n {
            return Ok((build(n), n, n));
        }
        n = next;
    }
    let candidate = build(n);
    let actual = removed(&candidate)?;
    Ok((candidate, n, actual))
}

/// Rounds of the marker number's fixed point ([`excerpt`]).
pub const FIXED_POINT_ROUNDS: usize = 5;

/// `text` cut to at most `max_tokens` tokens (counted exactly, marker included): its first
/// and last tokens (a quarter of those kept, rounded down, from the end) around
/// `marker(n, false)`, where `n = removed(candidate)` is what the caller says the cut
/// removes (for a masked tool output: the tokens the item's masked copy saves, exactly),
/// never more than `upper` (the item's whole cost). Only a prefix and a suffix of the text
/// are tokenised. `force`: cut even when the text fits (something else was removed).
/// `None` when there is nothing to cut (the text fits and nothing is forced) or not even
/// `marker(n, true)` (the short form) fits alone.
///
/// The rule, exactly (a slow reference re-implements it, `benches/reference_packer.py`):
/// if the text has at most `max_tokens` tokens (`total`) and nothing is forced, `None`.
/// With `m` the count of `marker(upper, false)` alone, `keep` is `total` for such a short
/// text, else `max_tokens - m`; while `keep >= 0`: `t = keep / 4` tail and `h = keep - t`
/// head tokens ([`head_text`], [`tail_text`]; the whole text when `keep >= total` of a
/// short text; a tail overlapping the head starts where the head ends); the candidate is
/// `head + marker(n) + tail` at the fixed point of `n` from `upper` ([`fixed_point`]); it is
/// the result if it counts at most `max_tokens`, else `keep` goes down by the excess. Then
/// the full marker alone, then the short one, each at its fixed point.
pub fn excerpt(
    enc: Encoding,
    text: &str,
    max_tokens: u64,
    force: bool,
    upper: u64,
    marker: &dyn Fn(u64, bool) -> String,
    removed: &mut dyn FnMut(&str) -> Result<u64, TokenError>,
) -> Result<Option<Excerpt>, TokenError> {
    let (prefix, all) = prefix_tokens(enc, text, max_tokens.saturating_add(1))?;
    let short = (all && prefix.len() as u64 <= max_tokens).then_some(prefix.len() as u64);
    if short.is_some() && !force {
        return Ok(None);
    }
    let marker_tokens = enc.count_cached(&marker(upper, false))?;
    let mut keep = i128::from(match short {
        Some(total) => total,
        None => max_tokens.saturating_sub(marker_tokens),
    });
    while keep >= 0 {
        let k = keep as u64;
        let (head, tail) = match short {
            Some(total) if k >= total => (text, ""),
            _ => {
                let tail_n = k / 4;
                let head = head_of(enc, text, &prefix, k - tail_n)?;
                let tail = tail_text(enc, text, tail_n)?;
                let tail = if head.len() + tail.len() > text.len() {
                    &text[head.len()..]
                } else {
                    tail
                };
                (head, tail)
            }
        };
        let (candidate, n, actual) = fixed_point(head, tail, false, upper, marker, removed)?;
        let count = enc.count_cached(&candidate)?;
        if count <= max_tokens {
            return Ok(Some(Excerpt {
                text: candidate,
                removed: n,
                actual,
            }));
        }
        keep -= i128::from(count - max_tokens);
    }
    for short in [false, true] {
        let (alone, n, actual) = fixed_point("", "", short, upper, marker, removed)?;
        if enc.count_cached(&alone)? <= max_tokens {
            return Ok(Some(Excerpt {
                text: alone,
                removed: n,
                actual,
            }));
        }
    }
    Ok(None)
}

/// The tokens of `text`, segment by segment (exactly the tokens of the whole text).
fn encode(enc: Encoding, text: &str) -> Result<Vec<u32>, TokenError> {
    let bpe = enc.bpe();
    let mut out = Vec::new();
    for part in segments(enc, text, SEGMENT_BYTES, SPLIT_WINDOW) {
        encode_piece(bpe, part, &mut out)?;
    }
    Ok(out)
}

/// Encode one segment; a piece the regex engine cannot handle is halved at a character
/// boundary (as counting does), so tokens may then differ from the reference at the split.
fn encode_piece(bpe: crate::tokens::Bpe, text: &str, out: &mut Vec<u32>) -> Result<(), TokenError> {
    if text.is_empty() {
        return Ok(());
    }
    match quietly(|| bpe.encode_ordinary(text)) {
        Ok(tokens) => {
            out.extend(tokens);
            Ok(())
        }
        Err(_) if text.len() >= 2048 => {
            let mut mid = text.len() / 2;
            while !text.is_char_boundary(mid) {
                mid += 1;
            }
            encode_piece(bpe, &text[..mid], out)?;
            encode_piece(bpe, &text[mid..], out)
        }
        Err(_) => Err(TokenError::Tokenizer(
            "the tokenizer failed on this text".to_string(),
        )),
    }
}

/// Put between the head and tail of a cut text; `{removed}` is the number of tokens cut.
pub const TRUNCATION_MARKER: &str = "\n[… {removed} tokens removed by protoprompt …]\n";

/// A cut text keeps at least this many tokens (marker included) before media parts of the
/// same output are replaced by a marker or its parts are removed.
pub const MIN_KEPT_TOKENS: u64 = 32;

/// Share of the kept tokens (of a cut text) and of the kept parts (of a many-part output)
/// taken from the end.
pub const TAIL_SHARE: f64 = 0.2;

/// `text` cut to at most `max_tokens` tokens: its first and last tokens around `marker`
/// (with `{removed}` replaced by the number of tokens cut). A text that fits is returned as
/// is; when not even the marker fits, the text's first `max_tokens` tokens without a marker.
pub fn cut_text(
    enc: Encoding,
    text: &str,
    max_tokens: u64,
    tail_share: f64,
    marker: &str,
) -> Result<String, TokenError> {
    let whole = split_tokens(enc, text, max_tokens, 0)?;
    if !whole.cut {
        return Ok(text.to_string());
    }
    let total = whole.total;
    let marker_tokens = enc.count(&marker.replace("{removed}", &total.to_string()))?;
    // The pieces may merge with the marker at the seams: two tokens of slack, then checked.
    let mut keep = max_tokens as i64 - marker_tokens as i64 - 2;
    while keep >= 0 {
        let n_tail = (keep as f64 * tail_share) as u64;
        let parts = split_tokens(enc, text, keep as u64 - n_tail, n_tail)?;
        let removed = total - enc.count(parts.head)? - enc.count(parts.tail)?;
        let candidate = format!(
            "{}{}{}",
            parts.head,
            marker.replace("{removed}", &removed.to_string()),
            parts.tail
        );
        let over = enc.count(&candidate)? as i64 - max_tokens as i64;
        if over <= 0 {
            return Ok(candidate);
        }
        keep -= over;
    }
    let mut head = whole.head.to_string();
    while !head.is_empty() && enc.count(&head)? > max_tokens {
        head.pop(); // a multi-byte character at the cut may count one token more
    }
    Ok(head)
}

/// Keys whose string values a cut may shorten (ids, types and statuses never are).
const TEXT_KEYS: [&str; 6] = ["text", "stdout", "stderr", "output", "content", "result"];

/// Content parts that are not text: replaced by a marker, never cut.
const MEDIA_TYPES: [&str; 3] = ["input_image", "input_file", "input_audio"];

/// One step of a path inside an item.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

type Path = Vec<Step>;

fn get<'a>(root: &'a Value, path: &[Step]) -> Option<&'a Value> {
    path.iter().try_fold(root, |v, step| match step {
        Step::Key(k) => v.get(k.as_str()),
        Step::Index(i) => v.get(*i),
    })
}

fn get_mut<'a>(root: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(root, |v, step| match step {
        Step::Key(k) => v.get_mut(k.as_str()),
        Step::Index(i) => v.get_mut(*i),
    })
}

fn is_media(value: &Value) -> bool {
    value
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| MEDIA_TYPES.contains(&t))
}

/// Paths of the cuttable string leaves under `value` (a string in a list counts; in a map,
/// only under a text key).
fn text_leaves(value: &Value, path: &mut Path, key: Option<&str>, out: &mut Vec<Path>) {
    match value {
        Value::String(_) if key.is_none_or(|k| TEXT_KEYS.contains(&k)) => out.push(path.clone()),
        Value::Object(map) if !is_media(value) => {
            for (k, v) in map {
                path.push(Step::Key(k.clone()));
                text_leaves(v, path, Some(k), out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(Step::Index(i));
                text_leaves(v, path, None, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn leaves_of(item: &Value) -> Vec<Path> {
    let mut out = Vec::new();
    if let Some(output) = item.get("output") {
        let mut path = vec![Step::Key("output".to_string())];
        text_leaves(output, &mut path, Some("output"), &mut out);
    }
    out
}

/// An output item cut to fit (see [`fit_output`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FitOutput {
    /// The model-facing copy.
    pub item: Value,
    /// Its cost under the item cost model (`<=` the target).
    pub tokens: u64,
    /// Parts of a many-part output replaced by one marker part.
    pub parts_removed: usize,
    /// Media parts replaced by a text marker.
    pub media_removed: usize,
}

struct Fitter {
    enc: Encoding,
}

impl Fitter {
    fn cost(&self, item: &Value) -> Result<u64, TokenError> {
        Ok(item_cost(item, self.enc)?.total())
    }

    /// `item` with every text longer than [`MIN_KEPT_TOKENS`] cut to it: the least the
    /// texts can be cut to before media or parts give way.
    fn floor(&self, item: &Value) -> Result<Value, TokenError> {
        let mut out = item.clone();
        for path in leaves_of(item) {
            if let Some(Value::String(text)) = get(item, &path) {
                if self.enc.count(text)? > MIN_KEPT_TOKENS {
                    let cut = cut_text(
                        self.enc,
                        text,
                        MIN_KEPT_TOKENS,
                        TAIL_SHARE,
                        TRUNCATION_MARKER,
                    )?;
                    if let Some(slot) = get_mut(&mut out, &path) {
                        *slot = Value::String(cut);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Replace media parts of `item`'s output list by text markers, newest first, while
    /// its floor does not fit; how many were replaced.
    fn drop_media(&self, item: &mut Value, target: u64) -> Result<usize, TokenError> {
        let mut removed = 0;
        while self.cost(&self.floor(item)?)? > target {
            let Some(Value::Array(parts)) = item.get_mut("output") else {
                break;
            };
            let Some(i) = parts.iter().rposition(is_media) else {
                break;
            };
            let kind = parts[i]
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("media")
                .to_string();
            parts[i] = text_part(&format!(
                "[{kind} removed by protoprompt: it did not fit the token budget]"
            ));
            removed += 1;
        }
        Ok(removed)
    }

    /// Keep the first and last parts of `item`'s output list and replace the rest by one
    /// marker part: the most parts whose floor fits. `Ok(None)`: not even the marker fits.
    fn drop_parts(&self, item: &Value, target: u64) -> Result<Option<(Value, usize)>, TokenError> {
        let Some(Value::Array(parts)) = item.get("output") else {
            return Ok(Some((item.clone(), 0)));
        };
        let m = parts.len();
        let with = |kept: usize| -> Result<(Value, usize), TokenError> {
            let tail = ((kept as f64) * TAIL_SHARE) as usize;
            let head = kept - tail;
            let removed = &parts[head..m - tail];
            let removed_tokens = removed.iter().try_fold(0u64, |acc, p| {
                Ok::<u64, TokenError>(
                    acc + self
                        .cost(&wrap(p))?
                        .saturating_sub(crate::tokens::ITEM_OVERHEAD),
                )
            })?;
            let marker = marker_part(&parts[head], removed.len(), removed_tokens);
            let mut out = parts[..head].to_vec();
            out.push(marker);
            out.extend_from_slice(&parts[m - tail..]);
            let mut copy = item.clone();
            copy["output"] = Value::Array(out);
            Ok((copy, removed.len()))
        };
        // The most kept parts (0..m-1) whose floor fits: fewer parts never cost more.
        let (mut lo, mut hi) = (0usize, m - 1);
        let fits = |kept: usize| -> Result<bool, TokenError> {
            let (copy, _) = with(kept)?;
            Ok(self.cost(&self.floor(&copy)?)? <= target)
        };
        if !fits(0)? {
            return Ok(None);
        }
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid)? {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        with(lo).map(Some)
    }

    /// Cut the texts of `source` into `item` so that it costs at most `target`: every text
    /// longer than a common cap is cut to it (head and tail around a marker), the cap being
    /// the largest that fits the texts' share of the room (a water level), never below
    /// `floor`; the room is lowered by what a try still overflows (markers and seams).
    fn cut_texts(
        &self,
        item: &mut Value,
        source: &Value,
        target: u64,
        floor: u64,
    ) -> Result<(), TokenError> {
        let leaves = leaves_of(source);
        let mut texts = Vec::with_capacity(leaves.len());
        for path in &leaves {
            match get(source, path) {
                Some(Value::String(t)) => texts.push((t.as_str(), self.enc.count(t)?)),
                _ => texts.push(("", 0)),
            }
        }
        let sizes: Vec<u64> = texts.iter().map(|(_, n)| *n).collect();
        let frame = self.cost(source)?.saturating_sub(sizes.iter().sum::<u64>());
        let mut room = target.saturating_sub(frame);
        for _ in 0..8 {
            let cap = water_level(&sizes, room).max(floor);
            for (path, (text, n)) in leaves.iter().zip(&texts) {
                let value = if *n > cap {
                    cut_text(self.enc, text, cap, TAIL_SHARE, TRUNCATION_MARKER)?
                } else {
                    (*text).to_string()
                };
                if let Some(slot) = get_mut(item, path) {
                    *slot = Value::String(value);
                }
            }
            let over = self.cost(item)?.saturating_sub(target);
            if over == 0 || cap == floor {
                return Ok(());
            }
            room = room.saturating_sub(over);
        }
        Ok(())
    }
}

/// The largest cap with `sum(min(size, cap)) <= room` (0 when even that is too much).
fn water_level(sizes: &[u64], room: u64) -> u64 {
    let mut ordered = sizes.to_vec();
    ordered.sort_unstable();
    let mut spent = 0u64;
    for (i, &size) in ordered.iter().enumerate() {
        let rest = (ordered.len() - i) as u64;
        if spent + size * rest > room {
            return (room - spent) / rest;
        }
        spent += size;
    }
    ordered.last().copied().unwrap_or(0).max(room)
}

fn text_part(text: &str) -> Value {
    let mut m = Map::new();
    m.insert("type".to_string(), Value::String("input_text".to_string()));
    m.insert("text".to_string(), Value::String(text.to_string()));
    Value::Object(m)
}

/// A part as an item of its own (to cost it alone).
fn wrap(part: &Value) -> Value {
    let mut m = Map::new();
    m.insert("output".to_string(), part.clone());
    Value::Object(m)
}

/// The part put where parts were removed: a text part when the parts are content parts, else
/// a copy of the first removed part with its first text replaced by the marker and its other
/// texts emptied (the output keeps its shape, e.g. shell output chunks).
fn marker_part(first_removed: &Value, removed: usize, tokens: u64) -> Value {
    let text = format!("[… {removed} parts ({tokens} tokens) removed by protoprompt …]");
    let is_content = first_removed
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.starts_with("input_") || t == "output_text");
    if is_content || !first_removed.is_object() {
        return text_part(&text);
    }
    let mut part = first_removed.clone();
    let mut leaves = Vec::new();
    text_leaves(first_removed, &mut Vec::new(), None, &mut leaves);
    for (n, path) in leaves.iter().enumerate() {
        if let Some(slot) = get_mut(&mut part, path) {
            *slot = Value::String(if n == 0 { text.clone() } else { String::new() });
        }
    }
    if leaves.is_empty() {
        return text_part(&text);
    }
    part
}

/// `item` (a tool output) cut to cost at most `target` tokens, or `None` when it cannot be
/// (nothing in it can be cut: a screenshot, or not even the markers fit). See the module
/// notes for the order of the cuts.
pub fn fit_output(
    item: &Value,
    target: u64,
    enc: Encoding,
) -> Result<Option<FitOutput>, TokenError> {
    let fitter = Fitter { enc };
    let tokens = fitter.cost(item)?;
    if tokens <= target {
        return Ok(Some(FitOutput {
            item: item.clone(),
            tokens,
            parts_removed: 0,
            media_removed: 0,
        }));
    }
    if item.get("output").is_none() {
        return Ok(None);
    }
    let mut copy = item.clone();
    let media_removed = fitter.drop_media(&mut copy, target)?;
    let mut parts_removed = 0;
    if fitter.cost(&fitter.floor(&copy)?)? > target {
        match fitter.drop_parts(&copy, target)? {
            Some((fewer, removed)) => {
                copy = fewer;
                parts_removed = removed;
            }
            None => return Ok(None),
        }
    }
    let source = copy.clone();
    fitter.cut_texts(&mut copy, &source, target, MIN_KEPT_TOKENS)?;
    fitter.cut_texts(&mut copy, &source, target, 0)?;
    let tokens = fitter.cost(&copy)?;
    Ok((tokens <= target).then_some(FitOutput {
        item: copy,
        tokens,
        parts_removed,
        media_removed,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENC: Encoding = Encoding::O200kBase;

    #[test]
    fn head_and_tail_are_the_first_and_last_tokens() {
        let text = "alpha beta gamma delta epsilon zeta eta theta iota kappa";
        let total = ENC.count(text).unwrap();
        let s = split_tokens(ENC, text, 3, 2).unwrap();
        assert!(s.cut);
        assert_eq!(s.total, total);
        assert!(text.starts_with(s.head) && s.head.starts_with("alpha"));
        assert!(text.ends_with(s.tail) && s.tail.ends_with("kappa"));
        assert_eq!(ENC.count(s.head).unwrap(), 3);
        assert_eq!(ENC.count(s.tail).unwrap(), 2);
        let whole = split_tokens(ENC, text, total, 0).unwrap();
        assert!(!whole.cut);
        assert_eq!(whole.head, text);
        assert_eq!(whole.tail, "");
    }

    #[test]
    fn an_estimate_cuts_whole_base_tokens_and_never_exceeds_its_limits() {
        // Claude's estimate counts two tokens per o200k_base token: a head, tail or cut of
        // an odd number of tokens keeps whole base tokens, within the limit.
        let est = Encoding::ClaudeEstimate;
        let text = "alpha beta gamma delta, договор 日本語 {\"k\": [1, 2]}\n".repeat(30);
        assert_eq!(est.count(&text).unwrap(), 2 * ENC.count(&text).unwrap());
        for n in 0..15 {
            let head = head_text(est, &text, n).unwrap();
            let tail = tail_text(est, &text, n).unwrap();
            assert!(est.count(head).unwrap() <= n, "head {n}");
            assert!(est.count(tail).unwrap() <= n, "tail {n}");
            assert!(est.count(head).unwrap() + 1 >= n, "head {n}");
            for t in 0..9 {
                let s = split_tokens(est, &text, n, t).unwrap();
                assert!(est.count(s.head).unwrap() <= n, "split head {n}");
                assert!(est.count(s.tail).unwrap() <= t, "split tail {t}");
            }
            let fits = tokens_up_to(est, &text, n).unwrap();
            assert_eq!(fits, None);
        }
        let cut = cut_text(est, &text, 41, 0.2, "[{removed}]").unwrap();
        assert!(est.count(&cut).unwrap() <= 41);
    }

    #[test]
    fn cuts_land_on_character_boundaries() {
        // Emoji and Cyrillic: tokens may end inside a character; the cut moves inwards.
        let text = "🙂🚀✅⚠️🔥 договор клиент заказ 📈🤔👍🎉🧪".repeat(20);
        for head in 0..12 {
            for tail in 0..12 {
                let s = split_tokens(ENC, &text, head, tail).unwrap();
                assert!(ENC.count(s.head).unwrap() <= head.max(if s.cut { 0 } else { s.total }));
                assert!(s.head.len() + s.tail.len() <= text.len());
                assert!(text.starts_with(s.head) && text.ends_with(s.tail));
            }
        }
    }

    #[test]
    fn long_texts_split_in_segments_exactly() {
        let text = "line of words\n".repeat(20_000); // > SEGMENT_BYTES
        let s = split_tokens(ENC, &text, 10, 10).unwrap();
        assert_eq!(s.total, ENC.count(&text).unwrap());
        assert!(s.head.starts_with("line of words"));
        assert!(s.tail.ends_with("line of words\n"));
    }

    #[test]
    fn head_and_tail_text_equal_the_split_of_the_whole_text() {
        let texts = [
            "alpha beta gamma delta epsilon zeta eta theta iota kappa".to_string(),
            "🙂🚀✅⚠️🔥 договор клиент заказ 📈🤔👍🎉🧪".repeat(40),
            "line of words, 12 numbers\n".repeat(3000),
            "x".repeat(9000),
            "a b\n".repeat(5000) + &"🙂".repeat(300),
        ];
        for text in &texts {
            for (h, t) in [(0, 0), (1, 1), (3, 7), (40, 10), (600, 200)] {
                let s = split_tokens(ENC, text, h, t).unwrap();
                if !s.cut {
                    continue;
                }
                assert_eq!(head_text(ENC, text, h).unwrap(), s.head, "head {h}");
                assert_eq!(tail_text(ENC, text, t).unwrap(), s.tail, "tail {t}");
            }
            let all = ENC.count(text).unwrap();
            assert_eq!(head_text(ENC, text, all + 5).unwrap(), text.as_str());
            assert_eq!(tail_text(ENC, text, all + 5).unwrap(), text.as_str());
        }
    }

    #[test]
    fn an_excerpt_stays_within_its_limit_and_says_what_it_removed() {
        let marker = |removed: u64, short: bool| {
            if short {
                format!("[{removed} masked]")
            } else {
                format!("\n[… {removed} tokens of this tool output masked …]\n")
            }
        };
        let text = "words of a long tool output, 42 lines\n".repeat(400);
        let total = ENC.count(&text).unwrap();
        // What the cut removes: the text's tokens less the candidate's (a stand-in for the
        // item's whole cost less its masked copy's).
        let mut removed = |c: &str| Ok(total.saturating_sub(ENC.count(c)?));
        for limit in [16u64, 24, 40, 64, 200] {
            let e = excerpt(ENC, &text, limit, false, total, &marker, &mut removed)
                .unwrap()
                .unwrap();
            let n = ENC.count(&e.text).unwrap();
            assert!(n <= limit, "limit {limit}");
            assert_eq!(
                e.removed,
                total - n,
                "the number is exact at the fixed point"
            );
            assert!(e.text.contains(&format!("{} ", e.removed)) || e.text.contains("masked]"));
            if limit >= 40 {
                assert!(e.text.starts_with("words of"), "head kept at {limit}");
                assert!(e.text.ends_with("lines\n"), "tail kept at {limit}");
            }
        }
        // Nothing to cut: the text fits; unless something else (media) went.
        assert_eq!(
            excerpt(ENC, "short", 64, false, total, &marker, &mut removed).unwrap(),
            None
        );
        let mut media = |c: &str| Ok(85 + 1 - ENC.count(c)?.min(86));
        let forced = excerpt(ENC, "short", 64, true, 86, &marker, &mut media)
            .unwrap()
            .unwrap();
        assert!(forced.text.starts_with("short\n[… "), "{}", forced.text);
        // Not even the short marker fits.
        assert_eq!(
            excerpt(ENC, &text, 2, false, total, &marker, &mut removed).unwrap(),
            None
        );
        assert_eq!(tokens_up_to(ENC, "alpha beta", 5).unwrap(), Some(2));
        assert_eq!(tokens_up_to(ENC, &text, 100).unwrap(), None);
    }

    fn table() -> String {
        (0..700)
            .map(|i| {
                format!(
                    "row {i}: {}",
                    (0..12)
                        .map(|j| format!("v{i}_{j}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn cost(v: &Value) -> u64 {
        item_cost(v, ENC).unwrap().total()
    }

    #[test]
    fn cut_text_is_token_exact_and_says_what_was_removed() {
        let text = table();
        for limit in [0u64, 1, 10, 50, 500, 5_000] {
            let cut = cut_text(ENC, &text, limit, TAIL_SHARE, TRUNCATION_MARKER).unwrap();
            assert!(ENC.count(&cut).unwrap() <= limit, "{limit}");
            if limit >= 50 {
                assert!(cut.starts_with("row 0:") && cut.contains("tokens removed by protoprompt"));
                assert!(cut.ends_with("v699_11"));
            }
        }
        assert_eq!(
            cut_text(ENC, "short", 10, 0.2, TRUNCATION_MARKER).unwrap(),
            "short"
        );
    }

    #[test]
    fn many_small_parts_give_way_to_one_marker_keeping_first_and_last() {
        let parts: Vec<Value> = (0..800)
            .map(|i| serde_json::json!({"type": "input_text", "text": format!("part {i}: {}", "alpha beta ".repeat(7))}))
            .collect();
        let item =
            serde_json::json!({"type": "function_call_output", "call_id": "c", "output": parts});
        assert!(cost(&item) > 10_000);
        for target in [6_000u64, 2_000, 300, 60] {
            let fit = fit_output(&item, target, ENC).unwrap().expect("fits");
            assert!(
                fit.tokens <= target && fit.tokens == cost(&fit.item),
                "{target}"
            );
            assert!(
                fit.tokens + 40 >= target.min(cost(&item)),
                "room used: {} of {target}",
                fit.tokens
            );
            let out = fit.item["output"].as_array().unwrap();
            assert!(fit.parts_removed > 0 && out.len() == 800 - fit.parts_removed + 1);
            let texts: Vec<&str> = out.iter().map(|p| p["text"].as_str().unwrap()).collect();
            assert!(texts
                .iter()
                .any(|t| t.contains("parts (") && t.contains("removed by protoprompt")));
            if target >= 300 {
                assert!(texts[0].starts_with("part 0:"));
                assert!(texts.last().unwrap().starts_with("part 799:"));
            }
        }
        assert_eq!(
            item["output"].as_array().unwrap().len(),
            800,
            "the item is untouched"
        );
    }

    #[test]
    fn small_parts_and_images_lose_the_images_then_parts() {
        let mut parts: Vec<Value> = (0..300)
            .map(|i| serde_json::json!({"type": "input_text", "text": format!("line {i} of the listing")}))
            .collect();
        for k in 0..5 {
            parts.insert(k * 60, serde_json::json!({"type": "input_image", "image_url": "https://example.com/a.png", "detail": "high"}));
        }
        let item =
            serde_json::json!({"type": "function_call_output", "call_id": "c", "output": parts});
        let fit = fit_output(&item, 1_500, ENC).unwrap().expect("fits");
        assert!(fit.tokens <= 1_500);
        assert_eq!(
            fit.media_removed, 5,
            "each image costs 1445 tokens: none fits"
        );
        assert!(fit.parts_removed > 0);
        // Room for the texts and two images: the newest are replaced first, only as many as
        // needed, and then nothing else is cut.
        let mut texts_only = item.clone();
        texts_only["output"] = Value::Array(
            item["output"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| !is_media(p))
                .cloned()
                .collect(),
        );
        let room = cost(&texts_only) + 3 * 60 + 2 * 1_445 + 10; // 3 markers of ~20 tokens
        let fit = fit_output(&item, room, ENC).unwrap().expect("fits");
        assert_eq!((fit.media_removed, fit.parts_removed), (3, 0));
        let out = fit.item["output"].as_array().unwrap();
        assert_eq!(out.iter().filter(|p| p["type"] == "input_image").count(), 2);
        assert!(out.iter().all(|p| p["type"] == "input_image"
            || !p["text"].as_str().unwrap().contains("tokens removed")));
        assert_eq!(out[0]["type"], "input_image", "the oldest images stay");
    }

    #[test]
    fn one_long_text_is_cut_head_and_tail_to_fill_the_room() {
        let text = table();
        let image = serde_json::json!({"type": "input_image", "image_url": "https://example.com/a.png", "detail": "high"});
        let item = serde_json::json!({"type": "function_call_output", "call_id": "c", "output": [
            {"type": "input_text", "text": text}, image, {"type": "input_text", "text": "tail"}]});
        for target in [30_000u64, 2_000, 120, 40] {
            let fit = fit_output(&item, target, ENC).unwrap().expect("fits");
            assert!(
                fit.tokens <= target && target - fit.tokens <= 12,
                "{target}: {}",
                fit.tokens
            );
        }
        let fit = fit_output(&item, 2_000, ENC).unwrap().unwrap();
        assert_eq!(
            fit.item["output"][1], image,
            "the image fits once the text is cut"
        );
        assert_eq!(fit.media_removed, 0);
        let plain =
            serde_json::json!({"type": "function_call_output", "call_id": "c", "output": text});
        let fit = fit_output(&plain, 20, ENC)
            .unwrap()
            .expect("below the 32-token floor");
        assert!(fit.tokens <= 20);
    }

    #[test]
    fn many_long_texts_are_cut_to_one_level() {
        // A hundred texts of 150-400 tokens with files and images between them (found by
        // tests/truncate.rs: cutting one text per step ran out of steps).
        let mut parts = Vec::new();
        for i in 0..100 {
            let text = "alpha epsilon 1234 delta 🙂 gamma 契約 beta ".repeat(20 + (i * 37) % 30);
            parts.push(serde_json::json!({"type": "input_text", "text": text}));
            if i % 9 == 0 {
                parts.push(serde_json::json!({"type": "input_file", "file_id": "file_1"}));
            }
        }
        let item =
            serde_json::json!({"type": "function_call_output", "call_id": "c", "output": parts});
        let full = cost(&item);
        for share in [0.8, 0.5, 0.18, 0.06] {
            let target = (full as f64 * share) as u64;
            let fit = fit_output(&item, target, ENC).unwrap().expect("fits");
            assert!(
                fit.tokens <= target && fit.tokens + target / 20 >= target,
                "{share}"
            );
        }
    }

    #[test]
    fn shell_chunks_keep_their_shape_and_screenshots_cannot_be_cut() {
        let chunks: Vec<Value> = (0..400)
            .map(|i| serde_json::json!({"stdout": format!("file_{i}.txt"), "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}))
            .collect();
        let item =
            serde_json::json!({"type": "shell_call_output", "call_id": "s", "output": chunks});
        let fit = fit_output(&item, 800, ENC).unwrap().expect("fits");
        assert!(fit.tokens <= 800 && fit.parts_removed > 0);
        for chunk in fit.item["output"].as_array().unwrap() {
            assert_eq!(chunk["outcome"]["type"], "exit");
            assert!(chunk["stdout"].is_string() && chunk["stderr"].is_string());
        }
        let shot = serde_json::json!({"type": "computer_call_output", "call_id": "x",
            "output": {"type": "computer_screenshot", "image_url": "https://example.com/s.png"}});
        assert_eq!(fit_output(&shot, 100, ENC).unwrap(), None);
        assert!(
            fit_output(&item, 5, ENC).unwrap().is_none(),
            "not even the marker fits"
        );
    }
}
