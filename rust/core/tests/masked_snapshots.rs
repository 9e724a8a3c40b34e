//! The masked costs an index has counted travel in its snapshot: a restart finds the same
//! token window as the warm index (the regression this guards against: every tool output at
//! an item's overhead after a restart, a window reaching far back). Trust rules as for the
//! whole costs: bound, versioned ([`MASK_RULE`], [`COST_RULE`]), damaged sections refused
//! whole, masked costs of other rules dropped; a snapshot without masked costs (the layout
//! written before them) still loads, and a reader that does not know them ignores them. The
//! memo stays right across undo and truncation.

use protoprompt_core::costs::{CostEngine, CostMemo, CostPayload, ItemSource, NoStore};
use protoprompt_core::incremental::{GraphIndex, SnapshotError};
use protoprompt_core::indexed::{counted_masked_window_start, IndexedHistory};
use protoprompt_core::items::ItemMeta;
use protoprompt_core::mask::{maskable, MaskedCosts, Masking, MASK_RULE, OTHER_MASK_RULE};
use protoprompt_core::pack::{CostFailure, CostSource};
use protoprompt_core::tokens::{Encoding, COST_RULE, ITEM_OVERHEAD};
use serde_json::{json, Value};

const ENC: Encoding = Encoding::O200kBase;
const EXCERPT: u64 = 64;

fn metas(items: &[Value]) -> Vec<ItemMeta> {
    items
        .iter()
        .map(|v| ItemMeta::from_json(v).unwrap())
        .collect()
}

struct Items(Vec<Value>);

impl ItemSource for Items {
    fn values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        Ok(positions.iter().map(|&p| self.0[p].clone()).collect())
    }
}

fn long(t: usize, lines: usize) -> String {
    (0..lines)
        .map(|i| format!("row {t}.{i}: invoice {} paid {}", i * 37 % 1000, t * 11 + i))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Tool-heavy turns: a question, reasoning (with an encrypted payload: its cost depends on
/// the calibration), calls with long outputs of several shapes, an answer.
fn history(turns: usize) -> Vec<Value> {
    let mut h = Vec::new();
    for t in 0..turns {
        h.push(json!({"role": "user", "content": format!("check batch {t}")}));
        h.push(
            json!({"type": "reasoning", "id": format!("rs_{t}"), "summary": [],
                      "encrypted_content": "gAAAAB".repeat(40)}),
        );
        h.push(json!({"type": "function_call", "call_id": format!("c{t}"),
                      "name": "lookup", "arguments": format!("{{\"batch\": {t}}}")}));
        h.push(
            json!({"type": "function_call_output", "call_id": format!("c{t}"),
                      "output": long(t, 40 + t % 7 * 10)}),
        );
        match t % 3 {
            0 => {
                h.push(json!({"type": "shell_call", "call_id": format!("s{t}"),
                              "action": {"commands": ["ls"]}, "status": "completed"}));
                h.push(
                    json!({"type": "shell_call_output", "call_id": format!("s{t}"),
                              "output": [{"stdout": long(t, 30), "stderr": "",
                                          "outcome": {"type": "exit", "exit_code": 0}}]}),
                );
            }
            1 => h.push(
                json!({"type": "mcp_call", "id": format!("mcp_{t}"), "name": "crm",
                               "server_label": "crm", "arguments": "{}",
                               "status": "completed", "output": long(t, 25)}),
            ),
            _ => {}
        }
        h.push(
            json!({"type": "message", "role": "assistant", "id": format!("msg_{t}"),
                      "status": "completed",
                      "content": [{"type": "output_text", "text": format!("batch {t} ok"),
                                   "annotations": []}]}),
        );
    }
    h
}

fn new_input() -> Vec<ItemMeta> {
    metas(&[json!({"role": "user", "content": "and now?"})])
}

fn masking(excerpt_tokens: u64) -> Option<Masking> {
    Some(Masking {
        excerpt_tokens,
        after_turns: None,
    })
}

/// Count, as the binding's `count_window` does after a turn, what a masked window of
/// `budget` walks over (whole and masked costs, with the kinds).
fn count_window(index: &mut IndexedHistory, items: &[Value], budget: u64, excerpt: u64) {
    let n = index.len();
    let (graph, costs, masks) = index.graph_costs_and_masks();
    let kinds = |p: usize| graph.kind(p);
    let mut engine = CostEngine::<_, NoStore>::new(Items(items.to_vec()), ENC).with_memo(costs, n);
    let mut masked = MaskedCosts::new(&mut engine, ENC, excerpt)
        .with_memo(masks, n)
        .with_kinds(&kinds);
    counted_masked_window_start(graph, &mut masked, budget, 0).unwrap();
}

/// An index of `items` with the costs of a masked window of `budget` counted.
fn warm_index(items: &[Value], budget: u64) -> IndexedHistory {
    let mut index = IndexedHistory::new();
    index.append(metas(items));
    count_window(&mut index, items, budget, EXCERPT);
    index
}

/// The masked cost of every tool output of `items`, counted afresh unit by unit.
fn true_masked(items: &[Value]) -> Vec<Option<u64>> {
    let mut index = IndexedHistory::new();
    index.append(metas(items));
    let n = index.len();
    let mut out = vec![None; n];
    let (graph, costs, _) = index.graph_costs_and_masks();
    let kinds = |p: usize| graph.kind(p);
    let mut engine = CostEngine::<_, NoStore>::new(Items(items.to_vec()), ENC).with_memo(costs, n);
    let mut masked = MaskedCosts::new(&mut engine, ENC, EXCERPT).with_kinds(&kinds);
    for unit in &graph.graph().units {
        let sent = masked.masked_costs(&unit.members).unwrap();
        for (&p, c) in unit.members.iter().zip(sent) {
            if maskable(graph.kind(p)) {
                out[p] = Some(c);
            }
        }
    }
    out
}

fn counted_masked(index: &IndexedHistory) -> Vec<(usize, u64)> {
    (0..index.len())
        .filter_map(|p| index.masked_costs().get(p, ENC, EXCERPT).map(|c| (p, c)))
        .collect()
}

const BUDGETS: [u64; 5] = [1_500, 3_000, 6_000, 12_000, 24_000];

#[test]
fn a_restart_from_a_snapshot_finds_the_warm_window() {
    let items = history(40);
    for budget in BUDGETS {
        let index = warm_index(&items, budget);
        let counted = counted_masked(&index);
        assert!(!counted.is_empty(), "budget {budget}");
        // The memo holds tool outputs only, at their true masked costs.
        let truth = true_masked(&items);
        for &(p, c) in &counted {
            assert_eq!(Some(c), truth[p], "budget {budget}, position {p}");
        }

        let bytes = index.snapshot(b"db/session/rows");
        let loaded = IndexedHistory::from_snapshot(&bytes, b"db/session/rows").unwrap();
        assert!(
            loaded.masked_costs() == index.masked_costs(),
            "budget {budget}"
        );
        assert_eq!(loaded.costs(), index.costs());
        assert_eq!(loaded.snapshot_costs_dropped(), None);
        assert!(
            loaded.snapshot(b"db/session/rows") == bytes,
            "byte for byte"
        );
        let warm = index.window_masked(&new_input(), budget, ENC, masking(EXCERPT));
        let restarted = loaded.window_masked(&new_input(), budget, ENC, masking(EXCERPT));
        assert_eq!(restarted, warm, "budget {budget}");

        // What a restart found before masked costs were stored: the masked window of an
        // index with the whole costs alone reaches further back.
        let costs_only = index
            .graph()
            .to_snapshot(&index.costs().payload(), b"db/session/rows");
        let old = IndexedHistory::from_snapshot(&costs_only, b"db/session/rows").unwrap();
        assert_eq!(old.masked_costs().counted(), (0, 0));
        let old_start = old
            .window_masked(&new_input(), budget, ENC, masking(EXCERPT))
            .start;
        assert!(old_start <= warm.start, "budget {budget}");
        if budget == 6_000 {
            assert!(old_start < warm.start, "the restart regression");
        }
        // Counted under another excerpt size or encoding: not this window's bounds.
        for (enc, excerpt) in [(ENC, 32), (Encoding::Cl100kBase, EXCERPT)] {
            assert_eq!(
                loaded.window_masked(&new_input(), budget, enc, masking(excerpt)),
                old.window_masked(&new_input(), budget, enc, masking(excerpt)),
            );
        }
    }
}

/// A snapshot written before masked costs were stored (the attached costs alone, no
/// extension) loads with its costs and no masked cost; a reader that knows nothing of masked
/// costs (that layout's: the payload's attached costs, nothing after) reads a new snapshot
/// as that snapshot.
#[test]
fn snapshots_with_and_without_masked_costs_load_in_both_readers() {
    let items = history(30);
    let index = warm_index(&items, 6_000);
    let old_format = index.graph().to_snapshot(&index.costs().payload(), b"rows");
    let loaded = IndexedHistory::from_snapshot(&old_format, b"rows").unwrap();
    assert_eq!(loaded.costs(), index.costs());
    assert_eq!(loaded.masked_costs().counted(), (0, 0));
    assert_eq!(loaded.masked_costs().key(), None);
    assert_eq!(loaded.snapshot_costs_dropped(), None);
    assert_eq!(
        IndexedHistory::from_snapshot(&old_format, b"other rows").unwrap_err(),
        SnapshotError::Unbound
    );

    let bytes = index.snapshot(b"rows");
    let (graph, payload) = GraphIndex::from_snapshot::<CostPayload>(&bytes, b"rows").unwrap();
    assert_eq!(graph.len(), index.len());
    assert_eq!(
        &CostMemo::from_payload(payload, graph.len()).unwrap(),
        index.costs()
    );
    let (_, _, extension) =
        GraphIndex::from_snapshot_extended::<CostPayload>(&bytes, b"rows").unwrap();
    assert_eq!(&extension[..2], &[MASK_RULE, COST_RULE]);
    let (_, _, none) =
        GraphIndex::from_snapshot_extended::<CostPayload>(&old_format, b"rows").unwrap();
    assert!(none.is_empty());
}

/// A snapshot of `index` with `section` as its masked costs.
fn with_section(index: &IndexedHistory, section: &[u8]) -> Vec<u8> {
    index
        .graph()
        .to_snapshot_extended(&index.costs().payload(), section, b"s")
}

/// A masked section as [`protoprompt_core::mask::MaskPayload`] lays it out.
fn section(rules: (u8, u8), encoding: Option<&str>, excerpt: u64, costs: &[u64]) -> Vec<u8> {
    postcard::to_stdvec(&(rules.0, rules.1, encoding, excerpt, costs)).unwrap()
}

/// A small index with masked costs, its masked costs as a section stores them (plus one),
/// and the positions counted.
fn sectioned() -> (IndexedHistory, Vec<u64>, Vec<(usize, u64)>) {
    let items = history(12);
    let index = warm_index(&items, 2_000);
    let counted = counted_masked(&index);
    assert!(!counted.is_empty());
    let plus_one: Vec<u64> = (0..index.len())
        .map(|p| {
            index
                .masked_costs()
                .get(p, ENC, EXCERPT)
                .map_or(0, |c| c + 1)
        })
        .collect();
    (index, plus_one, counted)
}

#[test]
fn masked_sections_of_other_rules_or_versions_are_dropped_or_ignored() {
    let (index, plus_one, _) = sectioned();
    let rules = (MASK_RULE, COST_RULE);

    // The layout this version writes, written by hand: loaded as written.
    let ok = with_section(
        &index,
        &section(rules, Some("o200k_base"), EXCERPT, &plus_one),
    );
    assert!(ok == index.snapshot(b"s"));
    // Followed by data of a later version: ignored.
    let mut later = section(rules, Some("o200k_base"), EXCERPT, &plus_one);
    later.extend_from_slice(b"a later section");
    let loaded = IndexedHistory::from_snapshot(&with_section(&index, &later), b"s").unwrap();
    assert!(loaded.masked_costs() == index.masked_costs());

    for other in [
        (MASK_RULE + 1, COST_RULE),
        (MASK_RULE, COST_RULE + 1),
        (0, 0),
    ] {
        let bytes = with_section(&index, &section(other, Some("nope"), 1, &[7; 999]));
        let loaded = IndexedHistory::from_snapshot(&bytes, b"s").unwrap();
        assert_eq!(loaded.masked_costs().counted(), (0, 0), "{other:?}");
        assert_eq!(loaded.costs(), index.costs(), "{other:?}");
        assert_eq!(loaded.snapshot_costs_dropped(), Some(OTHER_MASK_RULE));
    }
    // An empty memo's section (nothing counted masked yet).
    let empty =
        IndexedHistory::from_snapshot(&with_section(&index, &section(rules, None, 0, &[])), b"s")
            .unwrap();
    assert_eq!(empty.masked_costs().key(), None);
}

#[test]
fn damaged_masked_sections_are_refused_whole() {
    let (index, plus_one, counted) = sectioned();
    let rules = (MASK_RULE, COST_RULE);
    let user = 0; // a user message: never a tool output
    let (output, cost) = counted[0];
    let whole = index.costs().get(output).unwrap();
    let set = |p: usize, v: u64| {
        let mut c = plus_one.clone();
        c[p] = v;
        c
    };
    let damaged: Vec<(Vec<u8>, &str)> = vec![
        (vec![MASK_RULE], "masked costs cannot be decoded"),
        (
            section(rules, Some("o200k_base"), EXCERPT, &plus_one)[..20].to_vec(),
            "masked costs cannot be decoded",
        ),
        (
            section(rules, Some("no_such_encoding"), EXCERPT, &plus_one),
            "masked costs: unknown encoding",
        ),
        (
            section(rules, Some("o200k_base"), 15, &plus_one),
            "masked costs: excerpt_tokens out of bounds",
        ),
        (
            section(rules, None, EXCERPT, &plus_one),
            "masked costs without an encoding",
        ),
        (
            section(
                rules,
                Some("o200k_base"),
                EXCERPT,
                &[plus_one.clone(), vec![0]].concat(),
            ),
            "masked costs do not match the items",
        ),
        (
            section(rules, Some("o200k_base"), EXCERPT, &set(user, 50)),
            "item 0 has a masked cost but is not a tool output",
        ),
        (
            section(
                rules,
                Some("o200k_base"),
                EXCERPT,
                &set(output, ITEM_OVERHEAD),
            ),
            "masked cost is out of bounds",
        ),
        (
            section(rules, Some("o200k_base"), EXCERPT, &set(output, whole + 2)),
            "masked cost is out of bounds",
        ),
    ];
    for (bad, why) in damaged {
        let loaded = IndexedHistory::from_snapshot(&with_section(&index, &bad), b"s");
        let err = loaded.map(|_| ()).expect_err(why);
        assert!(matches!(err, SnapshotError::Damaged(_)), "{why}: {err}");
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
    // The bounds are inclusive: a masked cost equal to the whole cost (nothing to save).
    let equal = section(rules, Some("o200k_base"), EXCERPT, &set(output, whole + 1));
    let loaded = IndexedHistory::from_snapshot(&with_section(&index, &equal), b"s").unwrap();
    assert_eq!(loaded.masked_costs().get(output, ENC, EXCERPT), Some(whole));
    assert!(cost <= whole);
}

/// A failed call that switched the masked costs to another excerpt size (and counted some)
/// is undone to the masked costs of before; an undo after counting new positions drops
/// theirs; a truncation (`pop_item`) keeps the masked costs of the positions left, which
/// are those of the shorter history.
#[test]
fn undo_and_truncate_keep_the_masked_costs_true() {
    let items = history(30);
    let mut index = warm_index(&items, 6_000);
    // Every whole cost counted (those a failed call counts would stay: they are true).
    let n = index.len();
    let (_, costs) = index.graph_and_costs();
    let mut engine = CostEngine::<_, NoStore>::new(Items(items.to_vec()), ENC).with_memo(costs, n);
    engine.costs(&(0..n).collect::<Vec<_>>()).unwrap();
    let before = index.snapshot(b"s");
    let masked_before = index.masked_costs().clone();

    let mut mark = index.mark();
    index.switch_masks(ENC, 32, &mut mark);
    count_window(&mut index, &items, 6_000, 32);
    assert_eq!(index.masked_costs().key(), Some((ENC, 32)));
    index.undo(mark);
    assert!(index.masked_costs() == &masked_before);
    assert!(index.snapshot(b"s") == before, "byte for byte");

    // Appended items counted masked, then undone: back to the memo of before.
    let more = history(34);
    let mark = index.mark();
    index.append(metas(&more[items.len()..]));
    count_window(&mut index, &more, 3_000, EXCERPT);
    assert!(counted_masked(&index)
        .iter()
        .any(|&(p, _)| p >= items.len()));
    index.undo(mark);
    assert!(index.snapshot(b"s") == before);

    // A truncation in the middle of a turn (a pop), then other items appended in its
    // place: every masked cost kept is the true one of the new history.
    let cut = items.len() - 3;
    index.truncate(cut);
    assert!(counted_masked(&index).iter().all(|&(p, _)| p < cut));
    let mut replaced = items[..cut].to_vec();
    replaced.extend(history(45)[items.len()..].iter().cloned());
    index.append(metas(&replaced[cut..]));
    count_window(&mut index, &replaced, 24_000, EXCERPT);
    let truth = true_masked(&replaced);
    let counted = counted_masked(&index);
    assert!(counted.len() > 10);
    for (p, c) in counted {
        assert_eq!(Some(c), truth[p], "position {p}");
    }
}
