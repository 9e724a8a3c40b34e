//! `fit_output` on drawn tool outputs: whatever the shape (one text, many small parts,
//! parts with images and files, shell chunks, nested structures) and the target, a cut copy
//! costs at most the target and exactly what it says, keeps the output's shape, never loses
//! the first part when anything of the output is kept, and a larger target never fails where
//! a smaller one fits.

use proptest::prelude::{prop_assert, prop_assert_eq, proptest, ProptestConfig, Strategy};
use proptest::{collection, prop_oneof};
use protoprompt_core::tokens::{item_cost, Encoding};
use protoprompt_core::truncate::fit_output;
use serde_json::{json, Value};

const ENC: Encoding = Encoding::O200kBase;

fn words(n: usize, seed: usize) -> String {
    const W: [&str; 8] = [
        "alpha", "beta", "契約", "gamma", "🙂", "delta", "1234", "epsilon",
    ];
    (0..n)
        .map(|i| W[(i * 7 + seed) % W.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn part() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (1usize..400, 0usize..8).prop_map(|(n, s)| json!({"type": "input_text", "text": words(n, s)})),
        1 => proptest::bool::ANY.prop_map(|low| json!({"type": "input_image",
            "image_url": "https://example.com/a.png", "detail": if low { "low" } else { "high" }})),
        1 => proptest::strategy::Just(json!({"type": "input_file", "file_id": "file_1"})),
    ]
}

fn output() -> impl Strategy<Value = Value> {
    prop_oneof![
        (1usize..4000, 0usize..8)
            .prop_map(|(n, s)| json!({"type": "function_call_output", "call_id": "c", "output": words(n, s)})),
        collection::vec(part(), 1..120)
            .prop_map(|parts| json!({"type": "function_call_output", "call_id": "c", "output": parts})),
        collection::vec((1usize..60, 0usize..8), 1..200).prop_map(|chunks| {
            let chunks: Vec<Value> = chunks
                .into_iter()
                .map(|(n, s)| json!({"stdout": words(n, s), "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}))
                .collect();
            json!({"type": "shell_call_output", "call_id": "s", "output": chunks})
        }),
    ]
}

fn cost(v: &Value) -> u64 {
    item_cost(v, ENC).unwrap().total()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn cut_copies_fit_say_their_cost_and_keep_their_shape(item in output(), share in 0.0f64..1.2) {
        let full = cost(&item);
        let target = ((full as f64) * share) as u64;
        match fit_output(&item, target, ENC).unwrap() {
            Some(fit) => {
                prop_assert!(fit.tokens <= target);
                prop_assert_eq!(fit.tokens, cost(&fit.item));
                prop_assert_eq!(&fit.item["type"], &item["type"]);
                prop_assert_eq!(&fit.item["call_id"], &item["call_id"]);
                if full <= target {
                    prop_assert_eq!(&fit.item, &item);
                }
                if let (Some(cut), Some(orig)) = (fit.item["output"].as_array(), item["output"].as_array()) {
                    prop_assert!(!cut.is_empty());
                    prop_assert_eq!(cut.len(), orig.len() - fit.parts_removed + usize::from(fit.parts_removed > 0));
                    for chunk in cut.iter().filter(|c| c.get("outcome").is_some()) {
                        prop_assert!(chunk["stdout"].is_string() && chunk["stderr"].is_string());
                    }
                }
                // More room never fails.
                let more = fit_output(&item, target + target / 3 + 50, ENC).unwrap();
                prop_assert!(more.is_some());
            }
            None => {
                // Only when the room is below what the markers themselves need.
                prop_assert!(target < 80, "refused at {} of {}", target, full);
            }
        }
    }
}
