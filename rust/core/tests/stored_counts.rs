//! Property tests of the counts protoprompt keeps outside the process: the values a count
//! store hands back (whatever they are, a stored count is taken only when a text of that
//! length can have it, else the text is counted again and the store corrected) and the token
//! costs a snapshot carries (any bytes are refused or give costs an item can have).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest, ProptestConfig, Strategy};
use protoprompt_core::costs::{
    CostEngine, CostMemo, CostPayload, CountStore, ItemSource, NoStore, StoreError,
};
use protoprompt_core::pack::{CostFailure, CostSource};
use protoprompt_core::tokens::{self, Encoding, ITEM_OVERHEAD, STORE_MIN_BYTES};
use serde_json::{json, Value};

const ENC: Encoding = Encoding::O200kBase;
const SECRET: [u8; 16] = *b"fedcba9876543210";

/// A text of about `bytes` bytes no other test (sharing the process-wide count cache) has
/// counted, mixing pieces that split into tokens differently.
fn unique(bytes: usize, salt: u64) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let pieces = [
        "word", " ", "\n", "12345", "é", "日本", "🙂", "{\"k\":", "'s",
    ];
    let mut text = format!("p{}n{n} ", std::process::id());
    let mut i = salt as usize;
    while text.len() < bytes {
        text.push_str(pieces[i % pieces.len()]);
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    text
}

struct Items(Vec<Value>);

impl ItemSource for Items {
    fn values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        Ok(positions.iter().map(|&p| self.0[p].clone()).collect())
    }
}

/// A store answering from a map; `extra` answers more (or, negative, fewer) than asked.
struct Store {
    counts: HashMap<[u8; 16], u64>,
    extra: isize,
}

impl CountStore for Store {
    fn secret(&self) -> [u8; 16] {
        SECRET
    }

    fn get_many(&mut self, keys: &[[u8; 16]]) -> Result<Vec<Option<u64>>, StoreError> {
        let mut found: Vec<Option<u64>> =
            keys.iter().map(|k| self.counts.get(k).copied()).collect();
        let len = found.len().saturating_add_signed(self.extra);
        found.resize(len, Some(1));
        Ok(found)
    }
}

/// What the store holds for one text.
#[derive(Debug, Clone)]
enum Stored {
    Nothing,
    /// The text's real count.
    Real,
    /// The real count moved by this much (a damaged or foreign value).
    Off(i64),
    /// Any value at all.
    Any(u64),
}

fn stored() -> impl Strategy<Value = Stored> {
    proptest::prop_oneof![
        proptest::strategy::Just(Stored::Nothing),
        proptest::strategy::Just(Stored::Real),
        (-3i64..=3).prop_map(Stored::Off),
        (-100_000i64..100_000).prop_map(Stored::Off),
        any::<u64>().prop_map(Stored::Any),
    ]
}

fn canonical_text(item: &Value) -> String {
    tokens::canonical(item, ENC).unwrap().text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever a store holds for a text, its cost is the stored count when a text of that
    /// length can have it (a hit), else the text's real count, reported for writing back.
    #[test]
    fn a_stored_count_is_taken_only_when_possible(
        texts in proptest::collection::vec((0usize..3 * STORE_MIN_BYTES, any::<u64>(), stored()), 1..8),
    ) {
        let items: Vec<Value> = texts
            .iter()
            .map(|(bytes, salt, _)| json!({"role": "user", "content": unique(*bytes, *salt)}))
            .collect();
        let mut counts = HashMap::new();
        let mut expected = Vec::new();
        for (item, (_, _, s)) in items.iter().zip(&texts) {
            let text = canonical_text(item);
            let real = ENC.count(&text).unwrap();
            let key = tokens::store_key(&SECRET, ENC, &text);
            let value = match *s {
                Stored::Nothing => None,
                Stored::Real => Some(real),
                Stored::Off(d) => Some(real.saturating_add_signed(d)),
                Stored::Any(v) => Some(v),
            };
            if let Some(v) = value {
                counts.insert(key, v);
            }
            let asked = text.len() >= STORE_MIN_BYTES;
            let taken = value.filter(|&v| asked && ENC.count_is_possible(&text, v));
            expected.push((key, real, asked, taken));
        }
        let positions: Vec<usize> = (0..items.len()).collect();
        let mut engine =
            CostEngine::new(Items(items), ENC).with_store(Some(Store { counts, extra: 0 }));
        let costs = engine.costs(&positions).unwrap();
        let (_, link) = engine.finish();
        let (_, tally) = link.unwrap();
        let mut hits = 0;
        for (cost, (key, real, asked, taken)) in costs.iter().zip(&expected) {
            match taken {
                Some(v) => {
                    hits += 1;
                    prop_assert_eq!(*cost, v + ITEM_OVERHEAD);
                    prop_assert!(!tally.new_counts.iter().any(|(k, _)| k == key));
                }
                None => {
                    prop_assert_eq!(*cost, real + ITEM_OVERHEAD);
                    prop_assert_eq!(
                        tally.new_counts.iter().any(|&(k, n)| k == *key && n == *real),
                        *asked
                    );
                }
            }
        }
        prop_assert_eq!(tally.hits, hits);
    }

    /// A store that answers more or fewer counts than it was asked fails the costing,
    /// naming the store; none of its answers is used.
    #[test]
    fn an_answer_of_another_length_is_refused(extra in proptest::prop_oneof![-3isize..0, 1isize..4]) {
        let items = vec![json!({"role": "user", "content": unique(2 * STORE_MIN_BYTES, 1)})];
        let store = Store { counts: HashMap::new(), extra };
        let err = CostEngine::new(Items(items), ENC)
            .with_store(Some(store))
            .costs(&[0])
            .unwrap_err();
        prop_assert_eq!(err.field.as_str(), "(count_store)");
        prop_assert!(err.message.contains("get_many returned"), "{}", err.message);
    }

    /// Any bytes where a snapshot keeps its token costs are refused, or give a memo of that
    /// many positions whose every cost is one an item can have.
    #[test]
    fn any_cost_payload_bytes_are_refused_or_possible(
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
        items in 0usize..8,
    ) {
        if let Ok(payload) = postcard::from_bytes::<CostPayload>(&bytes) {
            if let Ok(memo) = CostMemo::from_payload(payload, items) {
                for p in 0..items {
                    if let Some(c) = memo.get(p) {
                        prop_assert!(c >= ITEM_OVERHEAD, "position {} costs {}", p, c);
                    }
                }
                prop_assert_eq!(memo.get(items), None);
            }
        }
    }

    /// The costs of a memo round-trip through a snapshot's bytes; a changed byte is refused
    /// or still gives only possible costs.
    #[test]
    fn a_cost_payload_round_trips_and_damage_stays_possible(
        sizes in proptest::collection::vec(0usize..400, 0..6),
        at in any::<usize>(),
        byte in any::<u8>(),
    ) {
        let items: Vec<Value> = sizes
            .iter()
            .map(|&n| json!({"role": "user", "content": unique(n, n as u64)}))
            .collect();
        let n = items.len();
        let mut memo = CostMemo::new();
        let positions: Vec<usize> = (0..n).filter(|p| p % 2 == 0).collect();
        CostEngine::<_, NoStore>::new(Items(items), ENC)
            .with_memo(&mut memo, n)
            .costs(&positions)
            .unwrap();
        let bytes = postcard::to_allocvec(&memo.payload()).unwrap();
        let back = CostMemo::from_payload(postcard::from_bytes(&bytes).unwrap(), n).unwrap();
        prop_assert_eq!(&back, &memo);
        let mut damaged = bytes.clone();
        let i = at % damaged.len();
        damaged[i] = byte;
        if let Ok(payload) = postcard::from_bytes::<CostPayload>(&damaged) {
            if let Ok(memo) = CostMemo::from_payload(payload, n) {
                for p in 0..n {
                    if let Some(c) = memo.get(p) {
                        prop_assert!(c >= ITEM_OVERHEAD, "position {} costs {}", p, c);
                    }
                }
            }
        }
    }
}
