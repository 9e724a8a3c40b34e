//! Exact counting of a text, in bounded segments split only where the pre-tokenizer splits
//! too (see [`Encoding::count`]), with tokenizer failures caught and never printed.

use std::cell::Cell;

use super::{Bpe, Encoding, TokenError};

thread_local! {
    /// Counts still to fail on this thread (see [`fail_next_counts`]).
    static FAIL_NEXT: Cell<usize> = const { Cell::new(0) };
}

/// Test hook: the next `n` calls of [`Encoding::count`] on this thread fail as a tokenizer
/// failure does ([`TokenError::Tokenizer`]), so that callers can test how they report one
/// (a real failure needs a text the tokenizer cannot handle even in halves). Per thread:
/// tests running in parallel do not see each other's failures.
pub fn fail_next_counts(n: usize) {
    FAIL_NEXT.with(|f| f.set(n));
}

fn injected_failure() -> bool {
    FAIL_NEXT.with(|f| match f.get() {
        0 => false,
        n => {
            f.set(n - 1);
            true
        }
    })
}

impl Encoding {
    /// Number of tokens of `text`, special-token text counted as ordinary text
    /// (equal to `len(tiktoken.get_encoding(name).encode_ordinary(text))`).
    ///
    /// Long texts are counted in segments of about [`SEGMENT_BYTES`] split only where every
    /// encoding's pre-tokenizer splits too (see [`is_exact_split`]), so the sum is exact; this
    /// bounds the work of the regex engine and of the BPE merge per segment. A text with no
    /// such point in the [`SPLIT_WINDOW`] bytes after a segment's target size (a run of one
    /// letter, of whitespace, of CJK text without ASCII punctuation) is cut every
    /// [`FORCED_SPLIT`] bytes instead, and segments with the same text are tokenised once per
    /// call, so such texts count in linear time (20 MB of one letter in a fraction of a second
    /// instead of 15 s). Only at such a forced split, or where the tokenizer fails on a
    /// segment and it is halved (see [`Encoding::count_segment`]), can the count differ from
    /// the reference, by about a token per split. Either way it lies within
    /// [`Encoding::count_bounds`] (every token covers 1 to `max_token_bytes` bytes).
    pub fn count(self, text: &str) -> Result<u64, TokenError> {
        if injected_failure() {
            return Err(TokenError::Tokenizer(
                "injected failure (test hook)".to_string(),
            ));
        }
        self.count_with_segments(text, SEGMENT_BYTES, SPLIT_WINDOW)
    }

    /// The fewest and most tokens any text of `text_bytes` bytes can count: every token of
    /// the tokenizer covers at least one byte and at most [`Encoding::max_token_bytes`]
    /// (each counted [`Encoding::tokens_per_piece`] times). A count from
    /// outside (a persistent store) that lies outside is not a count of that text.
    pub fn count_bounds(self, text_bytes: usize) -> (u64, u64) {
        let n = text_bytes as u64;
        let k = self.tokens_per_piece();
        (
            n.div_ceil(self.max_token_bytes()).saturating_mul(k),
            n.saturating_mul(k),
        )
    }

    /// Whether `count` can be the token count of `text` (see [`Encoding::count_bounds`]).
    pub fn count_is_possible(self, text: &str, count: u64) -> bool {
        let (low, high) = self.count_bounds(text.len());
        (low..=high).contains(&count)
    }

    fn count_with_segments(
        self,
        text: &str,
        segment: usize,
        window: usize,
    ) -> Result<u64, TokenError> {
        if text.len() <= segment {
            return self.count_segment(text);
        }
        // Segments met earlier in this text (a forced split through a long run of one
        // character makes many equal ones). Keys are hashed with a random key: a text
        // cannot be built to make its segments collide.
        let mut seen: std::collections::HashMap<&str, u64> = Default::default();
        let mut total = 0u64;
        for part in segments(self, text, segment, window) {
            let n = match seen.get(part) {
                Some(&n) => n,
                None => {
                    let n = self.count_segment(part)?;
                    seen.insert(part, n);
                    n
                }
            };
            total = total.saturating_add(n);
        }
        Ok(total)
    }

    /// Number of tokens of `text` tokenised whole, without [`Encoding::count`]'s segments
    /// (slow for long texts: for comparisons and tests). Exact unless the tokenizer fails on
    /// the text, which is then halved as described at [`Encoding::count_segment`].
    pub fn count_whole(self, text: &str) -> Result<u64, TokenError> {
        self.count_segment(text)
    }

    /// Count one segment. A segment the tokenizer fails on (tiktoken-rs unwraps its regex
    /// engine's results, and a long run of whitespace exceeds that engine's limits) is halved
    /// at a character boundary until it can be counted; the failure is caught, never unwinds
    /// to a caller and prints nothing.
    fn count_segment(self, text: &str) -> Result<u64, TokenError> {
        if text.is_empty() {
            return Ok(0);
        }
        let bpe = self.bpe();
        match quietly(|| bpe.count(text) as u64) {
            Ok(n) => Ok(n),
            Err(payload) if text.len() >= 2 * MIN_FALLBACK_SPLIT => {
                drop(payload);
                let mut mid = text.len() / 2;
                while !text.is_char_boundary(mid) {
                    mid += 1;
                }
                let left = self.count_segment(&text[..mid])?;
                Ok(left.saturating_add(self.count_segment(&text[mid..])?))
            }
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "internal error".to_string());
                Err(TokenError::Tokenizer(msg))
            }
        }
    }
}

/// Target size of the segments a long text is counted in.
pub const SEGMENT_BYTES: usize = 64 * 1024;
/// How far past its target size a segment may run to end at an exact split point; with no
/// such point in this window it ends at its target size (see [`Encoding::count`]).
pub const SPLIT_WINDOW: usize = 64 * 1024;
/// Length of a segment cut where the text has no exact split point (see [`segments`]).
pub const FORCED_SPLIT: usize = 4 * 1024;
/// Smallest piece the fallback split produces.
const MIN_FALLBACK_SPLIT: usize = 1024;

/// Whether this encoding's pre-tokenizer splits `bytes` before position `i` too, so that
/// counting `bytes[..i]` and `bytes[i..]` apart gives the count of the whole. Such a point
/// is where a piece must end and the next one begins, with nothing on either side that a
/// pattern looks at across it:
///
/// * after `\n` followed by an ASCII letter or digit (a piece holding the newline ends
///   there, and no piece starting at a letter or digit looks behind). For the r50k / p50k
///   patterns the byte before the newline must not be whitespace: their `\s++$` would
///   take a whitespace run at the end of the left part whole, where the whole text's
///   `\s+(?!\S)` leaves its last character apart;
/// * after `\n` followed by `<` (a tag opening or closing a line), for the o200k, cl100k,
///   Llama 3 and Qwen2 patterns: the piece holding the newline ends there (`\s*[\r\n]+`
///   ends at the last newline, and a punctuation run's trailing `[\r\n/]*` takes no `<`),
///   and the piece starting at `<` looks at nothing before it;
/// * after an ASCII letter followed by an ASCII digit or ASCII punctuation other than `'`
///   (a letter piece ends at the last letter unless a contraction `'s`, `'t`… follows);
/// * after an ASCII letter or digit followed by a space and an ASCII letter (the space
///   starts the next word's piece, ` word`).
///
/// In the last two the left part ends with a letter or digit, so no whitespace pattern
/// (`\s+(?!\S)`, `\s++$`) ends at the split. Under `gemma3` (SentencePiece, no
/// pre-tokenizer) a point is exact where no piece of the vocabulary holds the bytes on
/// either side of it side by side (a space as `▁`): no merged symbol can span it. Tested on random texts for every encoding
/// against counting the whole.
pub fn is_exact_split(encoding: Encoding, bytes: &[u8], i: usize) -> bool {
    if i == 0 || i >= bytes.len() {
        return false;
    }
    if encoding == Encoding::Gemma3 {
        // SentencePiece has no pre-tokenizer: where no piece can span a point comes from
        // the vocabulary (built first if need be).
        if let Bpe::Spm(spm) = encoding.bpe() {
            return spm.can_split(bytes, i);
        }
    }
    let (before, at) = (bytes[i - 1], bytes[i]);
    let newline = before == b'\n'
        && at.is_ascii_alphanumeric()
        && match encoding {
            Encoding::O200kBase
            | Encoding::O200kHarmony
            | Encoding::Cl100kBase
            | Encoding::Llama3
            | Encoding::Qwen2
            | Encoding::DeepseekV3
            | Encoding::Tekken
            | Encoding::ClaudeEstimate => true,
            Encoding::Gemma3 => false,
            Encoding::P50kBase | Encoding::P50kEdit | Encoding::R50kBase => {
                i >= 2 && bytes[i - 2].is_ascii_graphic()
            }
        };
    let tag = before == b'\n'
        && at == b'<'
        && matches!(
            encoding,
            Encoding::O200kBase
                | Encoding::O200kHarmony
                | Encoding::Cl100kBase
                | Encoding::Llama3
                | Encoding::Qwen2
        );
    newline
        || tag
        || (before.is_ascii_alphabetic()
            && (at.is_ascii_digit() || (at.is_ascii_punctuation() && at != b'\'')))
        || (before.is_ascii_alphanumeric()
            && at == b' '
            && bytes.get(i + 1).is_some_and(u8::is_ascii_alphabetic))
}

/// Split `text` into segments of about `target` bytes: each ends at the first exact split
/// point (see [`is_exact_split`]) at or after `target` bytes and within `window` more. Where
/// there is none, the text is split after [`FORCED_SPLIT`] bytes (the next character
/// boundary) instead: no segment is longer than `target + window` bytes plus a character,
/// and one with no exact point is short, which keeps the BPE merge of a long run of
/// letters fast (it is O(n log n) in the length of a pre-tokenizer piece).
pub(crate) fn segments(
    encoding: Encoding,
    text: &str,
    target: usize,
    window: usize,
) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let target = target.max(1);
    let forced_len = FORCED_SPLIT.min(target);
    let mut start = 0usize;
    // No exact point lies in `..scanned` beyond what a segment ended at.
    let mut scanned = 0usize;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        let begin = start;
        let mut end = bytes.len();
        if end - begin > target {
            let first = (begin + target).max(scanned);
            let last = (begin + target + window).min(bytes.len());
            let exact = (first..last).find(|&i| is_exact_split(encoding, bytes, i));
            scanned = scanned.max(last);
            end = match exact {
                Some(i) => i,
                None if end - begin > target + window => begin + forced_len,
                None => end,
            };
            while !text.is_char_boundary(end) {
                end += 1;
            }
        }
        start = end;
        Some(&text[begin..end])
    })
}

thread_local! {
    /// Set while this thread runs tokenizer code whose panic is caught and handled.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f`, catching a panic without printing it: the process's panic hook is wrapped
/// once so that it stays silent for panics on a thread inside this call (any other panic
/// is reported by the previous hook as before).
pub fn quietly<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> std::thread::Result<R> {
    static WRAPPED: std::sync::Once = std::sync::Once::new();
    WRAPPED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let result = std::panic::catch_unwind(f);
    QUIET.with(|q| q.set(was));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_counts() {
        // Reference counts from openai/tiktoken 0.12 (`len(enc.encode_ordinary(text))`).
        let cases: [(&str, u64, u64); 7] = [
            ("hello world", 2, 2),
            ("tiktoken is great!", 6, 6),
            ("Привет, мир! Как дела?", 8, 12),
            ("def f(x):\n    return x**2\n", 10, 10),
            ("<|endoftext|>", 7, 7),
            ("🙂👍🏽 emoji", 5, 9),
            ("   \n\n\t  spaces", 3, 3),
        ];
        for (text, o200k, cl100k) in cases {
            assert_eq!(Encoding::O200kBase.count(text).unwrap(), o200k, "{text:?}");
            assert_eq!(
                Encoding::Cl100kBase.count(text).unwrap(),
                cl100k,
                "{text:?}"
            );
        }
        assert_eq!(Encoding::O200kBase.count("").unwrap(), 0);
    }

    /// Random texts over fragments that stress the pre-tokenizers' boundaries: words,
    /// contractions, digits, punctuation and JSON, whitespace runs, newlines, combining marks,
    /// non-Latin letters.
    fn random_texts(rounds: usize) -> Vec<String> {
        let words = [
            "alpha",
            " beta",
            "\n",
            "\n\n",
            "  ",
            "/path",
            "x/y",
            "42",
            "1234",
            ".\n",
            "Привет",
            "\t",
            "'s",
            "don't",
            "\r\n",
            "a\nb",
            "\n/",
            "?!",
            "🙂",
            "    indent",
            "{\"k\":",
            "\"v\",",
            "}",
            "[1,",
            "2]",
            "ABC",
            "x1",
            "Id",
            "'S",
            "n't",
            "  x",
            "e\u{301}",
            "é",
            "日本語",
            "。",
            "0.5",
            "-",
            "_x",
            "a_b",
            "U.S.",
            " I'm",
            "\u{a0}",
            "`code`",
            "<turn when=\"then\">\n",
            "</turn>",
            "\n<",
            "<x>",
            "\n</y>\n",
            ">\n",
            "&lt;",
        ];
        let mut seed = 7u64;
        (0..rounds)
            .map(|round| {
                let mut text = String::new();
                for _ in 0..(20 + round % 60) {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    text.push_str(words[(seed >> 33) as usize % words.len()]);
                }
                text
            })
            .collect()
    }

    #[test]
    fn exact_split_points_split_every_encoding() {
        let mut points = 0;
        for text in random_texts(200) {
            let bytes = text.as_bytes();
            for enc in Encoding::ALL {
                let whole = enc.count_segment(&text).unwrap();
                for i in (1..bytes.len()).filter(|&i| is_exact_split(enc, bytes, i)) {
                    points += 1;
                    let parts = enc.count_segment(&text[..i]).unwrap()
                        + enc.count_segment(&text[i..]).unwrap();
                    assert_eq!(parts, whole, "{} at {i}: {text:?}", enc.name());
                }
            }
        }
        assert!(points > 10_000, "{points} split points tried");
    }

    #[test]
    fn segmented_counting_is_exact() {
        for text in random_texts(200) {
            for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
                let whole = enc.count_segment(&text).unwrap();
                for target in [1, 3, 8, 17] {
                    // A window as long as the text: every segment ends at an exact point.
                    assert_eq!(
                        enc.count_with_segments(&text, target, text.len()).unwrap(),
                        whole,
                        "{text:?} target {target}"
                    );
                }
            }
        }
    }

    #[test]
    fn forced_splits_stay_close_and_within_bounds() {
        let mixed = random_texts(40).concat();
        for text in [
            "a".repeat(5000),
            " ".repeat(5000),
            "ab".repeat(2500),
            "日本語".repeat(500),
            "1".repeat(5000),
            " \t\n".repeat(2000),
            mixed,
        ] {
            for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
                let whole = enc.count_segment(&text).unwrap();
                for (target, window) in [(64, 16), (100, 0), (1000, 1)] {
                    let n = enc.count_with_segments(&text, target, window).unwrap();
                    let (low, high) = enc.count_bounds(text.len());
                    assert!(low <= n && n <= high, "{n} outside {low}..={high}");
                    // A forced split can cost a token or two on each side of it.
                    let splits = (text.len() / target.min(FORCED_SPLIT)) as u64;
                    assert!(n.abs_diff(whole) <= 2 * splits + 2, "{n} vs {whole}");
                }
            }
        }
    }

    #[test]
    fn counts_outside_the_byte_bounds_are_impossible() {
        let e = Encoding::O200kBase;
        let text = "word ".repeat(100); // 500 bytes: 1 token covers at most 128 of them
        let n = e.count(&text).unwrap();
        assert!(e.count_is_possible(&text, n));
        assert_eq!(e.count_bounds(500), (4, 500));
        for bad in [0, 1, 3, 501, u64::MAX] {
            assert!(!e.count_is_possible(&text, bad), "{bad}");
        }
        assert!(e.count_is_possible("", 0));
        assert!(!e.count_is_possible("", 1));
        for text in random_texts(50) {
            for enc in Encoding::ALL {
                assert!(enc.count_is_possible(&text, enc.count(&text).unwrap()));
            }
        }
    }

    #[test]
    fn pathological_texts_do_not_fail() {
        // A megabyte of spaces overflows the regex engine's limits in tiktoken itself:
        // whole, it is halved until it counts; split into segments it never fails.
        let spaces = " ".repeat(1 << 20);
        let halved = Encoding::O200kBase.count_segment(&spaces).unwrap();
        let n = Encoding::O200kBase.count(&spaces).unwrap();
        assert!(n > 0 && n < 20_000, "{n}");
        assert!(n.abs_diff(halved) <= 64, "{n} vs {halved}");
        let letters = "a".repeat(1 << 20);
        assert_eq!(
            Encoding::O200kBase.count(&letters).unwrap(),
            Encoding::O200kBase.count_segment(&letters).unwrap()
        );
        let lines = "word and more words\n".repeat(50_000);
        let whole = Encoding::O200kBase.count_segment(&lines).unwrap();
        assert_eq!(Encoding::O200kBase.count(&lines).unwrap(), whole);
    }
}
