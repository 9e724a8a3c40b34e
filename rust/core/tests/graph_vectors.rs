//! The 42 test vectors of docs/item-graph.md §15 (`tests/data/item-graph-vectors.json`):
//! units, invalid units with reasons, mandatory history and the error flag must match exactly.

use std::collections::BTreeSet;
use std::time::Instant;

use protoprompt_core::{build_graph, Graph, ItemMeta, RawItem};
use serde_json::{json, Value};

const VECTORS: &str = include_str!("data/item-graph-vectors.json");

fn metas(items: &Value, what: &str, id: &str) -> Vec<ItemMeta> {
    let Some(list) = items.as_array() else {
        panic!("{id}: {what} is not an array")
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| ItemMeta::from_json(v).unwrap_or_else(|e| panic!("{id}: {what}[{i}]: {e}")))
        .collect()
}

fn label(g: &Graph, pos: usize) -> String {
    if pos < g.n_history {
        format!("h{pos}")
    } else {
        format!("n{}", pos - g.n_history)
    }
}

fn labels(g: &Graph, members: &[usize]) -> Vec<String> {
    members.iter().map(|&p| label(g, p)).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn all_spec_vectors() {
    let doc: Value = serde_json::from_str(VECTORS).expect("vectors parse");
    let vectors = doc["vectors"].as_array().expect("vectors array");
    assert_eq!(vectors.len(), 42);
    let mut failures = Vec::new();
    for v in vectors {
        let id = v["id"].as_str().unwrap_or("?");
        let h = metas(&v["history"], "history", id);
        let n = metas(&v["new_input"], "new_input", id);
        let g = build_graph(&h, &n);
        let exp = &v["expected"];

        // Structural invariants.
        assert_eq!(g.n_history, h.len());
        assert_eq!(g.unit_of.len(), h.len() + n.len());
        for (ui, u) in g.units.iter().enumerate() {
            assert!(
                u.members.windows(2).all(|w| w[0] < w[1]),
                "{id}: members sorted"
            );
            for &m in &u.members {
                assert_eq!(g.unit_of[m], ui, "{id}: unit_of");
            }
            for p in &u.problems {
                assert!(
                    u.members.contains(&p.position),
                    "{id}: problem inside its unit"
                );
            }
        }
        assert!(
            g.units
                .windows(2)
                .all(|w| w[0].members[0] < w[1].members[0]),
            "{id}: units ordered by first member"
        );

        let units: Vec<Vec<String>> = g.units.iter().map(|u| labels(&g, &u.members)).collect();
        let exp_units: Vec<Vec<String>> = exp["units"]
            .as_array()
            .map(|a| a.iter().map(strings).collect())
            .unwrap_or_default();
        if units != exp_units {
            failures.push(format!("{id}: units {units:?} != expected {exp_units:?}"));
        }

        let invalid: Vec<(Vec<String>, Vec<String>)> = g
            .units
            .iter()
            .filter(|u| !u.is_valid())
            .map(|u| {
                let reasons = u.problems.iter().map(|p| p.reason.message().to_string());
                (labels(&g, &u.members), reasons.collect())
            })
            .collect();
        let exp_invalid: Vec<(Vec<String>, Vec<String>)> = exp["invalid_units"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|u| (strings(&u["unit"]), strings(&u["reasons"])))
                    .collect()
            })
            .unwrap_or_default();
        let as_sets = |x: &[(Vec<String>, Vec<String>)]| -> Vec<(Vec<String>, BTreeSet<String>)> {
            x.iter()
                .map(|(u, r)| (u.clone(), r.iter().cloned().collect()))
                .collect()
        };
        if as_sets(&invalid) != as_sets(&exp_invalid) {
            failures.push(format!(
                "{id}: invalid {invalid:?} != expected {exp_invalid:?}"
            ));
        } else if invalid != exp_invalid {
            failures.push(format!(
                "{id}: reason order {invalid:?} != expected {exp_invalid:?}"
            ));
        }

        let mandatory = labels(&g, &g.mandatory_history());
        if mandatory != strings(&exp["mandatory_history"]) {
            failures.push(format!("{id}: mandatory {mandatory:?}"));
        }
        let error = !g.new_input_errors().is_empty();
        if Some(error) != exp["error"].as_bool() {
            failures.push(format!("{id}: error flag {error}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn raw_item_errors() {
    let e = RawItem::from_json(&json!("hello")).unwrap_err();
    assert_eq!(e.field, "item");
    let e = RawItem::from_json(&json!(null)).unwrap_err();
    assert_eq!(e.field, "item");
    let e = RawItem::from_json(&json!({"type":"function_call","id":42})).unwrap_err();
    assert_eq!(e.field, "id");
    assert!(e.to_string().contains("id"));
    let e = RawItem::from_json(&json!({"type":"function_call","call_id":"c","caller":[1]}))
        .unwrap_err();
    assert_eq!(e.field, "caller");
    let e = RawItem::from_json(&json!({"type":"function_call","caller":{"caller_id":true}}))
        .unwrap_err();
    assert_eq!(e.field, "caller.caller_id");
    let err: Box<dyn std::error::Error> = Box::new(e);
    assert!(err.to_string().starts_with("caller.caller_id"));
}

#[test]
fn position_labels_and_helpers() {
    let h = vec![ItemMeta::from_json(&json!({"type":"function_call","call_id":"c"})).unwrap()];
    let n =
        vec![ItemMeta::from_json(&json!({"type":"function_call_output","call_id":"c"})).unwrap()];
    let g = build_graph(&h, &n);
    assert_eq!(g.position_label(0), "history[0]");
    assert_eq!(g.position_label(1), "new_input[0]");
    assert_eq!(g.mandatory_history(), vec![0]);
    assert!(g.new_input_errors().is_empty());
    assert_eq!(g.units.len(), 1);
    assert!(g.units[0].contains_new && g.units[0].is_valid() && !g.units[0].is_input_only());
}

/// A 100k-item synthetic session: turns of user, reasoning, calls (some anonymous tool
/// search, some programs), outputs, assistant answers, plus a few broken turns.
#[test]
fn large_history_builds_fast() {
    let mut raw: Vec<Value> = Vec::new();
    let mut turn = 0usize;
    while raw.len() < 100_000 {
        turn += 1;
        raw.push(json!({"role":"user","content":"q"}));
        raw.push(json!({"type":"reasoning","id":format!("rs_{turn}"),"summary":[],"encrypted_content":"e"}));
        match turn % 4 {
            0 => {
                raw.push(json!({"type":"tool_search_call","id":format!("ts_{turn}"),"status":"completed"}));
                raw.push(json!({"type":"tool_search_output","id":format!("tso_{turn}"),"status":"completed"}));
            }
            1 => {
                let p = format!("p{turn}");
                let c = format!("pc{turn}");
                let caller = json!({"type":"program","caller_id":p});
                raw.push(json!({"type":"program","id":format!("pg_{turn}"),"call_id":p}));
                raw.push(json!({"type":"function_call","call_id":c,"caller":caller}));
                raw.push(json!({"type":"function_call_output","call_id":c,"caller":caller}));
                raw.push(json!({"type":"program_output","call_id":p,"status":"completed"}));
            }
            _ => {}
        }
        for k in 0..3 {
            raw.push(json!({"type":"function_call","call_id":format!("c{turn}_{k}"),"id":format!("fc_{turn}_{k}")}));
        }
        for k in 0..3 {
            if !turn.is_multiple_of(97) || k != 1 {
                raw.push(json!({"type":"function_call_output","call_id":format!("c{turn}_{k}")}));
            }
        }
        raw.push(json!({"type":"message","role":"assistant","id":format!("msg_{turn}"),"status":"completed","content":[]}));
    }
    let history: Vec<ItemMeta> = raw
        .iter()
        .map(|v| ItemMeta::from_json(v).unwrap())
        .collect();
    let new_input = vec![ItemMeta::from_json(&json!({"role":"user","content":"next"})).unwrap()];
    let t = Instant::now();
    let g = build_graph(&history, &new_input);
    let elapsed = t.elapsed();
    eprintln!(
        "build_graph: {} items, {} units in {elapsed:?}",
        g.unit_of.len(),
        g.units.len()
    );
    let invalid = g.units.iter().filter(|u| !u.is_valid()).count();
    assert_eq!(invalid, turn / 97);
    assert!(g.new_input_errors().is_empty());
    assert!(g.mandatory_history().is_empty());
}
