//! The incremental index on histories of every item shape (tests/shapes): its appends,
//! pops, cuts and windows give exactly what a graph built from scratch gives, with every
//! shape in every region (the indexed history, the items appended since, the new input, and
//! across each boundary); and on valid histories the cut is as late as the item rules allow,
//! so the fast paths are taken, not only correct. Then directed cases of what the random ones
//! found: streamed anonymous tool searches, which the cut once counted as unpaired and so
//! turned every window and regroup of an agentic history off.

mod shapes;

use protoprompt_core::graph::{build_graph, Graph, GraphView};
use protoprompt_core::incremental::{GraphIndex, Pull, Tie};
use protoprompt_core::items::{ItemKind, ItemMeta};
use protoprompt_core::pack::{pack, CostFailure, CostSource, PackOptions, Policy};
use serde_json::{json, Value};
use shapes::{metas, Case, Maker, Shape};

type UnitSummary = (Vec<usize>, Vec<(&'static str, usize)>, bool, bool);

fn summary(view: GraphView<'_>) -> Vec<UnitSummary> {
    (0..view.unit_count())
        .map(|u| {
            let unit = view.unit(u);
            (
                unit.members.clone(),
                unit.problems
                    .iter()
                    .map(|p| (p.reason.code(), p.position))
                    .collect(),
                unit.contains_new,
                unit.input_only,
            )
        })
        .collect()
}

/// Items `c..` of the case (history then new input) as a graph with global positions.
fn suffix_graph(case: &Case, c: usize) -> Graph {
    let mut g = build_graph(&case.hm[c..], &case.nm);
    g.shift_positions(c);
    g
}

/// Whether `c` is an exact cut: the index's units before `c`, then a graph built over `c..`
/// alone, are the units (members, problems, mandatory, input-only) of the whole graph.
fn exact_at(idx: &GraphIndex, case: &Case, full: &Graph, c: usize) -> bool {
    let suffix = suffix_graph(case, c);
    summary(GraphView::split(idx.graph(), c, &suffix)) == summary(GraphView::whole(full))
}

/// Member of a reasoning run (the runs the cut never splits, docs/item-graph.md §12.2 E4).
fn continues(m: &ItemMeta) -> bool {
    m.is_reasoning() || m.is_model_emitted() || m.is_server_output() || m.is_chat_model_message()
}

/// The latest cut at or before `from` that the item rules allow: exact, and not inside a run
/// of reasoning and model items (the one place the cut is knowingly conservative: such a run
/// may or may not hold a reasoning item that joins it). Found by trying every position.
fn tightest_cut(idx: &GraphIndex, case: &Case, full: &Graph, from: usize) -> usize {
    let all: Vec<&ItemMeta> = case.hm.iter().chain(&case.nm).collect();
    (0..=from)
        .rev()
        .find(|&c| {
            let crosses = c > 0 && c < all.len() && continues(all[c - 1]) && continues(all[c]);
            !crosses && exact_at(idx, case, full, c)
        })
        .expect("0 is always a cut")
}

/// An index of `hm[..synced]`, appended in random blocks (with random reservations), popped
/// and appended again: after every step its graph is that of a fresh build.
fn build_index(m: &mut Maker, case: &Case, id: usize) -> GraphIndex {
    let hm = &case.hm[..case.synced];
    let mut idx = GraphIndex::new();
    let mut at = 0;
    while at < hm.len() {
        let k = 1 + m.rng.below(hm.len() - at);
        if m.rng.chance(3) {
            idx.reserve(m.rng.below(40));
        }
        idx.extend(hm[at..at + k].to_vec());
        at += k;
        assert_eq!(
            idx.graph(),
            &build_graph(&hm[..at], &[]),
            "case {id}: at {at}"
        );
    }
    for _ in 0..m.rng.below(3) {
        if hm.is_empty() {
            break;
        }
        let keep = hm.len() - 1 - m.rng.below(hm.len().min(12));
        idx.truncate(keep);
        assert_eq!(
            idx.graph(),
            &build_graph(&hm[..keep], &[]),
            "case {id}: truncated to {keep}"
        );
        let mut at = keep;
        while at < hm.len() {
            let k = 1 + m.rng.below(hm.len() - at);
            idx.extend(hm[at..at + k].to_vec());
            at += k;
        }
        assert_eq!(idx.graph(), &build_graph(hm, &[]), "case {id}: re-extended");
    }
    idx
}

#[test]
fn every_shape_and_every_kind_is_generated() {
    let mut m = Maker::new(11, "g");
    let mut shapes = std::collections::HashSet::new();
    let mut kinds = std::collections::HashSet::new();
    for _ in 0..300 {
        let case = Case::draw(&mut m, 40, Some(3));
        shapes.extend(case.shapes.iter().copied());
        kinds.extend(case.hm.iter().chain(&case.nm).map(|x| x.kind));
    }
    let missing: Vec<Shape> = Shape::ALL
        .iter()
        .copied()
        .filter(|s| !shapes.contains(s))
        .collect();
    assert!(missing.is_empty(), "shapes never drawn: {missing:?}");
    let missing: Vec<&str> = ItemKind::all()
        .into_iter()
        .filter(|k| !kinds.contains(k))
        .map(ItemKind::name)
        .collect();
    assert!(missing.is_empty(), "kinds never drawn: {missing:?}");
    // Valid shapes are valid as the SDK stores them: a history of them has no invalid unit.
    for s in &Shape::ALL[..Shape::FIRST_BROKEN] {
        let mut items = vec![json!({"role":"user","content":"q"})];
        items.extend(m.make(*s));
        let g = build_graph(&metas(&items), &[]);
        assert!(g.units.iter().all(|u| u.is_valid()), "{s:?}: {g:?}");
    }
}

/// Cuts on every shape in every region: exact always; on valid histories as late as the
/// rules allow (the fast path is taken). Appends and pops match a fresh graph.
#[test]
fn cuts_are_exact_and_tight_on_every_shape() {
    let mut m = Maker::new(0x5EED_0001, "c");
    let mut later_than_start = 0;
    for id in 0..1500 {
        let broken = if m.rng.chance(2) { None } else { Some(4) };
        let case = Case::draw(&mut m, 24, broken);
        let idx = build_index(&mut m, &case, id);
        let tail = case.tail();
        let full = build_graph(&case.hm, &case.nm);
        let froms = [case.synced, m.rng.below(case.synced + 1)];
        for from in froms {
            let cut = idx.cut_explained(from, &tail);
            let c = cut.position;
            assert!(c <= from, "case {id}");
            assert_eq!(idx.cut_from(from, &tail), c);
            assert!(
                exact_at(&idx, &case, &full, c),
                "case {id}: cut {c} from {from}"
            );
            match cut.pull {
                None => assert_eq!(c, from, "case {id}: moved without a reason"),
                Some(Pull { to, from: at, .. }) => {
                    assert_eq!(to, c, "case {id}: {cut:?}");
                    assert!(at >= c, "case {id}: {cut:?}");
                }
            }
            if broken.is_none() {
                let best = tightest_cut(&idx, &case, &full, from);
                assert_eq!(
                    c, best,
                    "case {id}: cut {c} from {from}, rules allow {best}"
                );
                if c > 0 {
                    later_than_start += 1;
                }
            }
        }
        // The pack's view of history ++ new input is the whole graph's.
        let mut whole = idx.clone();
        whole.extend(case.hm[case.synced..].to_vec());
        let t = whole.tail(&case.nm);
        assert_eq!(
            summary(whole.view(&t)),
            summary(GraphView::whole(&full)),
            "case {id}: view"
        );
    }
    assert!(
        later_than_start > 600,
        "only {later_than_start} cuts after 0"
    );
}

/// Cost = 1 + position mod 7 (deterministic, position-based).
struct Costs;

impl CostSource for Costs {
    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        Ok(positions.iter().map(|&p| 1 + (p % 7) as u64).collect())
    }
}

/// Records every position a pack costs.
struct Recording(Vec<usize>);

impl CostSource for Recording {
    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        self.0.extend_from_slice(positions);
        Costs.costs(positions)
    }
}

/// [`Costs`] of the positions `offset..` (a pack of a history suffix).
struct Shifted(usize);

impl CostSource for Shifted {
    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        let global: Vec<usize> = positions.iter().map(|&p| p + self.0).collect();
        Costs.costs(&global)
    }
}

fn unit_cost(members: &[usize]) -> u64 {
    members.iter().map(|&p| 1 + (p % 7) as u64).sum()
}

/// Where the window of `budget` starts when every unit's cost is known: the walk newest
/// unit first from the cut of the tail until the costs pass the budget, then the latest cut
/// the rules allow at or before the oldest unit walked (0 when the walk never passes it).
fn expected_window(idx: &GraphIndex, case: &Case, full: &Graph, budget: u64) -> usize {
    let g = idx.graph();
    let regroup = tightest_cut(idx, case, full, case.synced);
    let (mut sum, mut start) = (0u64, regroup);
    for p in (0..regroup).rev() {
        let unit = &g.units[g.unit_of[p]];
        if unit.members.last() != Some(&p) || unit.is_input_only() || !unit.is_valid() {
            continue;
        }
        sum += unit_cost(&unit.members);
        start = start.min(unit.members[0]);
        if sum > budget {
            return tightest_cut(idx, case, full, start);
        }
    }
    0
}

/// Windows on every shape in every region: a contiguous pack of the whole history costs
/// nothing before the window, and a pack of the window alone sends the same items with the
/// same totals. On valid histories with every cost known, the window starts exactly where
/// the budget's reach and the item rules put it.
#[test]
fn windows_pack_like_the_whole_history_on_every_shape() {
    let mut m = Maker::new(0x5EED_0002, "w");
    let mut windowed = 0;
    let mut valid_cases = 0;
    for id in 0..1200 {
        let broken = if m.rng.chance(2) { None } else { Some(4) };
        let case = Case::draw(&mut m, 60, broken);
        let idx = build_index(&mut m, &case, id);
        let tail = case.tail();
        let full = build_graph(&case.hm, &case.nm);
        let budget = m.rng.below(200) as u64;
        let exact = broken.is_none() || m.rng.chance(2);
        let known: Vec<bool> = (0..case.synced)
            .map(|_| exact || m.rng.below(3) != 0)
            .collect();
        let window = idx
            .window(&tail, budget, |members| {
                Ok::<u64, ()>(
                    members
                        .iter()
                        .map(|&p| if known[p] { 1 + (p % 7) as u64 } else { 1 })
                        .sum(),
                )
            })
            .unwrap();
        let w = window.start;
        assert!(w <= case.synced, "case {id}");
        assert_eq!(idx.cut_from(w, &tail), w, "case {id}: a window is a cut");
        assert!(exact_at(&idx, &case, &full, w), "case {id}: window {w}");
        if w == 0 {
            assert!(
                window.fits || window.pull.is_some(),
                "case {id}: {window:?}"
            );
        }
        if broken.is_none() {
            valid_cases += 1;
            assert_eq!(
                w,
                expected_window(&idx, &case, &full, budget),
                "case {id}: {window:?}"
            );
            if w > 0 {
                windowed += 1;
            }
        }
        let o = PackOptions {
            budget,
            output_reserve: m.rng.below(6) as u64,
            context_tokens: m.rng.below(6) as u64,
            policy: Policy::Contiguous,
        };
        assert_window_packs_like_whole(id, &case, w, &o);
    }
    assert!(
        windowed * 2 > valid_cases,
        "only {windowed} of {valid_cases} valid cases had a window"
    );
}

fn assert_window_packs_like_whole(id: usize, case: &Case, w: usize, o: &PackOptions) {
    let full = build_graph(&case.hm, &case.nm);
    let part = build_graph(&case.hm[w..], &case.nm);
    let all: Vec<ItemMeta> = case.hm.iter().chain(&case.nm).cloned().collect();
    let part_all: Vec<ItemMeta> = case.hm[w..].iter().chain(&case.nm).cloned().collect();
    let mut rec = Recording(Vec::new());
    let a = pack(&full, &all, &mut rec, o, None);
    let b = pack(&part, &part_all, &mut Shifted(w), o, None);
    match (a, b) {
        (Ok(a), Ok(b)) => {
            assert!(
                rec.0.iter().all(|&p| p >= w),
                "case {id}: costed before {w}"
            );
            let shifted: Vec<usize> = b.kept_history.iter().map(|p| p + w).collect();
            assert_eq!(a.kept_history, shifted, "case {id}: kept");
            let totals = |r: &protoprompt_core::pack::PackResult| {
                (
                    r.new_input_tokens,
                    r.dependency_tokens,
                    r.history_tokens,
                    r.used(),
                )
            };
            assert_eq!(totals(&a), totals(&b), "case {id}: totals");
        }
        (Err(a), Err(b)) => assert_eq!(
            std::mem::discriminant(&a),
            std::mem::discriminant(&b),
            "case {id}: {a} / {b}"
        ),
        (a, b) => panic!("case {id}: full {a:?} vs window {b:?}"),
    }
}

// ------------------------------------------------------------------------- directed cases

fn user(text: &str) -> Value {
    json!({"role":"user","content":text})
}

fn msg(id: &str) -> Value {
    json!({"type":"message","role":"assistant","id":id,"status":"completed","content":[]})
}

fn search_call(id: &str) -> Value {
    json!({"type":"tool_search_call","id":id,"arguments":{},"status":"completed"})
}

fn search_out(id: &str, status: &str) -> Value {
    json!({"type":"tool_search_output","id":id,"tools":[],"status":status})
}

/// A chat-like history of `turns` turns with a complete anonymous search in each fifth.
fn turns(turns: usize) -> Vec<Value> {
    let mut h = Vec::new();
    for i in 0..turns {
        h.push(user(&format!("q{i}")));
        if i % 5 == 2 {
            h.push(search_call(&format!("ts{i}")));
            h.push(search_out(&format!("tso{i}"), "completed"));
        }
        h.push(msg(&format!("m{i}")));
    }
    h
}

/// `turns` turns of a question and an answer.
fn chat(turns: usize) -> Vec<Value> {
    (0..turns)
        .flat_map(|i| [user(&format!("q{i}")), msg(&format!("c{i}"))])
        .collect()
}

fn index_of(items: &[Value]) -> GraphIndex {
    let mut idx = GraphIndex::new();
    idx.extend(metas(items));
    idx
}

/// The defect of issue 21: a streamed anonymous search (one call, then `in_progress` ...
/// `completed` chunks, stored as separate items) left an "open output" in the cut's count,
/// which then fell back to 0. Wherever it sits, the cut now stays at its own turn.
#[test]
fn a_streamed_anonymous_search_keeps_the_cut_at_its_turn() {
    let streamed = vec![
        user("find a tool"),
        json!({"type":"reasoning","id":"rs_s","summary":[],"encrypted_content":"e"}),
        search_call("ts_s"),
        search_out("tso_s1", "in_progress"),
        search_out("tso_s2", "in_progress"),
        search_out("tso_s3", "completed"),
        msg("m_s"),
    ];
    // In the history: a new user message cuts at the end; a window reads the newest turns.
    let mut h = turns(60);
    h.extend(streamed.clone());
    h.extend(turns(3).into_iter().map(|mut v| {
        if let Some(id) = v.get("id").and_then(Value::as_str) {
            v["id"] = json!(format!("late_{id}"));
        }
        v
    }));
    let idx = index_of(&h);
    let next = metas(&[user("next")]);
    assert_eq!(idx.cut(&next), h.len());
    let w = idx
        .window(&next, 20, |m| Ok::<u64, ()>(m.len() as u64 * 3))
        .unwrap();
    assert!(w.start > h.len() - 20, "{w:?}");
    // In an appended block (after what the index holds), and at its very end.
    let idx = index_of(&turns(60));
    let mut tail = metas(&streamed);
    tail.push(metas(&[user("next")]).remove(0));
    assert_eq!(idx.cut(&tail), idx.len());
    let w = idx
        .window(&tail, 10, |m| Ok::<u64, ()>(m.len() as u64 * 3))
        .unwrap();
    assert!(w.start > 100, "{w:?}");
    // Across the boundary: the call in history, its chunks in the new input. The cut takes
    // the call with its reasoning, nothing before.
    let mut h = turns(60);
    let n = h.len();
    h.extend(streamed[..3].to_vec());
    let idx = index_of(&h);
    let chunks = metas(&streamed[3..6]);
    let cut = idx.cut_explained(h.len(), &chunks);
    assert_eq!(cut.position, n + 1, "{cut:?}");
    // Appended with the chunks split between the appended rows and the new input.
    let idx = index_of(&h[..n + 2]);
    let tail = metas(&[
        streamed[2].clone(),
        streamed[3].clone(),
        streamed[4].clone(),
    ]);
    assert_eq!(idx.cut(&tail), n + 1);
}

/// Where a streamed search's chunks do pair with an earlier call, the cut follows exactly
/// as far as the graph's pairing goes, and says so.
#[test]
fn anonymous_pairing_across_the_cut_moves_it_to_the_earlier_call() {
    // An unanswered anonymous call early on: the stream's last chunk pairs with it.
    let mut h = vec![user("a"), search_call("ts_dangling"), msg("m0")];
    h.extend(turns(30));
    let streamed_call = h.len() + 1;
    h.extend([user("b"), search_call("ts_s")]);
    let idx = index_of(&h);
    let chunks = metas(&[
        search_out("o1", "in_progress"),
        search_out("o2", "completed"),
    ]);
    let cut = idx.cut_explained(h.len(), &chunks);
    assert_eq!(cut.position, 1, "{cut:?}");
    assert_eq!(
        cut.pull,
        Some(Pull {
            tie: Tie::AnonymousSearch,
            from: h.len() + 1,
            to: 1
        })
    );
    let mut all = metas(&h);
    all.extend(chunks.clone());
    let full = build_graph(&metas(&h), &chunks);
    assert_eq!(full.unit_of[1], full.unit_of[streamed_call]);
    // Without the dangling call, only the stream's own call.
    let mut h2 = vec![user("a"), msg("m0")];
    h2.extend(turns(30));
    h2.extend([user("b"), search_call("ts_s")]);
    let idx = index_of(&h2);
    assert_eq!(idx.cut(&chunks), h2.len() - 1);
    // A leftover chunk with no call of its own continues the newest earlier call.
    let mut h3 = vec![
        user("a"),
        search_call("ts0"),
        search_out("o0", "in_progress"),
    ];
    h3.extend(chat(30));
    let idx = index_of(&h3);
    let late = metas(&[search_out("o_late", "completed")]);
    let cut = idx.cut_explained(h3.len(), &late);
    assert_eq!(cut.position, 1);
    assert_eq!(cut.pull.map(|p| p.tie), Some(Tie::AnonymousSearch));
    // An anonymous output with no anonymous call anywhere before it relates to nothing.
    let mut h4 = chat(30);
    h4.push(user("z"));
    let idx = index_of(&h4);
    assert_eq!(idx.cut(&late), idx.len());
}

/// A window that cannot start after 0 says why: the budget reaches the oldest unit, or a
/// relation ties the newest items to the oldest.
#[test]
fn a_window_at_zero_says_why() {
    let h = turns(40);
    let idx = index_of(&h);
    let next = metas(&[user("next")]);
    let w = idx
        .window(&next, 10_000, |m| Ok::<u64, ()>(m.len() as u64))
        .unwrap();
    assert_eq!((w.start, w.fits, w.pull), (0, true, None));
    // The new input answers an approval requested at the very start.
    let mut h = vec![
        json!({"type":"mcp_approval_request","id":"mcpr_old","name":"t","server_label":"s","arguments":"{}"}),
    ];
    h.extend(turns(40));
    let idx = index_of(&h);
    let answer = metas(&[
        json!({"type":"mcp_approval_response","approval_request_id":"mcpr_old","approve":true}),
    ]);
    let w = idx
        .window(&answer, 20, |m| Ok::<u64, ()>(m.len() as u64))
        .unwrap();
    assert_eq!((w.start, w.fits), (0, false), "{w:?}");
    let pull = w.pull.expect("a reason");
    assert_eq!(
        (pull.tie, pull.from, pull.to),
        (Tie::ApprovalRequestId, h.len(), 0)
    );
    assert_eq!(
        pull.describe(h.len()),
        "the approval_request_id of new_input[0] is that of history[0]"
    );
    let w = idx
        .window(&metas(&[user("x")]), 20, |m| Ok::<u64, ()>(m.len() as u64))
        .unwrap();
    assert!(w.start > 50, "{w:?}");
    // The same hosted call id at the start and near the end: one unit (SDK de-duplication).
    let ws = json!({"type":"web_search_call","id":"ws_same","status":"completed","action":{}});
    let mut h = vec![user("a"), ws.clone()];
    h.extend(turns(40));
    h.extend([user("z"), ws]);
    let idx = index_of(&h);
    let w = idx
        .window(&next, 20, |m| Ok::<u64, ()>(m.len() as u64))
        .unwrap();
    assert_eq!(w.start, 1, "{w:?}");
    assert!(!w.fits);
    let pull = w.pull.expect("a reason");
    assert_eq!((pull.tie, pull.to), (Tie::Unit, 1));
    assert_eq!(
        pull.describe(h.len()),
        format!("history[1] and history[{}] are one unit", h.len() - 1)
    );
}
