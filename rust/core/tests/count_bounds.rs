//! Counts a persistent store hands back are believed only within what a text of that length
//! can count: every real count lies in the bounds, and nothing outside them is accepted.

use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest, ProptestConfig};
use protoprompt_core::tokens::Encoding;

const PIECES: [&str; 12] = [
    "word", " ", "   ", "\n", "\t", "12345", "{\"k\":", "é", "日本", "🙂", "aaaa", "'s",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn only_counts_within_the_byte_bounds_are_possible(
        parts in proptest::collection::vec(0usize..PIECES.len(), 0..400),
        repeat in 1usize..50,
        count in any::<u64>(),
        enc in 0usize..Encoding::ALL.len(),
    ) {
        let enc = Encoding::ALL[enc];
        let text: String = parts.iter().map(|&i| PIECES[i].repeat(repeat)).collect();
        let (low, high) = enc.count_bounds(text.len());
        let per_piece = enc.tokens_per_piece();
        prop_assert_eq!(high, text.len() as u64 * per_piece);
        prop_assert_eq!(low, (text.len() as u64).div_ceil(enc.max_token_bytes()) * per_piece);
        prop_assert_eq!(enc.count_is_possible(&text, count), (low..=high).contains(&count));
        let real = enc.count(&text).unwrap();
        prop_assert!(enc.count_is_possible(&text, real), "{} not in {}..={}", real, low, high);
        for off_by in [1u64, 2, high + 1] {
            prop_assert!(!enc.count_is_possible(&text, high + off_by));
            if low >= off_by {
                prop_assert!(!enc.count_is_possible(&text, low - off_by));
            }
        }
    }
}
