//! Masking in the fill: newest units whole, older ones masked, both policies, the coherent
//! start, mandatory units never masked, and every masked request a valid item graph within
//! the budget (random histories of every tool-output shape).

use proptest::prelude::*;
use protoprompt_core::graph::{build_graph, Graph, GraphView};
use protoprompt_core::items::ItemMeta;
use protoprompt_core::mask::Masking;
use protoprompt_core::pack::{
    pack_values, pack_values_masked, pack_values_pinned, Decision, PackOptions, PackResult, Policy,
    StopCause, UnitDecision,
};
use protoprompt_core::tokens::{item_cost, Encoding};
use serde_json::{json, Value};

const ENC: Encoding = Encoding::O200kBase;

fn cost(v: &Value) -> u64 {
    item_cost(v, ENC).unwrap().total()
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn answer(id: &str, text: &str) -> Value {
    json!({"type": "message", "role": "assistant", "id": id, "status": "completed",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn big(words: usize) -> String {
    "result row with some data 17\n".repeat(words)
}

/// A turn: user, encrypted reasoning, a call, its (long) output, an answer.
fn tool_turn(t: usize, output_words: usize) -> Vec<Value> {
    vec![
        user(&format!("question number {t}")),
        json!({"type": "reasoning", "id": format!("rs_{t}"), "summary": [],
               "encrypted_content": "gAAAA".repeat(20)}),
        json!({"type": "function_call", "call_id": format!("c{t}"), "name": "query_db",
               "arguments": format!("{{\"table\": \"orders\", \"page\": {t}}}")}),
        json!({"type": "function_call_output", "call_id": format!("c{t}"),
               "output": big(output_words)}),
        answer(&format!("msg_{t}"), &format!("answer number {t}")),
    ]
}

fn masking(after_turns: Option<u64>) -> Option<Masking> {
    Some(Masking {
        excerpt_tokens: 64,
        after_turns,
    })
}

fn opts(budget: u64, policy: Policy) -> PackOptions {
    PackOptions {
        budget,
        policy,
        ..PackOptions::default()
    }
}

fn decisions(g: &Graph, r: &PackResult) -> Vec<UnitDecision> {
    r.decisions(GraphView::whole(g))
}

/// The request: kept history (masked copies where masked), then new input.
fn request(h: &[Value], n: &[Value], r: &PackResult, copies: &[(usize, Value)]) -> Vec<Value> {
    let mut out: Vec<Value> = r
        .kept_history
        .iter()
        .map(|&p| {
            copies
                .iter()
                .find(|(q, _)| *q == p)
                .map_or_else(|| h[p].clone(), |(_, c)| c.clone())
        })
        .collect();
    out.extend(n.iter().cloned());
    out
}

/// What every masked request must satisfy: within the budget, exactly the tokens reported,
/// copies only of kept masked units' tool outputs (graph fields unchanged), and the request's
/// own graph has the same units with nothing invalid.
fn check(
    h: &[Value],
    n: &[Value],
    budget: u64,
    g: &Graph,
    r: &PackResult,
    copies: &[(usize, Value)],
) {
    assert!(r.used() <= budget);
    let sent = request(h, n, r, copies);
    let history_cost: u64 = sent[..r.kept_history.len()].iter().map(cost).sum();
    assert_eq!(history_cost, r.history_tokens + r.dependency_tokens);
    let masked_members: Vec<usize> = r
        .masked_units
        .iter()
        .flat_map(|&u| g.units[u].members.clone())
        .collect();
    for (p, copy) in copies {
        assert!(
            masked_members.contains(p),
            "copy of {p} outside a masked unit"
        );
        assert!(cost(copy) < cost(&h[*p]));
        for key in [
            "type",
            "call_id",
            "id",
            "caller",
            "status",
            "approval_request_id",
        ] {
            assert_eq!(copy.get(key), h[*p].get(key), "{key} of {p}");
        }
    }
    for &u in &r.masked_units {
        assert!(!g.units[u].contains_new, "a mandatory unit is never masked");
        assert!(
            g.units[u]
                .members
                .iter()
                .any(|p| copies.iter().any(|(q, _)| q == p)),
            "a masked unit has a copy"
        );
    }
    let metas: Vec<ItemMeta> = sent
        .iter()
        .map(|v| ItemMeta::from_json(v).unwrap())
        .collect();
    let k = r.kept_history.len();
    let sg = build_graph(&metas[..k], &metas[k..]);
    assert!(sg.units.iter().all(|u| u.is_valid()), "{:?}", sg.units);
    let saved: u64 = decisions(g, r)
        .iter()
        .filter(|d| d.decision == Decision::Masked)
        .map(|d| d.tokens.unwrap() - d.masked_tokens.unwrap())
        .sum();
    assert_eq!(saved, r.masking_saved);
    // The unit the fill stopped at was dropped, and did not fit in what was left then.
    if let Some(stop) = r.stop {
        let d = r.decision_of(GraphView::whole(g), stop.unit).unwrap();
        assert_eq!(d.decision, Decision::OverBudget);
        let older_kept = decisions(g, r)
            .iter()
            .any(|o| o.unit < stop.unit && o.decision.is_kept());
        if !older_kept {
            // Contiguous (or greedy that took no older turn): what was left then is still left.
            assert!(stop.left <= r.remaining());
        }
        match stop.cause {
            StopCause::Whole => assert!(d.tokens.unwrap() > stop.left),
            StopCause::Masked => assert!(d.masked_tokens.is_none_or(|m| m > stop.left)),
            StopCause::TurnMasked => assert_eq!(d.masked_tokens, None),
        }
    } else {
        assert!(decisions(g, r)
            .iter()
            .all(|d| d.decision != Decision::OverBudget));
    }
}

#[test]
fn newest_turns_stay_whole_and_older_ones_are_kept_masked() {
    let mut h = Vec::new();
    for t in 0..6 {
        h.extend(tool_turn(t, 300));
    }
    let n = vec![user("next question")];
    let whole: u64 = h.iter().map(cost).sum();
    let budget = whole / 3;
    let (g, plain) = pack_values(&h, &n, ENC, &opts(budget, Policy::Contiguous)).unwrap();
    let (gm, r, copies) = pack_values_masked(
        &h,
        &n,
        ENC,
        &opts(budget, Policy::Contiguous),
        masking(None),
    )
    .unwrap();
    check(&h, &n, budget, &gm, &r, &copies);
    assert!(plain.kept_history.len() < r.kept_history.len());
    assert_eq!(
        r.kept_history,
        (0..h.len()).collect::<Vec<_>>(),
        "all six turns fit masked"
    );
    // The newest whole turns are exactly those kept without masking.
    let whole_kept: Vec<usize> = decisions(&gm, &r)
        .iter()
        .filter(|d| d.decision == Decision::Kept)
        .flat_map(|d| gm.units[d.unit].members.clone())
        .collect();
    assert!(plain.kept_history.iter().all(|p| whole_kept.contains(p)));
    let masked: Vec<UnitDecision> = decisions(&gm, &r)
        .into_iter()
        .filter(|d| d.decision == Decision::Masked)
        .collect();
    assert!(!masked.is_empty());
    for d in &masked {
        assert!(d.masked_tokens.unwrap() < d.tokens.unwrap());
    }
    // Every masked output names its tool and call; calls and reasoning are sent whole.
    for (p, copy) in &copies {
        assert_eq!(h[*p]["type"], "function_call_output");
        let text = copy["output"].as_str().unwrap();
        let call_id = h[*p]["call_id"].as_str().unwrap();
        assert!(
            text.contains(&format!("query_db output (call {call_id})")),
            "{text}"
        );
        assert!(ENC.count(text).unwrap() <= 64);
    }
    let _ = g;
}

#[test]
fn a_masked_unit_that_does_not_fit_is_dropped_with_its_turn_start() {
    let mut h = Vec::new();
    for t in 0..8 {
        h.extend(tool_turn(t, 300));
    }
    let n = vec![user("next")];
    // Room for two whole turns and about two masked ones.
    let turn_whole: u64 = h[35..40].iter().map(cost).sum();
    let budget = cost(&n[0]) + 2 * turn_whole + 900;
    let (g, r, copies) = pack_values_masked(
        &h,
        &n,
        ENC,
        &opts(budget, Policy::Contiguous),
        masking(None),
    )
    .unwrap();
    check(&h, &n, budget, &g, &r, &copies);
    assert!(r.kept_history.len() < h.len());
    // Coherent start: the kept history starts at a user message.
    assert_eq!(h[r.kept_history[0]]["role"], "user");
    let d = decisions(&g, &r);
    assert!(
        d.iter()
            .any(|d| d.decision == Decision::OverBudget && d.masked_tokens.is_some()),
        "the miss was counted masked"
    );
    let stop = r.stop.expect("the fill stopped");
    assert_eq!(stop.cause, StopCause::Masked);
    let missed = d.iter().find(|d| d.unit == stop.unit).unwrap();
    assert!(missed.masked_tokens.unwrap() > stop.left);
    assert!(d.iter().any(|d| d.decision == Decision::Masked));
}

#[test]
fn after_turns_masks_old_outputs_that_would_fit() {
    let mut h = Vec::new();
    for t in 0..4 {
        h.extend(tool_turn(t, 100));
    }
    let n = vec![user("next")];
    let (g, r, copies) = pack_values_masked(
        &h,
        &n,
        ENC,
        &opts(1_000_000, Policy::Contiguous),
        masking(Some(1)),
    )
    .unwrap();
    check(&h, &n, 1_000_000, &g, &r, &copies);
    assert_eq!(r.kept_history.len(), h.len());
    let masked_outputs: Vec<usize> = copies.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        masked_outputs,
        vec![3, 8, 13],
        "every output but the newest turn's"
    );
    let (_, r0, copies0) = pack_values_masked(
        &h,
        &n,
        ENC,
        &opts(1_000_000, Policy::Contiguous),
        masking(Some(0)),
    )
    .unwrap();
    assert_eq!(copies0.len(), 4);
    assert!(r0.history_tokens < r.history_tokens);
    let (_, rn, none) = pack_values_masked(
        &h,
        &n,
        ENC,
        &opts(1_000_000, Policy::Contiguous),
        masking(None),
    )
    .unwrap();
    assert!(none.is_empty(), "everything fits whole: nothing is masked");
    assert!(rn.masked_units.is_empty());
}

#[test]
fn the_tail_dependency_is_never_masked() {
    // A resumed tool call: the pending call's unit is mandatory with its new output.
    let mut h = Vec::new();
    for t in 0..3 {
        h.extend(tool_turn(t, 200));
    }
    h.push(user("go on"));
    h.push(
        json!({"type": "function_call", "call_id": "tail", "name": "query_db",
                  "arguments": "{}"}),
    );
    let n = vec![json!({"type": "function_call_output", "call_id": "tail",
                        "output": big(300)})];
    let (g, r, copies) = pack_values_masked(
        &h,
        &n,
        ENC,
        &opts(1_000_000, Policy::Contiguous),
        masking(Some(0)),
    )
    .unwrap();
    check(&h, &n, 1_000_000, &g, &r, &copies);
    assert_eq!(r.dependency, vec![16]);
    assert!(copies.iter().all(|(p, _)| *p < 15), "{copies:?}");
    assert_eq!(copies.len(), 3);
}

#[test]
fn greedy_takes_older_turns_masked_whole_or_not_at_all() {
    let mut h = Vec::new();
    for t in 0..6 {
        h.extend(tool_turn(t, if t == 4 { 20 } else { 200 }));
    }
    // Turn 4 has a huge user message that fits neither whole nor masked.
    h[20] = user(&"long question words ".repeat(2000));
    let n = vec![user("next")];
    let budget = 3000;
    for policy in [Policy::Contiguous, Policy::Greedy] {
        let (g, r, copies) =
            pack_values_masked(&h, &n, ENC, &opts(budget, policy), masking(None)).unwrap();
        check(&h, &n, budget, &g, &r, &copies);
        let kept_turns: Vec<usize> = r
            .kept_history
            .iter()
            .filter(|&&p| h[p]["role"] == "user")
            .map(|&p| p / 5)
            .collect();
        if policy == Policy::Contiguous {
            assert_eq!(kept_turns, vec![5]);
        } else {
            assert!(
                kept_turns.len() > 1 && !kept_turns.contains(&4),
                "{kept_turns:?}"
            );
            for t in kept_turns {
                assert!((t * 5..t * 5 + 5).all(|p| r.kept_history.contains(&p)));
            }
        }
    }
}

/// A model call inside a tool loop: the run's input (pinned), `steps` finished steps (a
/// call and its long output each), the newest step as new input.
fn tool_loop(steps: usize) -> (Vec<Value>, Vec<Value>) {
    let step = |i: usize| {
        vec![
            json!({"type": "function_call", "call_id": format!("c{i}"), "name": "lookup",
                   "arguments": format!("{{\"q\": \"thing {i}\"}}")}),
            json!({"type": "function_call_output", "call_id": format!("c{i}"),
                   "output": big(60)}),
        ]
    };
    let mut h = vec![user("look up many things")];
    for i in 0..steps {
        h.extend(step(i));
    }
    (h, step(steps))
}

#[test]
fn a_pinned_turn_is_masked_before_any_of_its_steps_is_dropped() {
    let (h, n) = tool_loop(12);
    let step_whole = cost(&h[1]) + cost(&h[2]);
    let mandatory = cost(&h[0]) + n.iter().map(cost).sum::<u64>();
    let pinned = [0];
    let run = |budget: u64, policy: Policy, pins: &[usize]| {
        let (g, r, copies) =
            pack_values_pinned(&h, &n, ENC, &opts(budget, policy), masking(None), pins).unwrap();
        check(&h, &n, budget, &g, &r, &copies);
        let d = decisions(&g, &r);
        let of = |want: Decision| -> Vec<usize> {
            // steps (by their call's position) with this decision, newest first
            let mut v: Vec<usize> = d
                .iter()
                .filter(|x| x.decision == want && g.units[x.unit].members[0] > 0)
                .map(|x| (g.units[x.unit].members[0] - 1) / 2)
                .collect();
            v.sort_unstable_by(|a, b| b.cmp(a));
            v
        };
        (
            r.clone(),
            of(Decision::Kept),
            of(Decision::Masked),
            d.iter()
                .find(|x| x.decision == Decision::Masked)
                .and_then(|x| x.masked_tokens)
                .unwrap_or(0),
        )
    };
    // Everything fits whole: nothing is masked.
    let (r, whole, masked, _) = run(mandatory + 12 * step_whole, Policy::Contiguous, &pinned);
    assert_eq!((whole.len(), masked.len()), (12, 0));
    assert!(r.masked_units.is_empty());
    for policy in [Policy::Contiguous, Policy::Greedy] {
        // Room for five steps whole: every step is kept, the newest whole as far as the
        // room allows, the others masked.
        let budget = mandatory + 5 * step_whole;
        let (r, whole, masked, step_masked) = run(budget, policy, &pinned);
        assert_eq!(whole.len() + masked.len(), 12, "every call is kept");
        assert_eq!(whole, (12 - whole.len()..12).rev().collect::<Vec<_>>());
        assert!(!whole.is_empty() && whole.len() < 5);
        // Not one more step could be whole.
        assert!(r.used() - step_masked + step_whole > budget);
        // Room for six steps masked and a half: the six newest, all masked.
        let budget = mandatory + 6 * step_masked + step_masked / 2;
        let (r, whole, masked, _) = run(budget, policy, &pinned);
        assert!(whole.is_empty(), "{whole:?}");
        assert_eq!(
            masked,
            (6..12).rev().collect::<Vec<_>>(),
            "the newest, masked"
        );
        assert!(r.used() <= budget);
    }
}

// ---------------------------------------------------------------------------- random

fn id(kind: &str, i: usize) -> String {
    format!("{kind}{i}")
}

/// One random fragment of a history: every tool output shape, with short or long payloads.
fn fragment(kind: u8, i: usize, size: usize) -> Vec<Value> {
    let text = big(size);
    let rs = json!({"type": "reasoning", "id": id("rs_", i), "summary": [],
                    "encrypted_content": "gAAAA".repeat(8)});
    match kind % 12 {
        0 => vec![user(&format!("turn {i} {}", "words ".repeat(size % 40)))],
        1 => vec![rs, answer(&id("msg_", i), &text)],
        2 => vec![
            rs,
            json!({"type": "function_call", "call_id": id("c", i), "name": "f",
                   "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": id("c", i), "output": text}),
        ],
        3 => vec![
            json!({"type": "function_call", "call_id": id("c", i), "name": "see",
                   "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": id("c", i), "output": [
                {"type": "input_text", "text": text},
                {"type": "input_image", "image_url": "https://example.com/a.png"}]}),
        ],
        4 => vec![
            json!({"type": "shell_call", "call_id": id("s", i), "status": "completed",
                   "action": {"commands": ["ls"]}}),
            json!({"type": "shell_call_output", "call_id": id("s", i), "output": [
                {"stdout": text, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]}),
            json!({"type": "shell_call_output", "call_id": id("s", i), "output": [
                {"stdout": "more", "stderr": "e", "outcome": {"type": "exit", "exit_code": 1}}]}),
        ],
        5 => vec![
            json!({"type": "custom_tool_call", "call_id": id("k", i), "name": "grep",
                   "input": "x"}),
            json!({"type": "custom_tool_call_output", "call_id": id("k", i), "output": text}),
        ],
        6 => vec![
            json!({"type": "local_shell_call", "id": id("lsh_", i), "call_id": id("l", i),
                   "status": "completed",
                   "action": {"type": "exec", "command": ["ls"], "env": {}}}),
            json!({"type": "local_shell_call_output", "call_id": id("l", i), "output": text}),
        ],
        7 => vec![
            json!({"type": "apply_patch_call", "call_id": id("a", i), "status": "completed",
                   "operation": {"type": "delete_file", "path": "x"}}),
            json!({"type": "apply_patch_call_output", "call_id": id("a", i),
                   "status": "completed", "output": text}),
        ],
        8 => vec![
            json!({"type": "computer_call", "id": id("cu_", i), "call_id": id("u", i),
                   "status": "completed", "action": {"type": "screenshot"},
                   "pending_safety_checks": []}),
            json!({"type": "computer_call_output", "call_id": id("u", i),
                   "output": {"type": "computer_screenshot", "file_id": id("file_", i)}}),
        ],
        9 => vec![
            rs,
            json!({"type": "mcp_call", "id": id("mcp_", i), "name": "crm", "server_label": "s",
                   "arguments": "{}", "status": "completed", "output": text}),
        ],
        10 => vec![
            json!({"type": "tool_search_call", "call_id": id("t", i), "execution": "client",
                   "arguments": {"query": "crm"}, "status": "completed"}),
            json!({"type": "tool_search_output", "call_id": id("t", i), "execution": "client",
                   "status": "completed", "tools": [{"type": "function", "name": "crm_find",
                   "description": text, "strict": true, "parameters": {"type": "object",
                   "properties": {"q": {"type": "string", "description": "the query"}}}}]}),
        ],
        _ => {
            let caller = json!({"type": "program", "caller_id": id("p", i)});
            vec![
                rs,
                json!({"type": "program", "id": id("pg_", i), "call_id": id("p", i),
                       "code": "js", "fingerprint": "fp"}),
                json!({"type": "function_call", "call_id": id("c", i), "name": "f",
                       "arguments": "{}", "caller": caller}),
                json!({"type": "function_call_output", "call_id": id("c", i), "output": text,
                       "caller": caller}),
                json!({"type": "program_output", "id": id("po_", i), "call_id": id("p", i),
                       "result": "done", "status": "completed"}),
            ]
        }
    }
}

fn history_of(plan: &[(u8, usize)], tail: u8) -> (Vec<Value>, Vec<Value>) {
    let mut h = Vec::new();
    for (i, &(kind, size)) in plan.iter().enumerate() {
        h.extend(fragment(kind, i, size));
    }
    let n = if tail.is_multiple_of(2) {
        vec![user("next")]
    } else {
        h.push(
            json!({"type": "function_call", "call_id": "pending", "name": "f",
                      "arguments": "{}"}),
        );
        vec![json!({"type": "function_call_output", "call_id": "pending", "output": big(30)})]
    };
    (h, n)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    #[test]
    fn masked_requests_are_valid_within_budget_and_keep_more(
        plan in prop::collection::vec((0u8..12, 0usize..120), 0..24),
        tail in 0u8..4,
        budget in 200u64..12_000,
        after in prop::option::of(0u64..4),
        greedy in any::<bool>(),
        excerpt in 16u64..96,
    ) {
        let (h, n) = history_of(&plan, tail);
        let policy = if greedy { Policy::Greedy } else { Policy::Contiguous };
        let o = opts(budget, policy);
        let m = Some(Masking { excerpt_tokens: excerpt, after_turns: after });
        let plain = pack_values(&h, &n, ENC, &o);
        let masked = pack_values_masked(&h, &n, ENC, &o, m);
        match (plain, masked) {
            (Err(a), Err(b)) => prop_assert_eq!(a, b),
            (Ok((_, p)), Ok((g, r, copies))) => {
                check(&h, &n, budget, &g, &r, &copies);
                prop_assert_eq!(&p.dependency, &r.dependency);
                prop_assert_eq!(p.new_input_tokens, r.new_input_tokens);
                if !greedy {
                    prop_assert!(p.kept_history.iter().all(|x| r.kept_history.contains(x)),
                        "masking never loses a unit the plain pack keeps");
                }
                if after.is_none() && r.masked_units.is_empty() {
                    prop_assert_eq!(&p.kept_history, &r.kept_history);
                }
                // Without masking the result is the plain pack's, exactly.
                let (_, same, none) = pack_values_masked(&h, &n, ENC, &o, None).unwrap();
                prop_assert!(none.is_empty());
                prop_assert_eq!(same, p);
            }
            (a, b) => prop_assert!(false, "{:?} vs {:?}", a.map(|_| ()), b.map(|_| ())),
        }
    }
}

#[test]
fn a_unit_whose_masked_lower_bound_cannot_fit_is_not_masked_at_all() {
    // The older turn's unit carries a huge user-visible reasoning summary (never masked):
    // its masked cost cannot fit by its lower bound, so it is not counted masked (fast path).
    let mut h = tool_turn(0, 300);
    h[1] = json!({"type": "reasoning", "id": "rs_0",
                  "summary": [{"type": "summary_text", "text": big(400)}]});
    h.extend(tool_turn(1, 300));
    let n = vec![user("next")];
    let newest: u64 = h[5..].iter().map(cost).sum();
    let budget = cost(&n[0]) + newest + 500;
    let (g, r, copies) = pack_values_masked(
        &h,
        &n,
        ENC,
        &opts(budget, Policy::Contiguous),
        masking(None),
    )
    .unwrap();
    check(&h, &n, budget, &g, &r, &copies);
    let d = decisions(&g, &r);
    let skipped = d
        .iter()
        .find(|d| g.units[d.unit].members.contains(&1))
        .unwrap();
    assert_eq!(skipped.decision, Decision::OverBudget);
    assert!(skipped.tokens.is_some());
    assert_eq!(skipped.masked_tokens, None, "never counted masked");
    let stop = r.stop.expect("the fill stopped");
    assert_eq!(stop.unit, skipped.unit);
    assert_eq!(
        stop.cause,
        StopCause::TurnMasked,
        "its turn cannot fit even masked"
    );
    // Without the huge reasoning the same unit is counted masked (and kept).
    let mut h2 = h.clone();
    h2[1] = json!({"type": "reasoning", "id": "rs_0", "summary": []});
    let (g2, r2, _) = pack_values_masked(
        &h2,
        &n,
        ENC,
        &opts(budget, Policy::Contiguous),
        masking(None),
    )
    .unwrap();
    let d2 = decisions(&g2, &r2);
    let counted = d2
        .iter()
        .find(|d| g2.units[d.unit].members.contains(&1))
        .unwrap();
    assert_eq!(counted.decision, Decision::Masked);
    assert!(counted.masked_tokens.is_some());
}

#[test]
fn a_masked_field_checks_its_item_and_converts_its_text_once() {
    use protoprompt_core::masked_field::MaskedField;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let field = |value: Value| MaskedField {
        field: "output",
        value: std::sync::Arc::new(value),
        original_len: 5,
        cost: None,
        converted: std::sync::OnceLock::new(),
    };
    let text = field(json!("short"));
    assert_eq!(text.check_len(Some(5)), Ok(()));
    for changed in [Some(4), None] {
        let message = text.check_len(changed).unwrap_err();
        assert!(message.starts_with("changed since its masked copy was made"));
        assert!(message.ends_with("must stay as they are)"), "{message}");
    }
    let made = AtomicUsize::new(0);
    let make = |t: &str| {
        made.fetch_add(1, Ordering::Relaxed);
        t.to_uppercase()
    };
    assert_eq!(text.converted_text(make), Some(&"SHORT".to_string()));
    assert_eq!(text.converted_text(make), Some(&"SHORT".to_string()));
    assert_eq!(made.load(Ordering::Relaxed), 1, "converted once");
    // A conversion of another type was kept: none of this one.
    assert_eq!(text.converted_text(|t| t.len()), None);
    let list = field(json!([{"type": "input_text", "text": "x"}]));
    assert_eq!(list.converted_text(make), None);
    assert_eq!(made.load(Ordering::Relaxed), 1);
}
