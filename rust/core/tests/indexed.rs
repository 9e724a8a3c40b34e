//! The index's bookkeeping ([`IndexedHistory`]): an undo puts back everything (items, graph,
//! kinds, costs and their encoding, memory), a kept decision report is detached before any
//! change and reads the same rows after it, and a snapshot carries the costs and kinds.

use std::sync::{Arc, Mutex};

use protoprompt_core::costs::{CostEngine, CostMemo, ItemSource, NoStore};
use protoprompt_core::decisions::{DecisionRows, Row};
use protoprompt_core::incremental::{GraphIndex, SnapshotError};
use protoprompt_core::indexed::{counted_window_start, lock, IndexedHistory};
use protoprompt_core::items::ItemMeta;
use protoprompt_core::pack::{CostFailure, CostSource, Decision};
use protoprompt_core::tokens::Encoding;
use serde_json::{json, Value};

fn metas(items: &[Value]) -> Vec<ItemMeta> {
    items
        .iter()
        .map(|v| ItemMeta::from_json(v).unwrap())
        .collect()
}

/// A history of `turns` turns: a question, a call, most calls answered, some orphan outputs.
fn history(turns: usize, tag: &str) -> Vec<Value> {
    let mut h = Vec::new();
    for i in 0..turns {
        h.push(json!({"role":"user","content":format!("{tag} q{i}")}));
        h.push(json!({"type":"function_call","call_id":format!("{tag}c{i}"),"name":"f","arguments":"{}"}));
        if i % 4 != 0 {
            h.push(
                json!({"type":"function_call_output","call_id":format!("{tag}c{i}"),"output":"ok"}),
            );
        }
        if i % 5 == 0 {
            h.push(
                json!({"type":"function_call_output","call_id":format!("{tag}x{i}"),"output":"?"}),
            );
        }
    }
    h
}

struct Items(Vec<Value>);

impl ItemSource for Items {
    fn values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        Ok(positions.iter().map(|&p| self.0[p].clone()).collect())
    }
}

/// Count the costs of `positions` into the index's memo under `encoding`.
fn count(index: &mut IndexedHistory, items: &[Value], encoding: Encoding, positions: &[usize]) {
    let n = index.len();
    let (_, memo) = index.graph_and_costs();
    let mut engine =
        CostEngine::<_, NoStore>::new(Items(items.to_vec()), encoding).with_memo(memo, n);
    engine.costs(positions).unwrap();
}

/// Everything an index holds that a user can observe, memory included.
#[derive(Debug, PartialEq, Eq)]
struct State {
    snapshot: Vec<u8>,
    kinds: Vec<u8>,
    names: Vec<&'static str>,
    costs: CostMemo,
    costs_capacity: usize,
    /// Bytes the kinds hold (the index's total less the graph's and the costs').
    kinds_bytes: usize,
    graph_bytes: usize,
}

fn state(index: &IndexedHistory) -> State {
    State {
        snapshot: index.snapshot(b"b"),
        kinds: index.kinds().to_vec(),
        names: index.kind_names().names().to_vec(),
        costs: index.costs().clone(),
        costs_capacity: index.costs().capacity(),
        kinds_bytes: index.heap_bytes() - index.graph().heap_bytes() - index.costs().heap_bytes(),
        graph_bytes: index.graph().heap_bytes(),
    }
}

/// `a == b`, field by field (a snapshot is too long to print).
fn assert_same(a: &State, b: &State, what: &str) {
    assert_same_but_graph_memory(a, b, what);
    assert_eq!(a.graph_bytes, b.graph_bytes, "{what}: graph bytes");
}

/// `a == b` but for the graph's memory, which may be less (units rebuilt by an undo hold
/// exactly their members, where units built in chunks may have held some room).
fn assert_same_but_graph_memory(a: &State, b: &State, what: &str) {
    assert!(a.graph_bytes <= b.graph_bytes, "{what}: graph bytes grew");
    assert!(a.snapshot == b.snapshot, "{what}: the snapshots differ");
    assert!(a.kinds == b.kinds, "{what}: the kinds differ");
    assert_eq!(a.names, b.names, "{what}: kind names");
    assert!(a.costs == b.costs, "{what}: the costs differ");
    assert_eq!(a.costs_capacity, b.costs_capacity, "{what}: costs capacity");
    assert_eq!(a.kinds_bytes, b.kinds_bytes, "{what}: kinds bytes");
}

fn rows(r: &Mutex<DecisionRows>) -> Vec<(Row, (usize, Decision))> {
    let r = lock(r);
    (0..r.rows())
        .map(|u| (r.row(u), r.size_and_untouched(u)))
        .collect()
}

/// An index of 20 turns with some costs counted under o200k.
fn counted_index() -> (IndexedHistory, Vec<Value>) {
    let items = history(20, "a");
    let mut index = IndexedHistory::new();
    index.append(metas(&items));
    count(&mut index, &items, Encoding::O200kBase, &[0, 1, 2, 7, 8]);
    assert_eq!(index.costs().encoding(), Some(Encoding::O200kBase));
    (index, items)
}

#[test]
fn kinds_and_costs_cover_every_appended_position() {
    let (mut index, items) = counted_index();
    assert_eq!(index.kinds().len(), items.len());
    assert_eq!(index.costs().len(), items.len());
    let names = index.kind_names().names();
    for (p, item) in metas(&items).iter().enumerate() {
        assert_eq!(
            names[index.kinds()[p] as usize],
            item.kind_name(),
            "position {p}"
        );
    }
    assert!(index.costs().get(0).is_some());
    assert_eq!(index.costs().get(3), None);
    index.truncate(5);
    assert_eq!(
        (index.len(), index.kinds().len(), index.costs().len()),
        (5, 5, 5)
    );
    index.clear();
    assert_eq!(
        (index.len(), index.kinds().len(), index.costs().len()),
        (0, 0, 0)
    );
}

/// A failed call that appended items (with a kind never seen before), switched the costs to
/// another encoding and counted some is undone to exactly the index of before.
#[test]
fn undo_restores_items_kinds_costs_and_memory_byte_for_byte() {
    let (mut index, items) = counted_index();
    let before = state(&index);

    let mut mark = index.mark();
    index.switch_costs(Encoding::Cl100kBase, &mut mark);
    assert_eq!(index.costs().encoding(), Some(Encoding::Cl100kBase));
    assert_eq!(index.costs().get(0), None);
    let mut more = history(300, "b");
    more.push(json!({"type":"reasoning","id":"rs1","summary":[]}));
    let mut all = items.clone();
    all.extend(more.iter().cloned());
    index.append(metas(&more));
    count(
        &mut index,
        &all,
        Encoding::Cl100kBase,
        &[0, items.len(), all.len() - 1],
    );
    assert!(index.kind_names().names().contains(&"reasoning"));
    assert!(state(&index) != before);

    index.undo(mark);
    assert_same(&state(&index), &before, "undo");
    assert!(!index.kind_names().names().contains(&"reasoning"));

    // The undone index goes on as one that never saw the failed call.
    let mut fresh = counted_index().0;
    index.append(metas(&more));
    fresh.append(metas(&more));
    assert!(index.snapshot(b"b") == fresh.snapshot(b"b"));
    assert_eq!(index.kinds(), fresh.kinds());
}

/// An undo with no switch drops the appended positions and their costs; a cost the failed
/// call counted for an earlier position is that item's true cost under the same encoding,
/// and stays.
#[test]
fn undo_without_a_switch_drops_the_appended_costs() {
    let (mut index, items) = counted_index();
    let before = state(&index);
    let mark = index.mark();
    let more = history(30, "c");
    let mut all = items.clone();
    all.extend(more.iter().cloned());
    index.append(metas(&more));
    count(
        &mut index,
        &all,
        Encoding::O200kBase,
        &[items.len(), all.len() - 1],
    );
    index.undo(mark);
    assert_same(&state(&index), &before, "undo of new costs");

    let mark = index.mark();
    index.append(metas(&more));
    count(&mut index, &all, Encoding::O200kBase, &[3, items.len()]);
    index.undo(mark);
    assert_eq!(index.costs().len(), items.len());
    let mut alone = counted_index().0;
    count(&mut alone, &items, Encoding::O200kBase, &[3]);
    assert_same(&state(&index), &state(&alone), "undo keeps an earlier cost");
}

/// A two-step append (the binding's pipelined classify: kinds on one thread, graph on
/// another) gives the index a one-step append gives; stopped halfway (kinds noted for more
/// items than the graph got), an undo repairs it.
#[test]
fn appender_in_chunks_equals_append_and_a_half_done_one_is_undone() {
    let items = history(200, "d");
    let all = metas(&items);
    let mut whole = IndexedHistory::new();
    whole.append(all.clone());

    let mut chunked = IndexedHistory::new();
    {
        let (graph, mut notes) = chunked.appender();
        let mut first = true;
        let mut sent = 0;
        for chunk in all.chunks(64) {
            sent += chunk.len();
            let rest = all.len() - sent;
            notes.note(chunk, rest);
            graph.extend(chunk.to_vec());
            if std::mem::take(&mut first) && rest > 0 {
                graph.reserve(rest);
            }
        }
    }
    assert!(chunked.snapshot(b"") == whole.snapshot(b""));
    assert_eq!(chunked.kinds(), whole.kinds());
    assert_eq!(chunked.costs(), whole.costs());

    let before = state(&chunked);
    let mark = chunked.mark();
    {
        let more = metas(&history(50, "e"));
        let (graph, mut notes) = chunked.appender();
        notes.note(&more[..40], more.len() - 40);
        notes.note(&more[40..], 0);
        graph.extend(more[..40].to_vec());
    }
    chunked.undo(mark);
    assert_same_but_graph_memory(&state(&chunked), &before, "half-done append");
}

/// A decision report kept by the caller is detached before each kind of change (append,
/// undo, truncate, clear): the change never copies the graph, and the report reads the rows
/// it read before.
#[test]
fn a_kept_report_is_detached_before_a_change_and_reads_the_same_rows() {
    type Change = fn(&mut IndexedHistory);
    let changes: [(&str, Change); 5] = [
        ("append", |i| i.append(metas(&history(2, "z")))),
        ("undo", |i| {
            let mut mark = i.mark();
            i.switch_costs(Encoding::Cl100kBase, &mut mark);
            i.append(metas(&history(2, "z")));
            i.undo(mark);
        }),
        ("truncate", |i| i.truncate(10)),
        ("clear", IndexedHistory::clear),
        ("release", IndexedHistory::release_results),
    ];
    for (what, change) in changes {
        let (mut index, _) = counted_index();
        let new_input = metas(&[json!({"role":"user","content":"next"})]);
        let tail = index.graph().tail(&new_input);
        let report = index.decision_rows(Some(tail));
        let dropped = index.decision_rows(None);
        drop(dropped);
        let read = rows(&report);
        assert!(read.iter().any(|(r, _)| !r.problems.is_empty()));
        assert!(lock(&report).is_shared());

        change(&mut index);
        assert!(!lock(&report).is_shared(), "{what}");
        assert_eq!(rows(&report), read, "{what}");
        assert_eq!(index.graph_copies(), 0, "{what}");
        index.append(metas(&history(1, "y")));
        assert_eq!(index.graph_copies(), 0, "{what}");
        assert_eq!(rows(&report), read, "{what}");
        assert_eq!(Arc::strong_count(&report), 1, "{what}");
    }
}

#[test]
fn a_snapshot_round_trip_keeps_items_kinds_and_costs() {
    let (index, _) = counted_index();
    let bytes = index.snapshot(b"session 1");
    let loaded = IndexedHistory::from_snapshot(&bytes, b"session 1").unwrap();
    assert!(loaded.snapshot(b"session 1") == bytes);
    assert_eq!(loaded.kinds(), index.kinds());
    assert_eq!(loaded.kind_names(), index.kind_names());
    assert_eq!(loaded.costs(), index.costs());
    assert_eq!(loaded.costs().encoding(), Some(Encoding::O200kBase));

    assert_eq!(
        IndexedHistory::from_snapshot(&bytes, b"session 2").unwrap_err(),
        SnapshotError::Unbound
    );
    let empty = IndexedHistory::new().snapshot(b"");
    let loaded = IndexedHistory::from_snapshot(&empty, b"").unwrap();
    assert!(loaded.is_empty());
    assert_eq!(loaded.costs().encoding(), None);
}

/// A snapshot counted under cost rule 1 (its payload has neither rule nor calibration) or
/// under another rule loads its items and graph, never its costs.
#[test]
fn a_snapshot_of_another_cost_rule_keeps_its_graph_and_drops_its_costs() {
    let (index, _) = counted_index();
    assert!(index.costs().counted() > 0);
    // Rule 1's payload: (encoding, costs plus one).
    let costs: Vec<u64> = (0..index.len())
        .map(|p| index.costs().get(p).map_or(0, |c| c + 1))
        .collect();
    let legacy = index
        .graph()
        .to_snapshot(&(Some("o200k_base"), costs.clone()), b"s");
    let later = index
        .graph()
        .to_snapshot(&(99u8, 64u16, Some("o200k_base"), costs), b"s");
    for (bytes, why) in [
        (
            legacy,
            "counted under cost rule 1 (opaque payloads as text): counted again",
        ),
        (later, "counted under another cost rule: counted again"),
    ] {
        let loaded = IndexedHistory::from_snapshot(&bytes, b"s").unwrap();
        assert_eq!(loaded.len(), index.len());
        assert_eq!(loaded.kinds(), index.kinds());
        assert_eq!(
            (loaded.costs().len(), loaded.costs().counted()),
            (index.len(), 0)
        );
        assert_eq!(loaded.costs().basis(), None);
        assert_eq!(loaded.snapshot_costs_dropped(), Some(why));
        assert_eq!(
            IndexedHistory::from_snapshot(&bytes, b"other").unwrap_err(),
            SnapshotError::Unbound
        );
    }
    // A protoprompt of rule 1 reads a snapshot as (encoding, costs): it refuses this one,
    // whose payload begins with the rule (never a valid option tag), instead of taking
    // costs of another rule for its own.
    let snapshot = index.snapshot(b"s");
    assert!(matches!(
        GraphIndex::from_snapshot::<(Option<String>, Vec<u64>)>(&snapshot, b"s"),
        Err(SnapshotError::Damaged(_))
    ));
    let current = IndexedHistory::from_snapshot(&snapshot, b"s").unwrap();
    assert_eq!(current.snapshot_costs_dropped(), None);
    assert_eq!(current.costs(), index.costs());
}

/// A snapshot whose cost payload does not fit its items is refused whole, with the message
/// the Python `SnapshotError` shows.
#[test]
fn a_snapshot_with_costs_for_other_items_is_damaged() {
    let (index, _) = counted_index();
    let mut other = IndexedHistory::new();
    other.append(metas(&history(2, "o")));
    let foreign = other.graph().to_snapshot(&index.costs().payload(), b"");
    let err = IndexedHistory::from_snapshot(&foreign, b"").unwrap_err();
    assert_eq!(
        err.to_string(),
        "damaged index snapshot: token costs do not match the items"
    );
    assert!(matches!(err, SnapshotError::Damaged(_)));
}

/// Fetches only the positions a caller's history list from `offset` on holds.
struct Listed {
    items: Vec<Value>,
    offset: usize,
}

impl ItemSource for Listed {
    fn values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        positions
            .iter()
            .map(|&p| {
                assert!(p >= self.offset, "position {p} is before the list's offset");
                Ok(self.items[p].clone())
            })
            .collect()
    }
}

#[test]
fn window_starts_count_what_is_listed_and_bound_what_is_not() {
    let enc = Encoding::O200kBase;
    let items = history(60, "win");
    let mut index = IndexedHistory::new();
    index.append(metas(&items));
    let n = index.len();
    let all: Vec<usize> = (0..n).collect();
    let exact = {
        let mut memo = CostMemo::default();
        let mut engine =
            CostEngine::<_, NoStore>::new(Items(items.clone()), enc).with_memo(&mut memo, n);
        engine.costs(&all).unwrap()
    };
    let walk = |index: &IndexedHistory, budget: u64, cost: &dyn Fn(usize) -> u64| {
        index
            .graph()
            .window_start(&[], budget, |m| {
                Ok::<u64, ()>(m.iter().map(|&p| cost(p)).sum())
            })
            .unwrap()
    };
    let budgets = [0, 10, 40, 150, 400, 1_000, 1_000_000];
    let overhead = protoprompt_core::tokens::ITEM_OVERHEAD;
    let mut starts = Vec::new();
    for &budget in &budgets {
        // Nothing counted yet: every position at the item overhead.
        let start = index.window_start(&[], budget, enc);
        assert_eq!(
            start,
            walk(&index, budget, &|_| overhead),
            "budget {budget}"
        );
        starts.push(start);
    }
    assert!(starts.windows(2).all(|w| w[0] >= w[1]), "{starts:?}");
    assert!(starts[0] > 0 && *starts.last().unwrap() == 0, "{starts:?}");

    // The first half counted into the memo under `enc`; another encoding knows nothing.
    let offset = n / 2;
    count(&mut index, &items, enc, &all[..offset]);
    let known = |p: usize| if p < offset { exact[p] } else { overhead };
    for &budget in &budgets {
        assert_eq!(
            index.window_start(&[], budget, enc),
            walk(&index, budget, &known)
        );
        let other = index.window_start(&[], budget, Encoding::Cl100kBase);
        assert_eq!(other, walk(&index, budget, &|_| overhead));
    }

    // Counted exactly: the listed positions (from `offset2` on) fetched and counted, earlier
    // ones at their known cost (the memo's first half), the rest at the overhead.
    let offset2 = n * 3 / 4;
    let bound = |p: usize| {
        if p >= offset2 || p < offset {
            exact[p]
        } else {
            overhead
        }
    };
    for &budget in &budgets {
        let mut fresh = IndexedHistory::new();
        fresh.append(metas(&items));
        count(&mut fresh, &items, enc, &all[..offset]);
        let expected = walk(&fresh, budget, &bound);
        let (graph, memo) = fresh.graph_and_costs();
        let listed = Listed {
            items: items.clone(),
            offset: offset2,
        };
        let mut engine = CostEngine::<_, NoStore>::new(listed, enc).with_memo(memo, n);
        let start = counted_window_start(graph, &mut engine, budget, offset2).unwrap();
        assert_eq!(start, expected, "budget {budget}");
    }
}
