//! Token-exact cuts of a long text: its first and last tokens, for a model-facing copy of an
//! oversized tool output (the stored item is never changed).
//!
//! A text is tokenised once, in the same pre-tokenizer-safe segments as counting (so the
//! tokens are exactly those of the whole text); the head is the text of its first `head`
//! tokens and the tail the text of its last `tail` tokens, each moved inwards to a character
//! boundary when a token ends inside a multi-byte character. Re-tokenising a head can merge
//! across the cut differently, so callers check the final count; this gives them the pieces.
//!
//! [`head_text`] and [`tail_text`] give the same pieces without tokenising the whole text:
//! only a prefix (or suffix) that ends (or starts) where the pre-tokenizer splits too, so its
//! tokens are exactly the first (or last) tokens of the whole text. [`excerpt`] builds a
//! head and tail around a marker within an exact token limit (masking of old tool outputs).

use crate::tokens::{
    is_exact_split, quietly, segments, Encoding, TokenError, SEGMENT_BYTES, SPLIT_WINDOW,
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
            .map_err(|e| TokenError::Tokenizer(e.to_string()))
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
        .map_err(|e| TokenError::Tokenizer(e.to_string()))
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
            let take = tokens.len().min(n as usize);
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
fn encode_piece(
    bpe: &tiktoken_rs::CoreBPE,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<(), TokenError> {
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
}
