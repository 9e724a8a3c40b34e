//! The cache-stable prefix decision ([`protoprompt_core::prefix`]): tables, a property over
//! appended sessions, and the JSON entry point.

use proptest::prelude::*;
use protoprompt_core::pack::{PackError, PackOptions};
use protoprompt_core::prefix::{
    decide, plan_prefix_values, CachePolicy, PrefixCall, PrefixDecision, PrefixError, PrefixReason,
    PrefixState, PrefixUnit,
};
use protoprompt_core::tokens::Encoding;
use serde_json::json;

fn id(n: u64) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&n.to_le_bytes());
    d
}

/// A test unit: one item, with its identity.
type U = (u64, PrefixUnit);

/// A user message (opens a turn).
fn user(n: u64, tokens: u64) -> U {
    (
        n,
        PrefixUnit {
            first: 0,
            end: 0,
            whole: tokens,
            masked: tokens,
            opens_turn: true,
            mandatory: false,
            sendable: true,
        },
    )
}

/// A tool step: `whole` tokens, `masked` once masked.
fn step(n: u64, whole: u64, masked: u64) -> U {
    (
        n,
        PrefixUnit {
            first: 0,
            end: 0,
            whole,
            masked,
            opens_turn: false,
            mandatory: false,
            sendable: true,
        },
    )
}

fn new_input(mut u: U) -> U {
    u.1.mandatory = true;
    u
}

/// One item per unit: positions and identities.
fn split(units: &[U]) -> (Vec<PrefixUnit>, Vec<[u8; 16]>) {
    let items = units.iter().map(|(n, _)| id(*n)).collect();
    let units = units
        .iter()
        .enumerate()
        .map(|(i, (_, u))| PrefixUnit {
            first: i,
            end: i + 1,
            ..*u
        })
        .collect();
    (units, items)
}

const POLICY: CachePolicy = CachePolicy {
    low_water: 0.5,
    keep_recent: 1,
};

/// Turns of a user message (10) and two steps (100 whole, 20 masked), ids from `first`.
fn turns(first: u64, count: u64) -> Vec<U> {
    (0..count)
        .flat_map(|t| {
            let b = first + t * 3;
            [user(b, 10), step(b + 1, 100, 20), step(b + 2, 100, 20)]
        })
        .collect()
}

fn run(prev: Option<&PrefixState>, units: &[U], budget: u64) -> PrefixDecision {
    let (units, items) = split(units);
    decide(prev, &units, &items, 0, budget, POLICY).expect("decides")
}

#[test]
fn fits_whole_keeps_everything_and_stays() {
    let mut units = turns(0, 3);
    units.push(new_input(user(100, 10)));
    let d = run(None, &units, 1_000);
    assert_eq!(d.reason, PrefixReason::FreshFits);
    assert_eq!(d.cut, 0);
    assert_eq!(d.kept, (0..10).collect::<Vec<_>>());
    assert!(d.masked.is_empty());
    assert_eq!(d.request_tokens, 3 * 210 + 10);
    // The next call appends a step: the same cut, everything before shared.
    units[9].1.mandatory = false;
    units.push(step(101, 100, 20));
    units.push(new_input(user(102, 10)));
    let next = run(Some(&d.state), &units, 1_000);
    assert_eq!(next.reason, PrefixReason::Stayed { cut: 0 });
    assert_eq!(next.shared_tokens, d.request_tokens);
    assert_eq!(next.request_tokens, d.request_tokens + 110);
}

#[test]
fn over_budget_moves_once_to_the_mark_masking_before_dropping() {
    // 6 turns of 210 = 1,260 + new input 10; budget 1,000, mark 500.
    let mut units = turns(0, 6);
    units.push(new_input(user(100, 10)));
    let d = run(None, &units, 1_000);
    assert!(
        matches!(d.reason, PrefixReason::FreshCut { .. }),
        "{:?}",
        d.reason
    );
    assert!(d.request_tokens <= 500, "{}", d.request_tokens);
    // The newest turn stays whole; older turns are masked (50 each) rather than dropped:
    // 10 (new) + 210 (newest) + 50 * 5 = 470 keeps every turn.
    assert_eq!(d.cut, 0);
    assert_eq!(d.request_tokens, 470);
    assert_eq!(d.masked, vec![1, 2, 4, 5, 7, 8, 10, 11, 13, 14]);
    // Masking alone not enough: 12 turns -> 10 + 210 + 50 * 11 = 770 > 500: drops the
    // oldest turns, masked, until at the mark, at a turn boundary.
    let mut long = turns(0, 12);
    long.push(new_input(user(100, 10)));
    let d = run(None, &long, 1_000);
    assert_eq!(d.request_tokens, 10 + 210 + 50 * 5);
    assert_eq!(d.cut, 6 * 3);
    assert!(long[d.cut].1.opens_turn);
}

#[test]
fn a_request_that_still_fits_stays_then_moves_when_it_does_not() {
    let mut units = turns(0, 12);
    units.push(new_input(user(100, 10)));
    let first = run(None, &units, 1_000);
    let mut state = first.state.clone();
    let mut last = first.request_tokens;
    let mut n = 200;
    let mut moves = 0;
    for _ in 0..10 {
        let tail = units.len() - 1;
        units[tail].1.mandatory = false;
        units.push(step(n, 100, 20));
        units.push(new_input(user(n + 1, 10)));
        n += 2;
        let d = run(Some(&state), &units, 1_000);
        if d.moved() {
            moves += 1;
            let PrefixReason::Moved { before, after, .. } = d.reason else {
                panic!("{:?}", d.reason)
            };
            assert!(before > 1_000 && after <= 500, "{before} -> {after}");
            assert_eq!(d.shared_tokens, 0);
        } else {
            assert_eq!(
                d.request_tokens,
                last + 110,
                "the previous request plus the step"
            );
            assert_eq!(d.shared_tokens, last);
        }
        assert!(d.request_tokens <= 1_000);
        last = d.request_tokens;
        state = d.state;
    }
    // 470 + 4 x 110 fits, the fifth append does not: one move per five calls.
    assert_eq!(moves, 2, "the cut moved twice in ten calls");
}

#[test]
fn a_rewritten_history_resets_the_decision() {
    let mut units = turns(0, 3);
    units.push(new_input(user(100, 10)));
    let d = run(None, &units, 1_000);
    // Compacted: the oldest turn replaced by a summary.
    let mut rewritten = units.clone();
    rewritten[0] = user(999, 10);
    let next = run(Some(&d.state), &rewritten, 1_000);
    let PrefixReason::Reset { why, .. } = &next.reason else {
        panic!("{:?}", next.reason)
    };
    assert_eq!(*why, "the history the previous request sent changed");
    assert_eq!(next.shared_tokens, 0);
    // Popped: shorter than what the previous request covered.
    let popped = &units[..units.len() - 2];
    let next = run(Some(&d.state), popped, 1_000);
    assert!(
        next.reason.to_string().contains("shorter"),
        "{}",
        next.reason
    );
    // A history rewritten before the cut.
    let mut long = turns(0, 12);
    long.push(new_input(user(100, 10)));
    let d = run(None, &long, 1_000);
    assert!(d.cut > 0);
    long[1] = step(998, 100, 20);
    let next = run(Some(&d.state), &long, 1_000);
    assert!(
        next.reason.to_string().contains("before the cut changed"),
        "{}",
        next.reason
    );
}

#[test]
fn the_newest_step_is_never_masked_or_dropped() {
    // A tool loop: the run's newest step (its call and the output being sent) is new input.
    let mut units = turns(0, 4);
    units.push(new_input(step(100, 300, 10)));
    let d = run(None, &units, 700);
    let newest = units.len() - 1;
    assert!(d.kept.contains(&newest));
    assert!(!d.masked.contains(&newest));
    assert!(d.request_tokens <= 700);
}

#[test]
fn a_unit_too_large() {
    // A mandatory unit over the budget: an error, nothing decided.
    let mut units = turns(0, 2);
    units.push(new_input(step(100, 2_000, 10)));
    let (u, items) = split(&units);
    let err = decide(None, &u, &items, 0, 1_000, POLICY).unwrap_err();
    assert_eq!(
        err,
        PrefixError::BudgetExceeded {
            used: 2_000,
            budget: 1_000
        }
    );
    assert_eq!(
        err.to_string(),
        "mandatory input needs 2000 tokens, over the budget of 1000"
    );
    // The reservation counts too.
    let (u, items) = split(&[new_input(user(1, 10))]);
    assert!(decide(None, &u, &items, 995, 1_000, POLICY).is_err());
    // An optional unit too large even masked is dropped with everything older.
    let mut units = turns(0, 2);
    units.push(user(50, 10));
    units.push(step(51, 5_000, 4_000));
    units.extend(turns(60, 1));
    units.push(new_input(user(100, 10)));
    let d = run(None, &units, 1_000);
    assert!(!d.kept.contains(&7), "{:?}", d.kept);
    assert_eq!(d.cut, 8);
    assert!(d.request_tokens <= 1_000);
}

#[test]
fn masking_reaches_into_recent_turns_only_when_the_mark_needs_it() {
    // Two huge turns: the newest whole cannot reach the mark, so it is masked too.
    let mut units = vec![user(0, 10), step(1, 400, 20), user(2, 10), step(3, 400, 20)];
    units.push(new_input(user(4, 10)));
    let d = run(None, &units, 600);
    assert_eq!(d.cut, 0);
    assert_eq!(d.masked, vec![1, 3]);
    assert_eq!(d.request_tokens, 70);
    // The mark cannot be reached at all: the lowest cut that fits the budget.
    let units = vec![user(0, 10), step(1, 300, 200), new_input(user(2, 350))];
    let d = run(None, &units, 600);
    assert_eq!(d.kept, vec![0, 1, 2]);
    assert_eq!(d.masked, vec![1]);
    assert_eq!(d.request_tokens, 560);
}

#[test]
fn policy_is_checked() {
    assert!(CachePolicy::checked(0.0, 3).is_err());
    assert!(CachePolicy::checked(1.5, 3).is_err());
    assert!(CachePolicy::checked(f64::NAN, 3).is_err());
    let p = CachePolicy::checked(0.7, 3).unwrap();
    assert_eq!(p.mark(1_000), 700);
    assert_eq!(CachePolicy::default(), p);
}

fn msg(role: &str, text: &str) -> serde_json::Value {
    json!({"type": "message", "role": role, "content": text})
}

fn call(id: &str) -> serde_json::Value {
    json!({"type": "function_call", "call_id": id, "name": "search", "arguments": "{}"})
}

fn output(id: &str, words: usize) -> serde_json::Value {
    let text = (0..words)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    json!({"type": "function_call_output", "call_id": id, "output": text})
}

fn session(turns: usize) -> Vec<serde_json::Value> {
    let mut h = Vec::new();
    for t in 0..turns {
        h.push(msg("user", &format!("question {t}")));
        let c = format!("c{t}");
        h.push(call(&c));
        h.push(output(&c, 200));
        h.push(msg("assistant", &format!("answer {t}")));
    }
    h
}

#[test]
fn json_items_are_planned_with_masked_copies() {
    let history = session(10);
    let new = vec![msg("user", "next")];
    let opts = PackOptions {
        budget: 3_000,
        output_reserve: 100,
        ..PackOptions::default()
    };
    let policy = CachePolicy {
        low_water: 0.7,
        keep_recent: 2,
    };
    let plan = plan_prefix_values(&history, &new, Encoding::O200kBase, &opts, 32, policy, None)
        .expect("plans");
    let d = &plan.decision;
    assert!(d.request_tokens <= 2_100, "{}", d.request_tokens);
    assert!(!plan.copies.is_empty());
    // The newest two turns are whole; their outputs are not among the copies.
    let recent_outputs = [34usize, 38];
    assert!(plan.copies.iter().all(|(p, _)| !recent_outputs.contains(p)));
    for (p, copy) in &plan.copies {
        assert_eq!(copy["type"], "function_call_output");
        assert!(plan.kept_history.contains(p));
        assert_ne!(copy["output"], history[*p]["output"]);
    }
    assert!(plan.kept_history.windows(2).all(|w| w[0] < w[1]));
    assert!(plan.describe().contains("history["), "{}", plan.describe());
    // The next call: the answer and a new question appended; the prefix stays.
    let mut history2 = history.clone();
    history2.push(new[0].clone());
    history2.push(msg("assistant", "ok"));
    let new2 = vec![msg("user", "and then")];
    let next = plan_prefix_values(
        &history2,
        &new2,
        Encoding::O200kBase,
        &opts,
        32,
        policy,
        Some(&d.state),
    )
    .expect("plans");
    assert!(!next.decision.moved(), "{}", next.describe());
    assert_eq!(next.decision.shared_tokens + 100, d.request_tokens);
    assert_eq!(next.copies, plan.copies);
}

#[test]
fn json_errors_name_the_item() {
    let opts = PackOptions {
        budget: 1_000,
        ..PackOptions::default()
    };
    let policy = CachePolicy::default();
    let orphan = vec![output("zz", 3)];
    let err =
        plan_prefix_values(&[], &orphan, Encoding::O200kBase, &opts, 32, policy, None).unwrap_err();
    assert!(matches!(err, PackError::InvalidNewInput { .. }), "{err:?}");
    let big = vec![msg("user", &"word ".repeat(5_000))];
    let err =
        plan_prefix_values(&[], &big, Encoding::O200kBase, &opts, 32, policy, None).unwrap_err();
    assert!(err.to_string().contains("new_input"), "{err}");
    let bad = vec![json!(["not", "an item"])];
    let err =
        plan_prefix_values(&[], &bad, Encoding::O200kBase, &opts, 32, policy, None).unwrap_err();
    assert!(matches!(err, PackError::Item { .. }), "{err:?}");
}

#[test]
fn an_embedding_call_checks_its_options_and_returns_parts() {
    let err = PrefixCall::checked((1_000, 0, 0), 0.0, 3, 32).unwrap_err();
    assert!(err.starts_with("low_water must be a fraction"), "{err}");
    let err = PrefixCall::checked((1_000, 0, 0), 1.5, 3, 1).unwrap_err();
    assert!(err.starts_with("low_water"), "{err}"); // low_water first
    let err = PrefixCall::checked((1_000, 0, 0), 0.7, 3, 1).unwrap_err();
    assert!(
        err.starts_with("masking.excerpt_tokens must be at least"),
        "{err}"
    );
    let call = PrefixCall::checked((3_000, 100, 0), 0.7, 2, 32).unwrap();
    let (opts, policy) = (&call.opts, call.policy);
    assert_eq!(
        (opts.budget, opts.output_reserve, opts.context_tokens),
        (3_000, 100, 0)
    );
    let (history, new) = (session(10), vec![msg("user", "next")]);
    let want = plan_prefix_values(&history, &new, Encoding::O200kBase, opts, 32, policy, None);
    let plan = call
        .plan((&history, &new), Encoding::O200kBase, None)
        .unwrap();
    assert_eq!(plan, want.unwrap());
    let (reason, cut) = (plan.describe(), plan.cut_position());
    let d = plan.decision.clone();
    let parts = plan.clone().into_parts(|v| Ok::<_, ()>(v.clone())).unwrap();
    assert_eq!(parts.0, plan.kept_history);
    assert_eq!(parts.1, plan.copies);
    assert_eq!(
        (parts.2, parts.3, parts.4),
        (d.request_tokens, d.shared_tokens, d.reason.code())
    );
    assert_eq!((parts.5, parts.6), (reason, cut));
    // The state goes out and comes back as it was; a digest of another size is refused.
    assert_eq!(PrefixState::from_parts(parts.7.clone()), Ok(d.state));
    let mut short = parts.7;
    short.5.pop();
    let err = PrefixState::from_parts(short).unwrap_err();
    assert_eq!(err, "previous: a state digest must be 16 bytes");
    assert_eq!(plan.into_parts(|_| Err::<(), _>("no")), Err("no"));
}

/// One generated call: steps appended (whole, masked costs), then whether a user turn opens.
#[derive(Debug, Clone)]
struct Call {
    opens: bool,
    steps: Vec<(u64, u64)>,
    input: u64,
}

fn calls() -> impl Strategy<Value = Vec<Call>> {
    let one = (
        any::<bool>(),
        prop::collection::vec((1u64..400, 0u64..400), 0..4),
        1u64..60,
    )
        .prop_map(|(opens, steps, input)| Call {
            opens,
            steps: steps
                .into_iter()
                .map(|(w, m)| (w, m.min(w).max(1)))
                .collect(),
            input,
        });
    prop::collection::vec(one, 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Over appended sessions: every decision fits, keeps its mandatory units whole and cuts
    /// at a valid place, and between moves each request is the previous one plus what was
    /// appended.
    #[test]
    fn appended_sessions_extend_their_prefix(
        calls in calls(),
        budget in 300u64..3_000,
        low_water in 0.3f64..1.0,
        keep_recent in 0usize..4,
    ) {
        let policy = CachePolicy { low_water, keep_recent };
        let mut units: Vec<U> = Vec::new();
        let mut next_id = 0u64;
        let mut fresh = |units: &mut Vec<U>, mut u: U| {
            u.0 = next_id;
            next_id += 1;
            units.push(u);
        };
        let mut prev: Option<PrefixDecision> = None;
        for c in calls {
            if let Some(last) = units.last_mut() {
                last.1.mandatory = false;
            }
            for (w, m) in &c.steps {
                fresh(&mut units, step(0, *w, *m));
            }
            let input = if c.opens { user(0, c.input) } else { step(0, c.input, c.input) };
            fresh(&mut units, new_input(input));
            let (us, items) = split(&units);
            let d = decide(prev.as_ref().map(|p| &p.state), &us, &items, 20, budget, policy)
                .expect("the new input always fits");
            let units = us;
            prop_assert!(d.request_tokens <= budget);
            let newest = units.len() - 1;
            prop_assert!(d.kept.contains(&newest) && !d.masked.contains(&newest));
            prop_assert!(d.kept.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(d.masked.iter().all(|m| d.kept.contains(m)));
            // A moved cut starts the history at a turn boundary or the start (a cut that
            // stays is where it was set).
            if let (true, Some(&first)) = (d.moved(), d.kept.first()) {
                prop_assert!(
                    first == 0 || units[first].opens_turn || first == newest,
                    "cut at {} in {:?}", first, d.kept
                );
            }
            let sent: u64 = d.kept.iter().map(|&k| {
                if d.masked.contains(&k) { units[k].masked } else { units[k].whole }
            }).sum::<u64>() + 20;
            prop_assert_eq!(sent, d.request_tokens);
            if let Some(p) = &prev {
                if !d.moved() {
                    prop_assert!(d.kept.starts_with(&p.kept));
                    prop_assert!(p.masked.iter().all(|m| d.masked.contains(m)));
                    prop_assert!(d.masked.iter().all(|m| *m < p.state.end));
                    prop_assert_eq!(d.state.cut, p.state.cut);
                    prop_assert_eq!(d.shared_tokens + 20, p.request_tokens);
                } else {
                    prop_assert!(p.request_tokens + 1 > 0);
                    let PrefixReason::Moved { before, .. } = d.reason else {
                        panic!("{:?}", d.reason)
                    };
                    prop_assert!(before > budget);
                }
            }
            prev = Some(d);
        }
    }
}

/// A unit that grows when items are appended (a program gains its output, a tool search
/// the calls it loaded) keeps the prefix: the state is in items, not units.
#[test]
fn a_unit_that_grows_keeps_the_prefix() {
    let unit = |first: usize, end: usize, whole: u64, opens: bool, mandatory: bool| PrefixUnit {
        first,
        end,
        whole,
        masked: whole,
        opens_turn: opens,
        mandatory,
        sendable: true,
    };
    let items: Vec<[u8; 16]> = (0..5).map(id).collect();
    let before = [
        unit(0, 1, 10, true, false),
        unit(1, 2, 50, false, false),
        unit(2, 3, 30, false, true),
    ];
    let d = decide(None, &before, &items[..3], 0, 1_000, POLICY).unwrap();
    // The third unit gains item 3; item 4 is the next call's new input.
    let after = [
        unit(0, 1, 10, true, false),
        unit(1, 2, 50, false, false),
        unit(2, 4, 45, false, false),
        unit(4, 5, 5, false, true),
    ];
    let next = decide(Some(&d.state), &after, &items, 0, 1_000, POLICY).unwrap();
    assert_eq!(next.reason, PrefixReason::Stayed { cut: 0 });
    assert_eq!(next.kept, vec![0, 1, 2, 3]);
    // Whole units only: the grown unit is not counted as shared.
    assert_eq!(next.shared_tokens, 60);
    // A unit regrouped across the cut resets the decision.
    let mut long = turns(0, 12);
    long.push(new_input(user(100, 10)));
    let d = run(None, &long, 1_000);
    let (mut units, items) = split(&long);
    units[d.cut - 1].end = d.cut + 1;
    let next = decide(Some(&d.state), &units, &items, 0, 1_000, POLICY).unwrap();
    assert!(
        next.reason.to_string().contains("spans the cut"),
        "{}",
        next.reason
    );
}

/// A tool output's call before the cut is sent with it (the tail dependency); on the next
/// call that unit is history reaching past the cut, and the prefix still stays.
#[test]
fn a_dependency_before_the_cut_stays_pinned() {
    let unit = |first: usize, end: usize, whole: u64, opens: bool, mandatory: bool| PrefixUnit {
        first,
        end,
        whole,
        masked: whole,
        opens_turn: opens,
        mandatory,
        sendable: true,
    };
    let items: Vec<[u8; 16]> = (0..6).map(id).collect();
    // 0 user (large), 1 call (its output 4 is the new input), 2 user, 3 step.
    let before = [
        unit(0, 1, 500, true, false),
        unit(1, 5, 20, false, true),
        unit(2, 3, 10, true, false),
        unit(3, 4, 50, false, false),
    ];
    let d = decide(None, &before, &items[..5], 0, 300, POLICY).unwrap();
    assert_eq!(d.cut, 2);
    assert_eq!(d.kept, vec![1, 2, 3]);
    assert_eq!(d.state.pinned, vec![1]);
    let after = [
        unit(0, 1, 500, true, false),
        unit(1, 5, 20, false, false),
        unit(2, 3, 10, true, false),
        unit(3, 4, 50, false, false),
        unit(5, 6, 5, false, true),
    ];
    let next = decide(Some(&d.state), &after, &items, 0, 300, POLICY).unwrap();
    assert_eq!(next.reason, PrefixReason::Stayed { cut: 2 });
    assert_eq!(next.kept, vec![1, 2, 3, 4]);
    assert_eq!(next.shared_tokens, 80);
}
