//! The core façade ([`protoprompt_core::facade`]): one call per `HistoryIndex` method. Its
//! options derive their basis and thinking rule from the model, a pack reports how it used
//! the index and what the thinking rule made free, a tokenizer failure is the failure a
//! call ends with, and the counting calls leave the index with the costs a window start
//! needs.

use protoprompt_core::costs::StoreTally;
use protoprompt_core::costs::{ItemSource, NoStore};
use protoprompt_core::facade::{
    CallEnd, CallFailure, CallOptions, Ending, OptionsError, ReportValue,
};
use protoprompt_core::indexed::IndexedHistory;
use protoprompt_core::items::ItemMeta;
use protoprompt_core::pack::CostFailure;
use protoprompt_core::tokens::{fail_next_counts, CostBasis, Encoding, TokenError};
use serde_json::{json, Value};

struct Items(Vec<Value>);

impl ItemSource for Items {
    fn values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        Ok(positions.iter().map(|&p| self.0[p].clone()).collect())
    }
}

fn metas(items: &[Value]) -> Vec<ItemMeta> {
    items
        .iter()
        .map(|v| ItemMeta::from_json(v).unwrap())
        .collect()
}

/// `turns` turns of user, reasoning, call, output, answer.
fn history(turns: usize) -> Vec<Value> {
    let mut h = Vec::new();
    for t in 0..turns {
        h.push(json!({"role": "user", "content": format!("question {t} ").repeat(20)}));
        h.push(
            json!({"type": "reasoning", "id": format!("rs_{t}"), "summary": [],
                      "encrypted_content": "e".repeat(40)}),
        );
        h.push(
            json!({"type": "function_call", "call_id": format!("c{t}"), "name": "f",
                      "arguments": "{}"}),
        );
        h.push(
            json!({"type": "function_call_output", "call_id": format!("c{t}"),
                      "output": format!("result {t} ").repeat(30)}),
        );
        h.push(
            json!({"type": "message", "role": "assistant", "id": format!("m{t}"),
                      "content": [{"type": "output_text", "text": "done"}]}),
        );
    }
    h
}

fn indexed(items: &[Value]) -> IndexedHistory {
    let mut index = IndexedHistory::new();
    let blocking = |f: &mut (dyn FnMut() + Send)| f();
    let appended = index
        .append_fresh(
            items.len(),
            |first, count| -> Result<_, ()> { Ok(metas(&items[first..first + count])) },
            &blocking,
        )
        .unwrap();
    assert_eq!((appended.held, appended.appended), (0, items.len()));
    index
}

fn options(budget: u64, model: Option<&str>) -> CallOptions {
    let mut o = CallOptions::default();
    o.pack.budget = budget;
    o.model = model.map(str::to_string);
    o.rebase().unwrap();
    o
}

#[test]
fn options_take_their_basis_and_thinking_rule_from_the_model() {
    let o = CallOptions::default();
    assert_eq!(o.basis.encoding, Encoding::O200kBase);
    assert_eq!(o.thinking_rule(), "whole");
    let claude = options(1000, Some("claude-3-7-sonnet-latest"));
    assert_eq!(claude.basis.encoding, Encoding::ClaudeEstimate);
    assert!(claude.strips_thinking);
    assert_eq!(claude.thinking_rule(), "earlier-turns-free");
    assert!(!options(1000, Some("claude-opus-4-6")).strips_thinking);

    let mut unknown = CallOptions {
        model: Some("no-such-model".into()),
        ..CallOptions::default()
    };
    assert!(matches!(
        unknown.rebase(),
        Err(OptionsError::Token(TokenError::UnknownModel(_)))
    ));
    // An estimate scales the whole cost: a calibration under its floor is refused, and the
    // basis stays what it was.
    let mut low = claude.clone();
    low.opaque_scale = CostBasis::MIN_ESTIMATE_SCALE.factor() / 2.0;
    assert!(matches!(low.rebase(), Err(OptionsError::Value(_))));
    assert_eq!(low.basis, claude.basis);
    assert!(claude
        .describe()
        .contains("model='claude-3-7-sonnet-latest'"));
}

#[test]
fn a_pack_reports_how_it_used_the_index_and_what_thinking_was_free() {
    let items = history(6);
    let mut index = indexed(&items);
    let new_input = vec![json!({"role": "user", "content": "next"})];
    let new_metas = metas(&new_input);
    let mut all = items.clone();
    all.extend(new_input.iter().cloned());
    let blocking = |f: &mut (dyn FnMut() + Send)| f();
    let appended = index
        .append_fresh(0, |_, _| -> Result<_, ()> { Ok(Vec::new()) }, &blocking)
        .unwrap();
    let o = options(1_000_000, Some("claude-3-7-sonnet-latest"));
    let _mark = index.begin_call(&o);
    let end = index.pack_call::<_, NoStore>(
        Items(all),
        None,
        &o,
        &new_metas,
        appended,
        o.basis.encoding.load_in_background(),
        None,
    );
    assert_eq!(end.n_history, items.len());
    let call = end.outcome.unwrap();
    assert_eq!(
        call.packed.result.kept_history,
        (0..items.len()).collect::<Vec<_>>()
    );
    // Every turn's reasoning stands before the new user message: all of it is free.
    assert_eq!(call.earlier_thinking_free, 6);
    assert_eq!(
        (call.index_use.held, call.index_use.appended),
        (items.len(), 0)
    );
    assert_eq!(call.index_use.regrouped_from, items.len());
    // Every history item has a row, each with the decision of its unit.
    let report = &call.decisions;
    assert_eq!(report.item_counts().values().sum::<usize>(), items.len());
    assert_eq!(report.item_counts().get("kept"), Some(&items.len()));
    let first = report.row(0).unwrap();
    assert_eq!((first.positions.as_slice(), first.code), (&[0][..], "kept"));
    assert_eq!(first.kinds, vec!["user_message"]);
    let (unit, positions, kinds, code, ..) = first.clone().into_tuple();
    assert_eq!(
        (unit, positions, kinds, code),
        (0, vec![0], vec!["user_message"], "kept")
    );
    assert!(report.row(report.len()).is_none());
    // The plain values of the result, by name and in its order.
    let values = call.report(&o);
    let names: Vec<&str> = values.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        &names[..3],
        ["kept_history", "dependency", "new_input_tokens"]
    );
    assert_eq!(names.last(), Some(&"omitted_reasoning"));
    let value = |name: &str| values.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let result = &call.packed.result;
    assert_eq!(
        value("kept_history"),
        ReportValue::Positions(&result.kept_history)
    );
    assert_eq!(value("used"), ReportValue::Count(result.used()));
    assert_eq!(
        value("remaining"),
        ReportValue::Count(1_000_000 - result.used())
    );
    assert_eq!(
        value("encoding"),
        ReportValue::Name(o.basis.encoding.name())
    );
    assert_eq!(value("opaque_scale"), ReportValue::Factor(1.0));
    assert_eq!(value("policy"), ReportValue::Name("contiguous"));
    assert_eq!(
        value("thinking_rule"),
        ReportValue::Name("earlier-turns-free")
    );
    assert_eq!(value("earlier_thinking_free"), ReportValue::Count(6));
    assert_eq!(value("index"), ReportValue::Index(&call.index_use));
    assert_eq!(value("stop"), ReportValue::Stop(None));
    assert_eq!(value("omitted_reasoning"), ReportValue::Positions(&[]));
    // The free thinking is never counted; everything else is, and stays in the index.
    assert_eq!(index.costs().counted(), items.len() - 6);
}

#[test]
fn a_tokenizer_failure_is_what_a_call_ends_with() {
    let items = history(3);
    let mut index = indexed(&items);
    let o = options(1_000_000, None);
    fail_next_counts(1);
    let end = index.cost_over_call::<_, NoStore>(Items(items.clone()), o.basis, 0, u64::MAX);
    fail_next_counts(0);
    match end.outcome {
        Err(CallFailure::Tokenizer { position, error }) => {
            assert_eq!(position, items.len() - 1, "counted newest first");
            assert!(matches!(error, TokenError::Tokenizer(_)));
        }
        other => panic!("expected a tokenizer failure, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn counting_calls_leave_the_costs_a_window_needs() {
    let items = history(40);
    let mut index = indexed(&items);
    let o = options(1_000_000, None);
    let total = index
        .cost_over_call::<_, NoStore>(Items(items.clone()), o.basis, 0, u64::MAX)
        .outcome
        .unwrap();
    assert!(!total.1);
    let (sum, over) = index
        .cost_over_call::<_, NoStore>(Items(items.clone()), o.basis, 0, total.0 / 2)
        .outcome
        .unwrap();
    assert!(over && sum > total.0 / 2 && sum <= total.0);

    let budget = total.0 / 4;
    let mut fresh = indexed(&items);
    let before = fresh.window_start(&[], budget, o.basis);
    let start = fresh
        .count_window_call::<_, NoStore>(Items(items.clone()), None, &o, budget)
        .outcome
        .unwrap();
    assert!(
        start > before,
        "exact costs start the window later than lower bounds"
    );
    let window = fresh.window_call(&[], budget, &o, items.len());
    assert_eq!((window.start, window.fits), (start, false));
}

#[test]
fn a_request_is_edited_by_position_masked_copies_and_ids_merged() {
    use protoprompt_core::masked_field::MaskedField;
    use protoprompt_core::pack::PackResult;
    use protoprompt_core::pipeline::Packed;
    use std::sync::Arc;

    let field = |n: usize| {
        Arc::new(MaskedField {
            field: "output",
            value: Arc::new(json!("masked")),
            original_len: n,
            cost: Some(3),
            converted: Default::default(),
        })
    };
    let packed = Packed {
        result: PackResult {
            kept_history: vec![2, 3, 5, 8, 9],
            ..PackResult::default()
        },
        copies: vec![(8, field(80)), (3, field(30))],
        omitted: vec![4],
        // 5 and 9: only without their id; 8: masked and without its id; 7 is not kept.
        stripped: vec![5, 7, 8, 9],
    };
    let edits = packed.request_edits();
    let shown: Vec<_> = edits
        .iter()
        .map(|e| {
            let len = e.masked.as_ref().map(|m| m.original_len);
            (e.index, e.position, len, e.strip_id)
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            (1, 3, Some(30), false),
            (2, 5, None, true),
            (3, 8, Some(80), true),
            (4, 9, None, true),
        ]
    );
    let nothing = Packed {
        copies: Vec::new(),
        stripped: Vec::new(),
        ..packed
    };
    assert!(nothing.request_edits().is_empty());
}

#[test]
fn failures_are_labelled_as_the_embedding_reports_them() {
    use protoprompt_core::facade::CallError;
    use protoprompt_core::pack::PackError;
    use protoprompt_core::reads::{CallReads, BEFORE_OFFSET, GONE};

    let tokenizer = CallFailure::Tokenizer {
        position: 4,
        error: TokenError::Tokenizer("boom".into()),
    };
    match tokenizer.labelled(3) {
        CallError::Tokenizer(m) => assert!(m.starts_with("new_input[1]: "), "{m}"),
        other => panic!("expected a tokenizer error, got {other:?}"),
    }
    let item = CallFailure::Item(CostFailure {
        position: 1,
        field: "content".into(),
        message: "bad".into(),
    });
    match item.labelled(3) {
        CallError::Pack(PackError::Item {
            label, position, ..
        }) => assert_eq!((label.as_str(), position), ("history[1]", 1)),
        other => panic!("expected an item error, got {other:?}"),
    }
    let context = CallFailure::Pack(PackError::Context("hook".into()));
    assert_eq!(
        context.labelled(3),
        CallError::Pack(PackError::Context("hook".into()))
    );

    // A list from position 2 on: position 1 is before it, position 3 was in it.
    let reads: CallReads<()> = CallReads::new(2, 5, 5);
    assert_eq!(reads.unreadable(1), BEFORE_OFFSET);
    assert_eq!(reads.unreadable(3), GONE);
}

#[test]
fn a_graph_reports_its_units_with_labels_kinds_and_problems() {
    let items = history(1);
    let new_input =
        vec![json!({"type": "function_call_output", "call_id": "nowhere", "output": "x"})];
    let mut all = metas(&items);
    all.extend(metas(&new_input));
    let graph = protoprompt_core::build_graph(&all[..items.len()], &all[items.len()..]);
    let reports = graph.unit_reports(&all);
    assert_eq!(reports.len(), graph.units.len());
    let first = &reports[0];
    assert_eq!(first.members, vec!["history[0]"]);
    assert_eq!(
        (first.positions.clone(), first.kinds.clone()),
        (vec![0], vec!["user_message"])
    );
    assert!(first.valid && !first.contains_new && first.problems.is_empty());
    let last = reports.last().unwrap();
    assert_eq!(last.members, vec!["new_input[0]"]);
    assert!(last.contains_new && !last.valid);
    assert_eq!(last.problems[0].2, "new_input[0]");
    // Every position is a member of exactly one unit.
    let mut members: Vec<usize> = reports.iter().flat_map(|r| r.positions.clone()).collect();
    members.sort_unstable();
    assert_eq!(members, (0..all.len()).collect::<Vec<_>>());
    // As an embedding returns it: the same reports as tuples, then the history's length
    // and the history positions the new input needs.
    let (units, n_history, mandatory) = graph.report_parts(&all);
    let tuples: Vec<_> = reports.iter().map(|r| r.clone().into_tuple()).collect();
    assert_eq!(units, tuples);
    assert_eq!(
        (n_history, mandatory),
        (items.len(), graph.mandatory_history())
    );
    let (members, positions, kinds, valid, input_only, contains_new, problems) = &units[0];
    assert_eq!(
        (members, positions, kinds),
        (&first.members, &first.positions, &first.kinds)
    );
    assert_eq!((*valid, *input_only, *contains_new), (true, false, false));
    assert!(problems.is_empty());
}

/// A call's end with `outcome`, an item source whose cause is "item" and a store whose own
/// failure is `store`.
fn ended(
    outcome: Result<u8, CallFailure>,
    store: Option<&'static str>,
) -> CallEnd<u8, Option<&'static str>, Option<&'static str>> {
    CallEnd {
        outcome,
        items: Some("item"),
        store: Some((store, StoreTally::default())),
        n_history: 3,
    }
}

#[test]
fn a_call_ends_with_the_store_then_the_tokenizer_then_its_error_and_the_item_cause() {
    use protoprompt_core::pack::PackError;
    let take = |s: &mut Option<&'static str>| s.take();
    let finish = |end: CallEnd<u8, _, _>, hook| end.finish(take, take, hook);
    let (value, items, store) = finish(ended(Ok(7), None), None).unwrap();
    assert_eq!((value, items), (7, Some("item")));
    assert_eq!(store, Some((None, StoreTally::default())));
    // The store's own failure comes first, even before a value.
    assert!(matches!(
        finish(ended(Ok(7), Some("store")), Some("hook")),
        Err(Ending::Store("store"))
    ));
    // Then a tokenizer failure (labelled), which has no cause.
    let tokenizer = CallFailure::Tokenizer {
        position: 3,
        error: TokenError::Tokenizer("boom".into()),
    };
    match finish(ended(Err(tokenizer), None), Some("hook")) {
        Err(Ending::Tokenizer(m)) => assert!(m.starts_with("new_input[0]: "), "{m}"),
        other => panic!("expected a tokenizer ending, got {other:?}"),
    }
    // A failed hook's own failure stands for the call's error, chained to the item's.
    let context = || CallFailure::Pack(PackError::Context("hook".into()));
    assert!(matches!(
        finish(ended(Err(context()), None), Some("hook")),
        Err(Ending::Raised {
            error: "hook",
            cause: Some("item")
        })
    ));
    let item = CallFailure::Item(CostFailure {
        position: 1,
        field: "content".into(),
        message: "bad".into(),
    });
    match finish(ended(Err(item), None), None) {
        Err(Ending::Pack {
            error: PackError::Item { label, .. },
            cause: Some("item"),
        }) => assert_eq!(label, "history[1]"),
        other => panic!("expected the item's error, got {other:?}"),
    }
}

#[test]
fn a_failed_call_puts_the_index_back() {
    let items = history(2);
    let mut index = indexed(&items[..5]);
    let o = options(1_000_000, None);
    let undone = std::sync::atomic::AtomicUsize::new(0);
    let blocking = |f: &mut (dyn FnMut() + Send)| {
        undone.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f()
    };
    let append = |index: &mut IndexedHistory| {
        let rest = metas(&items[5..]);
        let classify = |_, _| -> Result<_, ()> { Ok(rest.clone()) };
        index.append_fresh(5, classify, &|f| f()).map(|_| ())
    };
    let failed = index.within_call(&o, &blocking, |index| {
        append(index).unwrap();
        Err::<(), _>("failed")
    });
    assert_eq!((failed, index.len()), (Err("failed"), 5));
    assert_eq!(undone.load(std::sync::atomic::Ordering::Relaxed), 1);
    let kept = index.within_call(&o, &blocking, |index| append(index).map_err(|()| "x"));
    assert_eq!((kept, index.len()), (Ok(()), 10));
    assert_eq!(undone.load(std::sync::atomic::Ordering::Relaxed), 1);
}
