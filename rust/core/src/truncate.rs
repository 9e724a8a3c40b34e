//! Token-exact cuts of a long text: its first and last tokens, for a model-facing copy of an
//! oversized tool output (the stored item is never changed).
//!
//! A text is tokenised once, in the same pre-tokenizer-safe segments as counting (so the
//! tokens are exactly those of the whole text); the head is the text of its first `head`
//! tokens and the tail the text of its last `tail` tokens, each moved inwards to a character
//! boundary when a token ends inside a multi-byte character. Re-tokenising a head can merge
//! across the cut differently, so callers check the final count; this gives them the pieces.

use crate::tokens::{quietly, segments, Encoding, TokenError, SEGMENT_BYTES, SPLIT_WINDOW};

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
}
