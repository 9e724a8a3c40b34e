//! The cost engine: count tiers (process cache, count store, tokenizer), the per-position
//! memo and its encoding switch, over a fake item source and a fake count store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use protoprompt_core::costs::{
    CostEngine, CostMemo, CountStore, ItemSource, NoStore, StoreError, StoreTally, UNCOUNTED,
};
use protoprompt_core::pack::{CostFailure, CostSource};
use protoprompt_core::tokens::{
    self, CostBasis, Encoding, OpaqueScale, ITEM_OVERHEAD, STORE_MIN_BYTES,
};
use serde_json::{json, Value};

const ENC: Encoding = Encoding::O200kBase;
const SECRET: [u8; 16] = *b"0123456789abcdef";

/// Texts no other test (sharing the process-wide count cache) has counted.
fn unique(words: usize) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let pid = std::process::id();
    (0..words)
        .map(|i| format!("w{pid}x{n}y{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// The canonical text of an item (what the tiers count).
fn text_of(item: &Value) -> String {
    tokens::canonical(item, ENC).unwrap().text
}

fn exact(item: &Value) -> u64 {
    ENC.count(&text_of(item)).unwrap() + ITEM_OVERHEAD
}

/// Items by position; counts how often each is fetched.
struct Items {
    items: Vec<Value>,
    fetched: Vec<usize>,
}

impl Items {
    fn new(items: Vec<Value>) -> Items {
        Items {
            items,
            fetched: Vec::new(),
        }
    }
}

impl ItemSource for Items {
    fn values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        self.fetched.extend_from_slice(positions);
        positions
            .iter()
            .map(|&p| {
                self.items.get(p).cloned().ok_or(CostFailure {
                    position: p,
                    field: "(item)".to_string(),
                    message: "gone".to_string(),
                })
            })
            .collect()
    }
}

/// A count store in memory that records what it was asked.
#[derive(Default)]
struct Store {
    counts: HashMap<[u8; 16], u64>,
    asked: Vec<[u8; 16]>,
    calls: usize,
    fail: bool,
}

impl Store {
    fn with(texts: &[(&str, u64)]) -> Store {
        let mut s = Store::default();
        for &(t, n) in texts {
            s.counts.insert(tokens::store_key(&SECRET, ENC, t), n);
        }
        s
    }
}

impl CountStore for Store {
    fn secret(&self) -> [u8; 16] {
        SECRET
    }

    fn get_many(&mut self, keys: &[[u8; 16]]) -> Result<Vec<Option<u64>>, StoreError> {
        self.calls += 1;
        if self.fail {
            return Err(StoreError {
                message: "disk on fire".to_string(),
            });
        }
        self.asked.extend_from_slice(keys);
        Ok(keys.iter().map(|k| self.counts.get(k).copied()).collect())
    }
}

fn run(items: Vec<Value>, store: Store, positions: &[usize]) -> (Vec<u64>, Store, StoreTally) {
    let mut engine = CostEngine::new(Items::new(items), ENC).with_store(Some(store));
    let costs = engine.costs(positions).unwrap();
    let (_, link) = engine.finish();
    let (store, tally) = link.unwrap();
    (costs, store, tally)
}

#[test]
fn a_stored_count_is_used_without_counting() {
    let item = user(&unique(80));
    let text = text_of(&item);
    assert!(text.len() >= STORE_MIN_BYTES);
    let true_count = ENC.count(&text).unwrap();
    let (costs, store, tally) = run(vec![item], Store::with(&[(&text, true_count)]), &[0]);
    assert_eq!(costs, vec![true_count + ITEM_OVERHEAD]);
    assert_eq!(tally.hits, 1);
    assert!(tally.new_counts.is_empty());
    assert_eq!(store.calls, 1);
    // The hit is now in the process cache: a later call without a store finds it there.
    assert_eq!(ENC.cache_lookup(&text).1, Some(true_count));
}

#[test]
fn a_stored_count_is_believed_within_the_bounds() {
    // A plausible but wrong count cannot be told from a right one: it is used as it is.
    let item = user(&unique(80));
    let text = text_of(&item);
    let stored = ENC.count(&text).unwrap() + 3;
    let (costs, _, tally) = run(vec![item], Store::with(&[(&text, stored)]), &[0]);
    assert_eq!(costs, vec![stored + ITEM_OVERHEAD]);
    assert_eq!(tally.hits, 1);
}

#[test]
fn a_store_miss_is_counted_and_reported_for_writing() {
    let item = user(&unique(80));
    let text = text_of(&item);
    let (costs, store, tally) = run(vec![item.clone()], Store::default(), &[0]);
    assert_eq!(costs, vec![exact(&item)]);
    assert_eq!(tally.hits, 0);
    let key = tokens::store_key(&SECRET, ENC, &text);
    assert_eq!(store.asked, vec![key]);
    assert_eq!(tally.new_counts, vec![(key, ENC.count(&text).unwrap())]);
}

#[test]
fn an_impossible_stored_count_is_recounted_and_rewritten() {
    for wrong_by in [0, 1, 2, 3] {
        // A new text each round: the first round's count is in the process cache.
        let item = user(&unique(80));
        let text = text_of(&item);
        let (low, high) = ENC.count_bounds(text.len());
        let key = tokens::store_key(&SECRET, ENC, &text);
        let wrong = [0, low - 1, high + 1, u64::MAX - 1][wrong_by];
        let mut store = Store::default();
        store.counts.insert(key, wrong);
        let mut engine =
            CostEngine::new(Items::new(vec![item.clone()]), ENC).with_store(Some(store));
        let costs = engine.costs(&[0]).unwrap();
        let (_, link) = engine.finish();
        let (_, tally) = link.unwrap();
        assert_eq!(costs, vec![exact(&item)], "stored {wrong}");
        assert_eq!(tally.hits, 0, "stored {wrong}");
        assert_eq!(
            tally.new_counts,
            vec![(key, ENC.count(&text).unwrap())],
            "stored {wrong}"
        );
    }
}

#[test]
fn short_texts_never_ask_the_store() {
    let items = vec![user("hi"), user(&unique(3))];
    assert!(items.iter().all(|i| text_of(i).len() < STORE_MIN_BYTES));
    let (costs, store, tally) = run(items.clone(), Store::default(), &[0, 1]);
    assert_eq!(costs, vec![exact(&items[0]), exact(&items[1])]);
    assert_eq!(store.calls, 0);
    assert_eq!(tally, StoreTally::default());
}

#[test]
fn a_count_cached_before_the_store_was_attached_is_written_to_it() {
    let item = user(&unique(80));
    let text = text_of(&item);
    let n = ENC.count_cached(&text).unwrap(); // counted by an earlier call without a store
    let (costs, store, tally) = run(vec![item], Store::default(), &[0]);
    assert_eq!(costs, vec![n + ITEM_OVERHEAD]);
    assert_eq!(store.calls, 0, "the process cache answers first");
    assert_eq!(
        tally.new_counts,
        vec![(tokens::store_key(&SECRET, ENC, &text), n)]
    );
}

#[test]
fn one_batch_asks_the_store_once() {
    let items: Vec<Value> = (0..5).map(|_| user(&unique(80))).collect();
    let (costs, store, tally) = run(items.clone(), Store::default(), &[0, 1, 2, 3, 4]);
    assert_eq!(costs, items.iter().map(exact).collect::<Vec<_>>());
    assert_eq!(store.calls, 1);
    assert_eq!(store.asked.len(), 5);
    assert_eq!(tally.new_counts.len(), 5);
}

#[test]
fn a_failing_store_fails_the_costing_naming_the_store() {
    let item = user(&unique(80));
    let store = Store {
        fail: true,
        ..Store::default()
    };
    let mut engine =
        CostEngine::new(Items::new(vec![user("x"), item]), ENC).with_store(Some(store));
    let err = engine.costs(&[0, 1]).unwrap_err();
    assert_eq!(err.position, 1);
    assert_eq!(err.field, "(count_store)");
    assert_eq!(err.message, "disk on fire");
}

#[test]
fn an_answer_of_the_wrong_length_is_refused() {
    struct Short;
    impl CountStore for Short {
        fn secret(&self) -> [u8; 16] {
            SECRET
        }
        fn get_many(&mut self, _keys: &[[u8; 16]]) -> Result<Vec<Option<u64>>, StoreError> {
            Ok(Vec::new())
        }
    }
    let mut engine =
        CostEngine::new(Items::new(vec![user(&unique(80))]), ENC).with_store(Some(Short));
    let err = engine.costs(&[0]).unwrap_err();
    assert_eq!(err.field, "(count_store)");
    assert!(
        err.message.contains("0 counts for 1 keys"),
        "{}",
        err.message
    );
}

#[test]
fn each_position_is_fetched_once_per_call() {
    let items = vec![user("a"), user("b"), user("c")];
    let mut engine = CostEngine::<_, NoStore>::new(Items::new(items.clone()), ENC);
    let first = engine.costs(&[0, 2]).unwrap();
    let again = engine.costs(&[2, 1, 0]).unwrap();
    assert_eq!(first, vec![exact(&items[0]), exact(&items[2])]);
    assert_eq!(
        again,
        vec![exact(&items[2]), exact(&items[1]), exact(&items[0])]
    );
    assert_eq!(engine.items().fetched, vec![0, 2, 1]);
}

#[test]
fn an_item_that_cannot_be_costed_is_named() {
    let items = vec![user("a"), json!("not an object")];
    let mut engine = CostEngine::<_, NoStore>::new(Items::new(items), ENC);
    let err = engine.costs(&[0, 1]).unwrap_err();
    assert_eq!((err.position, err.field.as_str()), (1, "(item)"));
    assert!(engine.tokenizer_failure().is_none());
}

#[test]
fn the_memo_keeps_history_costs_across_calls_and_new_input_per_call() {
    let items = vec![user("a"), user("b"), user("new")];
    let mut memo = CostMemo::new();
    {
        let mut engine =
            CostEngine::<_, NoStore>::new(Items::new(items.clone()), ENC).with_memo(&mut memo, 2);
        engine.costs(&[0, 2]).unwrap();
    }
    assert_eq!(memo.encoding(), Some(ENC));
    assert_eq!(memo.len(), 2);
    assert_eq!(memo.get(0), Some(exact(&items[0])));
    assert_eq!(memo.get(1), None);
    assert_eq!(memo.lower_bound(1, ENC), ITEM_OVERHEAD);
    assert_eq!(memo.lower_bound(0, ENC), exact(&items[0]));
    // The next call fetches what the memo lacks only (the new input is not kept).
    let mut engine =
        CostEngine::<_, NoStore>::new(Items::new(items.clone()), ENC).with_memo(&mut memo, 2);
    let costs = engine.costs(&[0, 1, 2]).unwrap();
    assert_eq!(costs, items.iter().map(exact).collect::<Vec<_>>());
    assert_eq!(engine.items().fetched, vec![1, 2]);
    assert_eq!(engine.known(2), Some(exact(&items[2])));
    drop(engine);
    assert_eq!(memo.len(), 2);
}

#[test]
fn an_encoding_switch_drops_the_costs_and_restore_brings_them_back() {
    let items = vec![user(&unique(40)), user(&unique(40))];
    let mut memo = CostMemo::new();
    CostEngine::<_, NoStore>::new(Items::new(items.clone()), ENC)
        .with_memo(&mut memo, 2)
        .costs(&[0, 1])
        .unwrap();
    let before = memo.clone();
    let other = Encoding::Cl100kBase;
    assert_eq!(
        memo.lower_bound(0, other),
        ITEM_OVERHEAD,
        "never another encoding's cost"
    );
    let switched = memo.switch(other, 2);
    assert!(switched.is_some());
    assert_eq!(
        (memo.encoding(), memo.get(0), memo.len()),
        (Some(other), None, 2)
    );
    assert!(memo.switch(other, 2).is_none(), "already there");
    // A failed call under the other encoding puts the memo back as it was.
    memo.restore(switched, 2);
    assert_eq!(memo, before);
    // A memo switched by the engine itself counts under the call's encoding.
    let mut engine =
        CostEngine::<_, NoStore>::new(Items::new(items.clone()), other).with_memo(&mut memo, 2);
    let costs = engine.costs(&[0]).unwrap();
    let expected = other.count(&text_of(&items[0])).unwrap() + ITEM_OVERHEAD;
    assert_eq!(costs, vec![expected]);
    drop(engine);
    assert_eq!(
        (memo.encoding(), memo.get(0), memo.get(1)),
        (Some(other), Some(expected), None)
    );
}

#[test]
fn restore_keeps_only_the_positions_the_index_had() {
    let mut memo = CostMemo::new();
    memo.grow(3, 3, 8);
    let switched = memo.switch(ENC, 3);
    memo.grow(5, 2, 8);
    memo.restore(switched, 3);
    assert_eq!((memo.encoding(), memo.len()), (None, 3));
    memo.grow(5, 2, 8);
    memo.restore(None, 4);
    assert_eq!(memo.len(), 4);
}

#[test]
fn the_snapshot_payload_round_trips_and_damage_is_refused() {
    let items = vec![user("a"), user("b"), user("c")];
    let mut memo = CostMemo::new();
    CostEngine::<_, NoStore>::new(Items::new(items), ENC)
        .with_memo(&mut memo, 3)
        .costs(&[0, 2])
        .unwrap();
    let bytes = postcard::to_allocvec(&memo.payload()).unwrap();
    let back = CostMemo::from_payload(postcard::from_bytes(&bytes).unwrap(), 3).unwrap();
    assert_eq!(back, memo);
    assert_eq!(back.get(1), None);
    assert_eq!(
        CostMemo::from_payload(memo.payload(), 2).unwrap_err(),
        "token costs do not match the items"
    );
    assert_eq!(
        CostMemo::from_payload(CostMemo::new().payload(), 0).unwrap(),
        CostMemo::new()
    );
}

#[test]
fn payload_checks_costs_and_encoding() {
    // The payload's wire form: (rule, scale, Option<String>, Vec<u64>) with costs stored
    // plus one.
    let damaged = |encoding: Option<&str>, costs: Vec<u64>| {
        let n = costs.len();
        let payload = (
            tokens::COST_RULE,
            OpaqueScale::ONE.sixty_fourths(),
            encoding,
            costs,
        );
        let bytes = postcard::to_allocvec(&payload).unwrap();
        CostMemo::from_payload(postcard::from_bytes(&bytes).unwrap(), n)
    };
    assert!(damaged(Some("o200k_base"), vec![0, 5, UNCOUNTED.wrapping_add(1)]).is_ok());
    assert_eq!(
        damaged(Some("o200k_base"), vec![0, 2]).unwrap_err(),
        "item 1 costs less than an item's overhead"
    );
    assert_eq!(
        damaged(Some("nope"), vec![]).unwrap_err(),
        "unknown encoding"
    );
}

#[test]
fn a_tokenizer_failure_is_reported_as_one_with_its_position() {
    let items = vec![user("a"), user(&unique(80))];
    let mut engine = CostEngine::<_, NoStore>::new(Items::new(items), ENC);
    tokens::fail_next_counts(1); // this thread's next count fails
    let err = engine.costs(&[1]).unwrap_err();
    tokens::fail_next_counts(0);
    assert_eq!((err.position, err.field.as_str()), (1, "(item)"));
    let (position, failure) = engine.tokenizer_failure().unwrap();
    assert_eq!(position, 1);
    assert!(
        matches!(failure, tokens::TokenError::Tokenizer(_)),
        "{failure:?}"
    );
    // A failure through the store path (a miss, then counting) is the same failure.
    let mut engine = CostEngine::new(Items::new(vec![user(&unique(80))]), ENC)
        .with_store(Some(Store::default()));
    tokens::fail_next_counts(1);
    let err = engine.costs(&[0]).unwrap_err();
    tokens::fail_next_counts(0);
    assert_eq!(err.position, 0);
    assert!(engine.tokenizer_failure().is_some());
    let (_, link) = engine.finish();
    assert!(
        link.unwrap().1.new_counts.is_empty(),
        "nothing to write for a failed count"
    );
}

/// A reasoning item with `bytes` decoded bytes of random-looking encrypted content.
fn reasoning(bytes: usize, seed: u64) -> Value {
    use base64::Engine;
    let mut state = seed;
    let raw: Vec<u8> = (0..bytes)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect();
    let payload = base64::engine::general_purpose::URL_SAFE.encode(raw);
    json!({"type": "reasoning", "id": format!("rs_{seed}"), "summary": [], "encrypted_content": payload})
}

#[test]
fn a_calibration_scales_the_opaque_part_only_and_is_part_of_the_memo_basis() {
    let items = vec![reasoning(4650, 1), user(&unique(40))];
    let full: Vec<u64> = items
        .iter()
        .map(|i| tokens::item_cost(i, ENC).unwrap().total())
        .collect();
    let opaque = tokens::item_cost(&items[0], ENC).unwrap().opaque;
    assert_eq!(opaque, 1250);
    let half = CostBasis {
        encoding: ENC,
        opaque_scale: OpaqueScale::from_sixty_fourths(32).unwrap(),
    };
    let mut memo = CostMemo::new();
    let costs = CostEngine::<_, NoStore>::new(Items::new(items.clone()), half)
        .with_memo(&mut memo, 2)
        .costs(&[0, 1])
        .unwrap();
    assert_eq!(
        costs,
        vec![full[0] - opaque / 2, full[1]],
        "text is never scaled"
    );
    assert_eq!(memo.basis(), Some(half));
    assert_eq!(memo.lower_bound(0, half), costs[0]);
    assert_eq!(
        memo.lower_bound(0, ENC),
        ITEM_OVERHEAD,
        "another calibration's cost"
    );
    // Back to no calibration: the memo is switched and counts the rule again.
    let costs = CostEngine::<_, NoStore>::new(Items::new(items.clone()), ENC)
        .with_memo(&mut memo, 2)
        .costs(&[0])
        .unwrap();
    assert_eq!(costs, vec![full[0]]);
    assert_eq!((memo.basis(), memo.get(1)), (Some(ENC.into()), None));
    // The calibration travels in the snapshot payload.
    let mut memo = CostMemo::new();
    CostEngine::<_, NoStore>::new(Items::new(items), half)
        .with_memo(&mut memo, 2)
        .costs(&[1])
        .unwrap();
    let bytes = postcard::to_allocvec(&memo.payload()).unwrap();
    let back = CostMemo::from_payload(postcard::from_bytes(&bytes).unwrap(), 2).unwrap();
    assert_eq!(back, memo);
}

#[test]
fn costs_of_another_cost_rule_are_never_reused() {
    // A payload of another rule: the positions stay, the costs do not.
    let rule = |rule: u8, scale: u16| {
        let payload = (rule, scale, Some("o200k_base"), vec![9u64, 0, 12]);
        let bytes = postcard::to_allocvec(&payload).unwrap();
        CostMemo::from_payload(postcard::from_bytes(&bytes).unwrap(), 3)
    };
    let current = rule(tokens::COST_RULE, 64).unwrap();
    assert_eq!(
        (current.get(0), current.get(1), current.counted()),
        (Some(8), None, 2)
    );
    for old in [1, tokens::COST_RULE + 1] {
        let memo = rule(old, 64).unwrap();
        assert_eq!(
            (memo.len(), memo.counted(), memo.basis()),
            (3, 0, None),
            "rule {old}"
        );
    }
    assert_eq!(
        rule(tokens::COST_RULE, 7).unwrap_err(),
        "the calibration of opaque payloads is out of bounds"
    );
    // A rule 1 payload (no rule, no calibration) does not even decode as this one.
    let legacy = postcard::to_allocvec(&(Some("o200k_base"), vec![9u64, 0, 12])).unwrap();
    assert!(postcard::from_bytes::<protoprompt_core::costs::CostPayload>(&legacy).is_err());
    let memo = CostMemo::from_legacy_payload(postcard::from_bytes(&legacy).unwrap(), 3).unwrap();
    assert_eq!((memo.len(), memo.counted()), (3, 0));
}

/// A count store filled under cost rule 1 holds the count of a reasoning item's text with its
/// base64 payload; under rule 2 that text is never asked for, and the item costs its decoded
/// size, whatever the store says.
#[test]
fn a_count_store_of_the_old_rule_is_never_used_for_opaque_payloads() {
    let item = reasoning(3000, 7);
    let payload = item["encrypted_content"].as_str().unwrap().to_string();
    let old_text = format!("encrypted_content: {payload}\nid: rs_7\nsummary: \ntype: reasoning\n");
    let old_count = ENC.count(&old_text).unwrap();
    let output = json!({"type": "function_call_output", "call_id": "c", "output": unique(80)});
    let store = Store::with(&[
        (&old_text, old_count),
        (&text_of(&output), exact(&output) - ITEM_OVERHEAD),
    ]);
    let (costs, store, tally) = run(vec![item.clone(), output.clone()], store, &[0, 1]);
    let rule = tokens::item_cost(&item, ENC).unwrap();
    assert_eq!(costs, vec![rule.total(), exact(&output)]);
    assert!(
        rule.total() * 3 < old_count,
        "{} vs {old_count}",
        rule.total()
    );
    let old_key = tokens::store_key(&SECRET, ENC, &old_text);
    assert!(
        !store.asked.contains(&old_key),
        "the old text is never looked up"
    );
    assert_eq!(tally.hits, 1, "the other item's count is still used");
}

#[test]
fn under_an_estimate_a_calibration_scales_the_whole_cost() {
    let est = Encoding::ClaudeEstimate;
    let items = vec![user(&unique(40)), reasoning(4650, 2)];
    let raw: Vec<u64> = items
        .iter()
        .map(|i| tokens::item_cost(i, est).unwrap().total())
        .collect();
    let scale = OpaqueScale::from_sixty_fourths(88).unwrap(); // x1.375
    let basis = CostBasis::checked(est, scale).unwrap();
    let costs = CostEngine::<_, NoStore>::new(Items::new(items), basis)
        .costs(&[0, 1])
        .unwrap();
    let want: Vec<u64> = raw.iter().map(|&c| scale.apply(c)).collect();
    assert_eq!(costs, want, "text, framing and payloads all scaled");
    // Never below the base encoding's own count: an item keeps at least its overhead.
    let quarter = OpaqueScale::from_sixty_fourths(16).unwrap();
    assert!(CostBasis::checked(est, quarter)
        .unwrap_err()
        .contains("at least 0.5"));
    assert!(
        CostBasis::checked(ENC, quarter).is_ok(),
        "an opaque calibration may"
    );
}

#[test]
fn rule_2_costs_are_reused_except_a_calibrated_estimates() {
    let payload = |rule: u8, scale: u16, enc: &str| {
        let payload = (rule, scale, Some(enc), vec![9u64, 0, 12]);
        let bytes = postcard::to_allocvec(&payload).unwrap();
        CostMemo::from_payload(postcard::from_bytes(&bytes).unwrap(), 3)
    };
    // Rule 2 under an encoding of its own, calibrated or not, and an uncalibrated estimate:
    // the same costs under rule 3.
    for (scale, enc) in [
        (64, "o200k_base"),
        (32, "o200k_base"),
        (64, "claude_estimate"),
    ] {
        let memo = payload(2, scale, enc).unwrap();
        assert_eq!((memo.get(0), memo.counted()), (Some(8), 2), "{enc} {scale}");
    }
    // Rule 2 scaled an estimate's opaque part only: counted again.
    let memo = payload(2, 96, "claude_estimate").unwrap();
    assert_eq!((memo.len(), memo.counted(), memo.basis()), (3, 0, None));
    // Rule 3 keeps it, and refuses a calibration an estimate cannot have.
    assert_eq!(
        payload(tokens::COST_RULE, 96, "claude_estimate")
            .unwrap()
            .counted(),
        2
    );
    assert!(payload(tokens::COST_RULE, 16, "claude_estimate").is_err());
}

#[test]
fn a_count_store_s_answer_is_a_list_of_counts_or_refused() {
    use protoprompt_core::costs::{stored_counts, Stored};
    let shown = || "<answer>".to_string();
    let answer = [Stored::Count(3), Stored::Absent, Stored::Count(u64::MAX)];
    assert_eq!(
        stored_counts(3, Some(answer.into_iter()), shown),
        Ok(vec![Some(3), None, Some(u64::MAX)])
    );
    assert_eq!(stored_counts(0, Some([].into_iter()), shown), Ok(vec![]));
    let refused = "count_store.get_many must return a list of 2 ints >= 0 or None, got <answer>";
    let not_a_count = [Stored::Count(1), Stored::NotACount];
    assert_eq!(
        stored_counts(2, Some(not_a_count.into_iter()), shown),
        Err(refused.to_string())
    );
    let short = [Stored::Count(1)];
    assert_eq!(
        stored_counts(2, Some(short.into_iter()), shown),
        Err(refused.to_string())
    );
    let not_a_list: Option<std::array::IntoIter<Stored, 0>> = None;
    assert_eq!(
        stored_counts(2, not_a_list, shown),
        Err(refused.to_string())
    );
}
