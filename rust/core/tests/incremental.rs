//! The incremental history index gives exactly the units and packs of the full graph, for
//! random histories (with relations across any boundary) appended in random blocks, popped,
//! and saved to / loaded from snapshots in between; damaged snapshots are refused or load
//! into an index that stays in bounds.

use proptest::prelude::{any, ProptestConfig};
use proptest::strategy::Strategy;
use protoprompt_core::graph::{build_graph, Graph, GraphView};
use protoprompt_core::incremental::Tie;
use protoprompt_core::incremental::{GraphIndex, SnapshotError};
use protoprompt_core::items::ItemMeta;
use protoprompt_core::mask::Masking;
use protoprompt_core::pack::{
    pack, pack_view, pack_view_masked, CostFailure, CostSource, PackOptions, Policy,
};
use serde_json::{json, Value};

/// xorshift64*: a small deterministic generator (the seeds below are the test cases).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

// "__fake_id__" is the placeholder Chat Completions models give every item.
const IDS: [&str; 6] = ["a", "b", "c", "d", "", "__fake_id__"];
const STATUSES: [&str; 4] = ["in_progress", "completed", "incomplete", "weird"];

fn random_item(r: &mut Rng) -> Value {
    let id = r.pick(&IDS);
    let status = r.pick(&STATUSES);
    let caller = if r.below(5) == 0 {
        json!({"type":"program","caller_id": r.pick(&IDS)})
    } else {
        json!({"type":"direct"})
    };
    match r.below(20) {
        0..=3 => json!({"role":"user","content":"hi"}),
        4 => {
            // A message id never relates items, even when it equals another item's id.
            let mid = if r.below(2) == 0 {
                format!("m{}", r.below(4))
            } else {
                id.to_string()
            };
            json!({"type":"message","role":"assistant","id":mid,"status":"completed","content":[]})
        }
        5 => {
            let rid = if r.below(3) == 0 {
                "__fake_id__".to_string()
            } else {
                format!("rs{}", r.below(3))
            };
            json!({"type":"reasoning","id":rid,"summary":[]})
        }
        6 => json!({"type":"reasoning","encrypted_content":"e","summary":[]}),
        7 => json!({"type":"function_call","id":r.pick(&IDS),"call_id":id,"name":"f",
                    "arguments":"{}","caller":caller}),
        8 => json!({"type":"function_call_output","call_id":id,"output":"x","caller":caller}),
        9 => json!({"type":"shell_call","call_id":id,"status":status,"action":{}}),
        10 => json!({"type":"shell_call_output","call_id":id,"status":status,"output":[]}),
        11 => json!({"type":"tool_search_call","status":"completed","arguments":{}}),
        12 => json!({"type":"tool_search_output","status":status,"tools":[]}),
        13 => json!({"type":"program","call_id":id,"code":"x"}),
        14 => json!({"type":"program_output","call_id":id,"status":status,"output":"o"}),
        15 => json!({"type":"mcp_approval_request","id":id,"name":"t","arguments":"{}",
                     "server_label":"s"}),
        16 => json!({"type":"mcp_approval_response","approval_request_id":id,"approve":true}),
        17 => json!({"type":"mcp_call","id":format!("mc{}", r.below(3)),
                     "approval_request_id":id,"name":"t","arguments":"{}","server_label":"s"}),
        18 => json!({"type":"web_search_call","id":format!("ws{}", r.below(3)),
                     "status":"completed","action":{}}),
        _ => match r.below(3) {
            0 => json!({"type":"item_reference","id":id}),
            1 => json!({"role":"tool","tool_call_id":id,"content":"x"}),
            _ => json!({"type":"compaction_trigger"}),
        },
    }
}

fn metas(items: &[Value]) -> Vec<ItemMeta> {
    items
        .iter()
        .map(|v| ItemMeta::from_json(v).unwrap())
        .collect()
}

type UnitSummary = (Vec<usize>, Vec<&'static str>, bool, bool);

fn summary(view: GraphView<'_>) -> Vec<UnitSummary> {
    (0..view.unit_count())
        .map(|u| {
            let unit = view.unit(u);
            let positions: Vec<usize> = unit.problems.iter().map(|p| p.position).collect();
            assert!(positions.iter().all(|p| unit.members.contains(p)));
            (
                unit.members.clone(),
                unit.reasons().map(|r| r.code()).collect(),
                unit.contains_new,
                unit.input_only,
            )
        })
        .collect()
}

/// `idx` saved to a snapshot (with `case` attached) and loaded back.
fn reloaded(idx: &GraphIndex, case: usize) -> GraphIndex {
    let binding = format!("case {case}");
    let bytes = idx.to_snapshot(&case, binding.as_bytes());
    let (loaded, attached) =
        GraphIndex::from_snapshot::<usize>(&bytes, binding.as_bytes()).unwrap();
    assert_eq!(
        GraphIndex::from_snapshot::<usize>(&bytes, b"another session").err(),
        Some(SnapshotError::Unbound)
    );
    assert_eq!(attached, case);
    assert_eq!(loaded.len(), idx.len());
    assert_eq!(
        loaded.graph(),
        idx.graph(),
        "case {case}: graph after reload"
    );
    loaded
}

/// Cost = 1 + position mod 7 (deterministic, position-based).
struct Costs;

impl CostSource for Costs {
    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        Ok(positions.iter().map(|&p| 1 + (p % 7) as u64).collect())
    }
}

/// An index built from `hm` appended in random blocks (with random reservations); after
/// each block its graph equals a fresh one.
fn append_in_blocks(rng: &mut Rng, hm: &[ItemMeta], case: usize) -> GraphIndex {
    let n_hist = hm.len();
    let mut idx = GraphIndex::new();
    let mut at = 0;
    while at < n_hist {
        let k = 1 + rng.below(n_hist - at);
        if rng.below(3) == 0 {
            idx.reserve(rng.below(40));
        }
        idx.extend(hm[at..at + k].to_vec());
        at += k;
        assert_eq!(
            idx.graph(),
            &build_graph(&hm[..at], &[]),
            "case {case} at {at}"
        );
    }
    idx
}

/// Pops (truncations or rebuilds) and re-appends, several times: each must equal a fresh
/// graph, and the new input's view after a pop must equal the full graph's.
fn pop_and_reextend(
    rng: &mut Rng,
    mut idx: GraphIndex,
    hm: &[ItemMeta],
    nm: &[ItemMeta],
    case: usize,
) -> GraphIndex {
    let n_hist = hm.len();
    for _ in 0..rng.below(4) {
        if n_hist == 0 {
            break;
        }
        let keep = n_hist - 1 - rng.below(n_hist.min(6));
        let keep = if rng.below(5) == 0 {
            rng.below(n_hist)
        } else {
            keep
        };
        if rng.below(4) == 0 {
            idx.rebuild(keep);
        } else {
            idx.truncate(keep);
        }
        assert_eq!(idx.len(), keep);
        assert_eq!(
            idx.graph(),
            &build_graph(&hm[..keep], &[]),
            "case {case} truncate {keep}"
        );
        let tail = idx.tail(nm);
        assert_eq!(
            summary(idx.view(&tail)),
            summary(GraphView::whole(&build_graph(&hm[..keep], nm))),
            "case {case}: new input after truncate {keep}"
        );
        if rng.below(3) == 0 {
            idx = reloaded(&idx, case);
        }
        let mut at = keep;
        while at < n_hist {
            let k = 1 + rng.below(n_hist - at);
            idx.extend(hm[at..at + k].to_vec());
            at += k;
        }
        assert_eq!(
            idx.graph(),
            &build_graph(hm, &[]),
            "case {case} re-extended"
        );
    }
    idx
}

/// Packing the whole graph and the index's view gives the same result and decisions, for
/// both policies, without and with pinned history positions.
fn assert_packs_agree(
    rng: &mut Rng,
    full: &Graph,
    view: GraphView<'_>,
    hm: &[ItemMeta],
    nm: &[ItemMeta],
    case: usize,
) {
    let mut all = hm.to_vec();
    all.extend(nm.iter().cloned());
    for policy in [Policy::Contiguous, Policy::Greedy] {
        let o = PackOptions {
            budget: rng.below(150) as u64,
            output_reserve: rng.below(5) as u64,
            context_tokens: 0,
            policy,
        };
        let a = pack(full, &all, &mut Costs, &o, None);
        let is_user = |p: usize| hm[p].is_user_message();
        let b = pack_view(view, &is_user, &mut Costs, &o, &[], None);
        if let (Ok(a), Ok(b)) = (&a, &b) {
            assert_eq!(
                a.decisions(GraphView::whole(full)),
                b.decisions(view),
                "case {case} {policy:?}"
            );
            assert_coherent(GraphView::whole(full), &is_user, a, &[], case);
        }
        assert_eq!(a, b, "case {case} {policy:?}");
        // Pinned history positions: the same on the whole graph and the index's view.
        let pinned: Vec<usize> = if hm.is_empty() {
            Vec::new()
        } else {
            (0..rng.below(3)).map(|_| rng.below(hm.len())).collect()
        };
        let a = pack_view(
            GraphView::whole(full),
            &is_user,
            &mut Costs,
            &o,
            &pinned,
            None,
        );
        let b = pack_view(view, &is_user, &mut Costs, &o, &pinned, None);
        if let Ok(a) = &a {
            assert_coherent(GraphView::whole(full), &is_user, a, &pinned, case);
            for &q in &pinned {
                assert!(a.kept_history.contains(&q), "case {case}: pinned {q} kept");
            }
        }
        assert_eq!(a, b, "case {case} {policy:?} pinned {pinned:?}");
    }
}

#[test]
fn index_equals_full_graph_and_pack() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for case in 0..3000 {
        let n_hist = rng.below(30);
        let hist: Vec<Value> = (0..n_hist).map(|_| random_item(&mut rng)).collect();
        let n_new = 1 + rng.below(3);
        let new: Vec<Value> = (0..n_new).map(|_| random_item(&mut rng)).collect();
        let (hm, nm) = (metas(&hist), metas(&new));

        let mut idx = append_in_blocks(&mut rng, &hm, case);
        if rng.below(2) == 0 {
            idx = reloaded(&idx, case);
        }
        let idx = pop_and_reextend(&mut rng, idx, &hm, &nm, case);

        for (p, m) in hm.iter().enumerate() {
            assert_eq!(&idx.meta(p), m, "case {case}: stored item {p} round-trips");
        }
        let full: Graph = build_graph(&hm, &nm);
        let tail = idx.tail(&nm);
        let view = idx.view(&tail);
        assert_eq!(
            summary(view),
            summary(GraphView::whole(&full)),
            "case {case}"
        );
        for u in 0..view.unit_count() {
            for &m in &view.unit(u).members {
                assert_eq!(view.unit_of(m), u, "case {case}");
            }
        }
        assert_packs_agree(&mut rng, &full, view, &hm, &nm, case);
    }
}

/// The kept optional history starts at a user message: every kept optional unit's turn has
/// its opening user message kept (or mandatory), and a kept unit before the first user
/// message means every candidate there is kept.
fn assert_coherent(
    view: GraphView<'_>,
    is_user: &dyn Fn(usize) -> bool,
    r: &protoprompt_core::pack::PackResult,
    pinned: &[usize],
    case: usize,
) {
    use protoprompt_core::pack::Decision;
    let decision = |u: usize| r.decision_of(view, u).map(|d| d.decision);
    let candidate = |u: usize| {
        let unit = view.unit(u);
        !unit.contains_new
            && unit.is_valid()
            && !unit.is_input_only()
            && !unit.members.iter().any(|p| pinned.contains(p))
    };
    for u in 0..view.unit_count() {
        if decision(u) != Some(Decision::Kept) {
            continue;
        }
        let newest = *view
            .unit(u)
            .members
            .iter()
            .filter(|&&p| p < view.n_history())
            .max()
            .unwrap();
        match (0..=newest).rev().find(|&q| is_user(q)) {
            Some(q) => assert!(
                decision(view.unit_of(q)).is_some_and(|d| d.is_kept()),
                "case {case}: unit {u} kept but its turn's user message {q} is not"
            ),
            None => {
                for v in 0..view.unit_count() {
                    let last = *view.unit(v).members.last().unwrap();
                    let before_first_user = last < view.n_history() && !(0..=last).any(is_user);
                    if before_first_user && candidate(v) {
                        assert_eq!(decision(v), Some(Decision::Kept), "case {case}: preamble");
                    }
                }
            }
        }
    }
}

fn random_index(rng: &mut Rng, n: usize) -> (GraphIndex, Vec<ItemMeta>) {
    let hist: Vec<Value> = (0..n).map(|_| random_item(rng)).collect();
    let hm = metas(&hist);
    let mut idx = GraphIndex::new();
    idx.extend(hm.clone());
    (idx, hm)
}

/// Everything a caller may do with a loaded index; must not panic whatever was loaded.
fn exercise(idx: &mut GraphIndex, more: &[ItemMeta]) {
    for p in 0..idx.len() {
        let _ = idx.meta(p);
        let _ = idx.is_user_message(p);
    }
    let tail = idx.tail(more);
    let view = idx.view(&tail);
    let is_user = |_: usize| false;
    let o = PackOptions {
        budget: 40,
        output_reserve: 0,
        context_tokens: 0,
        policy: Policy::Greedy,
    };
    let _ = pack_view(view, &is_user, &mut Costs, &o, &[], None);
    let n = idx.len();
    idx.extend(more.to_vec());
    idx.truncate(n / 2);
    idx.extend(more.to_vec());
}

fn with_checksum(mut bytes: Vec<u8>) -> Vec<u8> {
    use siphasher::sip128::{Hasher128, SipHasher13};
    use std::hash::Hasher;
    let mut h = SipHasher13::new();
    h.write(&bytes[28..]);
    bytes[12..28].copy_from_slice(&h.finish128().as_bytes());
    bytes
}

#[test]
fn damaged_snapshots_are_refused_or_stay_in_bounds() {
    let mut rng = Rng(0x5151_7A7A_0F0F_3C3C);
    let mut loaded_damaged = 0;
    for case in 0..60 {
        let n = 1 + rng.below(25);
        let (idx, _) = random_index(&mut rng, n);
        let more = metas(&(0..3).map(|_| random_item(&mut rng)).collect::<Vec<_>>());
        let bytes = idx.to_snapshot(&vec![case as u64; idx.len()], b"rows");
        // Cut short anywhere: refused.
        for len in 0..bytes.len() {
            assert!(
                GraphIndex::from_snapshot::<Vec<u64>>(&bytes[..len], b"rows").is_err(),
                "case {case}: {len} of {} bytes loaded",
                bytes.len()
            );
        }
        // Any changed byte without a matching checksum: refused.
        for _ in 0..40 {
            let mut bad = bytes.clone();
            let at = rng.below(bad.len());
            bad[at] ^= 1 << rng.below(8);
            let err = GraphIndex::from_snapshot::<Vec<u64>>(&bad, b"rows").err();
            match at {
                0..=11 => assert!(
                    matches!(err, Some(SnapshotError::Foreign(_))),
                    "case {case}"
                ),
                _ => assert!(
                    matches!(err, Some(SnapshotError::Damaged(_))),
                    "case {case}"
                ),
            }
        }
        // Changed payload bytes with a recomputed checksum (what a bug could write): either
        // refused, or an index on which every operation stays in bounds.
        for _ in 0..200 {
            let mut bad = bytes.clone();
            for _ in 0..1 + rng.below(3) {
                let at = 28 + rng.below(bad.len() - 28);
                bad[at] = rng.next() as u8;
            }
            if let Ok((mut loaded, _)) =
                GraphIndex::from_snapshot::<Vec<u64>>(&with_checksum(bad), b"rows")
            {
                loaded_damaged += 1;
                exercise(&mut loaded, &more);
            }
        }
    }
    // Some damage leaves a consistent index (e.g. a changed string byte); the loop above
    // must have exercised such loads, or it tested nothing.
    assert!(loaded_damaged > 0);
}

#[test]
fn a_snapshot_of_another_layout_is_foreign() {
    let mut rng = Rng(7);
    let (idx, _) = random_index(&mut rng, 10);
    let mut bytes = idx.to_snapshot(&(), b"");
    bytes[8] = bytes[8].wrapping_add(1);
    let err = GraphIndex::from_snapshot::<()>(&bytes, b"").unwrap_err();
    assert!(matches!(err, SnapshotError::Foreign(_)), "{err}");
    assert!(err.to_string().contains("layout"), "{err}");
    // An empty index round-trips too.
    let (empty, ()) =
        GraphIndex::from_snapshot(&GraphIndex::new().to_snapshot(&(), b""), b"").unwrap();
    assert!(empty.is_empty());
}

/// What a damaged or forged snapshot may do to its bytes.
#[derive(Debug, Clone)]
enum Damage {
    /// Set the byte at (position mod length).
    Set(usize, u8),
    /// Cut after (position mod length) bytes.
    Cut(usize),
    /// Insert a byte at (position mod length).
    Insert(usize, u8),
}

fn damage() -> impl Strategy<Value = Damage> {
    let at = 0usize..1 << 20;
    proptest::prop_oneof![
        (at.clone(), any::<u8>()).prop_map(|(p, b)| Damage::Set(p, b)),
        at.clone().prop_map(Damage::Cut),
        (at, any::<u8>()).prop_map(|(p, b)| Damage::Insert(p, b)),
    ]
}

fn apply(bytes: &mut Vec<u8>, d: &Damage) {
    let len = bytes.len().max(1);
    match *d {
        Damage::Set(p, b) => {
            if let Some(x) = bytes.get_mut(p % len) {
                *x = b;
            }
        }
        Damage::Cut(p) => bytes.truncate(p % len),
        Damage::Insert(p, b) => bytes.insert(p % len, b),
    }
}

proptest::proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Any snapshot bytes — damaged, cut, grown, with or without a recomputed checksum,
    /// loaded with its own or another binding — are refused, or load into an index on which
    /// every operation stays in bounds. Without a recomputed checksum any change is refused;
    /// another binding is always refused.
    #[test]
    fn any_snapshot_bytes_are_refused_or_stay_in_bounds(
        seed in 1u64..u64::MAX,
        n in 0usize..20,
        damages in proptest::collection::vec(damage(), 0..4),
        fix_checksum in any::<bool>(),
        other_binding in any::<bool>(),
    ) {
        let mut rng = Rng(seed);
        let (idx, _) = random_index(&mut rng, n);
        let more = metas(&(0..3).map(|_| random_item(&mut rng)).collect::<Vec<_>>());
        let costs: Vec<u64> = (0..idx.len() as u64).collect();
        let original = idx.to_snapshot(&costs, b"db/session/rows");
        let mut bytes = original.clone();
        for d in &damages {
            apply(&mut bytes, d);
        }
        if fix_checksum && bytes.len() >= 28 {
            bytes = with_checksum(bytes);
        }
        let binding: &[u8] = if other_binding { b"db/other/rows" } else { b"db/session/rows" };
        match GraphIndex::from_snapshot::<Vec<u64>>(&bytes, binding) {
            Ok((mut loaded, attached)) => {
                proptest::prop_assert!(!other_binding, "loaded under another binding");
                if !fix_checksum {
                    proptest::prop_assert_eq!(&bytes, &original, "a changed snapshot loaded");
                }
                if bytes == original {
                    proptest::prop_assert_eq!(&attached, &costs);
                    proptest::prop_assert_eq!(loaded.graph(), idx.graph());
                }
                exercise(&mut loaded, &more);
            }
            Err(e) => {
                proptest::prop_assert!(bytes != original || other_binding, "{}", e);
                if other_binding && bytes == original {
                    proptest::prop_assert_eq!(e, SnapshotError::Unbound);
                }
            }
        }
    }
}

#[test]
fn undo_to_a_mark_restores_the_index_byte_for_byte() {
    let mut rng = Rng(0xC0FF_EE00_1234_5678);
    for case in 0..300 {
        let n = rng.below(30);
        let (mut idx, mut hm) = random_index(&mut rng, n);
        if rng.below(3) == 0 && !hm.is_empty() {
            let keep = rng.below(hm.len());
            idx.truncate(keep); // strings of popped items stay in the arena: still exact
            hm.truncate(keep);
        }
        let before = idx.to_snapshot(&(), b"");
        let mark = idx.mark();
        let more: Vec<Value> = (0..1 + rng.below(40))
            .map(|_| random_item(&mut rng))
            .collect();
        if rng.below(2) == 0 {
            idx.reserve(rng.below(5000));
        }
        idx.extend(metas(&more));
        idx.undo_to(mark);
        assert_eq!(idx.to_snapshot(&(), b""), before, "case {case}");
        assert_eq!(idx.graph(), &build_graph(&hm, &[]), "case {case}");
        // And it goes on like an index that never saw those items.
        let next = metas(&(0..5).map(|_| random_item(&mut rng)).collect::<Vec<_>>());
        idx.extend(next.clone());
        hm.extend(next);
        assert_eq!(idx.graph(), &build_graph(&hm, &[]), "case {case} after");
    }
}

/// An item of an agentic history: turns of user messages, reasoning, calls with their
/// outputs (unique call ids, so most relations are local) and answers; with `noisy`, one
/// item in five is any item of [`random_item`] (relations anywhere, invalid units).
fn agentic_item(r: &mut Rng, i: usize, noisy: bool) -> Value {
    if noisy && r.below(5) == 0 {
        return random_item(r);
    }
    let call = format!("c{}", i.saturating_sub(r.below(3)));
    match r.below(8) {
        0 | 1 => json!({"role":"user","content":"u"}),
        2 => json!({"type":"reasoning","id":format!("rs{i}"),"summary":[]}),
        3 => json!({"type":"function_call","call_id":format!("c{i}"),"name":"f","arguments":"{}"}),
        4 => json!({"type":"function_call_output","call_id":call,"output":"x"}),
        5 => json!({"type":"web_search_call","id":format!("ws{i}"),"status":"completed",
                    "action":{}}),
        _ => json!({"type":"message","role":"assistant","id":format!("m{i}"),
                    "status":"completed","content":[]}),
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

/// A random case of the window test: a history, the part of it the index has synced, and
/// the new input.
struct WindowCase {
    hm: Vec<ItemMeta>,
    nm: Vec<ItemMeta>,
    synced: usize,
}

fn random_window_case(rng: &mut Rng) -> WindowCase {
    let n_hist = rng.below(90);
    let noisy = rng.below(4) == 0;
    let hist: Vec<Value> = (0..n_hist).map(|i| agentic_item(rng, i, noisy)).collect();
    // The index holds the first `synced` items; the rest was appended by others since.
    let synced = n_hist - rng.below(n_hist.min(4) + 1);
    let n_new = 1 + rng.below(3);
    let new: Vec<Value> = (0..n_new)
        .map(|_| {
            if rng.below(2) == 0 {
                json!({"role":"user","content":"q"})
            } else {
                random_item(rng)
            }
        })
        .collect();
    WindowCase {
        hm: metas(&hist),
        nm: metas(&new),
        synced,
    }
}

/// The window `w` is a cut of the whole sequence, and its units are those of the whole history.
fn assert_window_is_a_cut(case: usize, c: &WindowCase, idx: &GraphIndex, w: usize) {
    let tail: Vec<ItemMeta> = c.hm[c.synced..]
        .iter()
        .chain(c.nm.iter())
        .cloned()
        .collect();
    assert_eq!(
        idx.cut_from(w, &tail),
        w,
        "case {case}: a cut is its own cut"
    );
    let mut short = GraphIndex::new();
    short.extend(c.hm[..w].to_vec());
    let rest: Vec<ItemMeta> = c.hm[w..].iter().chain(c.nm.iter()).cloned().collect();
    assert_eq!(
        short.cut(&rest),
        w,
        "case {case}: cut_from is the cut of the suffix"
    );
    let full = build_graph(&c.hm, &c.nm);
    let part = build_graph(&c.hm[w..], &c.nm);
    let mut whole: Vec<UnitSummary> = summary(GraphView::whole(&full))
        .into_iter()
        .filter(|u| u.0[0] >= w)
        .collect();
    for u in &mut whole {
        u.0.iter_mut().for_each(|p| *p -= w);
    }
    assert_eq!(
        whole,
        summary(GraphView::whole(&part)),
        "case {case}: window units"
    );
}

/// A contiguous pack of the whole sequence costs nothing before `w`, and a pack of the
/// window alone sends the same items with the same totals (or fails the same way).
fn assert_window_packs_like_whole(case: usize, c: &WindowCase, w: usize, o: &PackOptions) {
    let full = build_graph(&c.hm, &c.nm);
    let part = build_graph(&c.hm[w..], &c.nm);
    let all: Vec<ItemMeta> = c.hm.iter().chain(c.nm.iter()).cloned().collect();
    let part_all: Vec<ItemMeta> = c.hm[w..].iter().chain(c.nm.iter()).cloned().collect();
    let mut rec = Recording(Vec::new());
    let a = pack(&full, &all, &mut rec, o, None);
    let b = pack(&part, &part_all, &mut Shifted(w), o, None);
    match (a, b) {
        (Ok(a), Ok(b)) => {
            assert!(
                rec.0.iter().all(|&p| p >= w),
                "case {case}: costed {:?} before {w}",
                rec.0
            );
            let shifted: Vec<usize> = b.kept_history.iter().map(|p| p + w).collect();
            assert_eq!(a.kept_history, shifted, "case {case}: kept");
            let dep: Vec<usize> = b.dependency.iter().map(|p| p + w).collect();
            assert_eq!(a.dependency, dep, "case {case}: dependency");
            let totals = |r: &protoprompt_core::pack::PackResult| {
                (
                    r.new_input_tokens,
                    r.dependency_tokens,
                    r.history_tokens,
                    r.context_tokens,
                    r.used(),
                )
            };
            assert_eq!(totals(&a), totals(&b), "case {case}: totals");
        }
        (Err(a), Err(b)) => {
            // The same failure (positions are the window's, shifted).
            assert_eq!(
                std::mem::discriminant(&a),
                std::mem::discriminant(&b),
                "case {case}: {a} / {b}"
            );
        }
        (a, b) => panic!("case {case}: full {a:?} vs window {b:?}"),
    }
}

/// A windowed read is exact: for random histories, items appended since the index synced,
/// new input, budgets, reserves, context sizes and costs known exactly or only as a lower
/// bound, the contiguous pack of `history ++ new` costs and keeps nothing before
/// `window_start`, the window is a cut (its units are those of the whole history), and a
/// pack of the window alone sends the same items with the same totals.
#[test]
fn window_start_covers_everything_a_contiguous_pack_uses() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut windowed = 0;
    for case in 0..4000 {
        let c = random_window_case(&mut rng);
        let mut idx = GraphIndex::new();
        idx.extend(c.hm[..c.synced].to_vec());
        let tail: Vec<ItemMeta> = c.hm[c.synced..]
            .iter()
            .chain(c.nm.iter())
            .cloned()
            .collect();
        let budget = rng.below(120) as u64;
        // Some costs are known, the others only as the overhead-like lower bound 1.
        let known: Vec<bool> = (0..c.synced).map(|_| rng.below(3) != 0).collect();
        let w = idx
            .window_start(&tail, budget, |members| {
                Ok::<u64, ()>(
                    members
                        .iter()
                        .map(|&p| if known[p] { 1 + (p % 7) as u64 } else { 1 })
                        .sum(),
                )
            })
            .unwrap();
        assert!(w <= c.synced, "case {case}");
        if w > 0 {
            windowed += 1;
        }
        assert_window_is_a_cut(case, &c, &idx, w);
        let o = PackOptions {
            budget,
            output_reserve: rng.below(6) as u64,
            context_tokens: rng.below(6) as u64,
            policy: Policy::Contiguous,
        };
        assert_window_packs_like_whole(case, &c, w, &o);
    }
    assert!(windowed > 1000, "only {windowed} cases had a window");
}

/// Items appended since the index synced can make one of its valid units invalid (here a
/// second terminal chunk of a shell call's stream): the fill then skips that unit and goes
/// on to older ones, so the walk must not count the units the appended items regroup.
#[test]
fn window_start_does_not_count_units_the_appended_items_regroup() {
    let user = json!({"role":"user","content":"u"});
    let hist = vec![
        user.clone(),
        json!({"type":"message","role":"assistant","id":"m1","status":"completed","content":[]}),
        user.clone(),
        json!({"type":"shell_call","call_id":"s1","status":"completed","action":{}}),
        json!({"type":"shell_call_output","call_id":"s1","status":"completed","output":[]}),
    ];
    let appended =
        json!({"type":"shell_call_output","call_id":"s1","status":"completed","output":[]});
    let mut idx = GraphIndex::new();
    idx.extend(metas(&hist));
    let tail = metas(&[appended.clone(), json!({"role":"user","content":"q"})]);
    // Every item costs 10 (Costs10 below): counting the shell unit, the walk would pass the
    // budget at the user message before it and stop there.
    let w = idx
        .window_start(&tail, 25, |m| Ok::<u64, ()>(10 * m.len() as u64))
        .unwrap();
    let mut all = metas(&hist);
    all.push(tail[0].clone());
    let full = build_graph(&all, &tail[1..]);
    assert!(!full.units[full.unit_of[3]].is_valid());
    all.push(tail[1].clone());
    struct Costs10(Vec<usize>);
    impl CostSource for Costs10 {
        fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
            self.0.extend_from_slice(positions);
            Ok(vec![10; positions.len()])
        }
    }
    let o = PackOptions {
        budget: 25,
        ..PackOptions::default()
    };
    let mut costs = Costs10(Vec::new());
    let r = pack(&full, &all, &mut costs, &o, None).unwrap();
    // The fill skips the invalid shell unit, keeps the user message and misses at 1.
    assert_eq!(r.kept_history, vec![2]);
    assert!(
        costs.0.iter().all(|&p| p >= w),
        "window starts at {w}, the pack costed {:?}",
        costs.0
    );
}

/// A masked pack checks, before it masks a unit, that the rest of the unit's turn can fit
/// (by masked floors, back to the turn's user message): the masked window reaches back as
/// far as that check reads, so a masked pack of the window costs nothing before it (the
/// restart defect: "is before history_offset" when the snapshot had not counted there).
#[test]
fn a_masked_window_covers_the_turn_check_of_the_unit_it_stops_at() {
    let mut hist = vec![json!({"role":"user","content":"old"})];
    hist.push(json!({"role":"user","content":"run the batch"}));
    for i in 0..8 {
        hist.push(
            json!({"type":"function_call","call_id":format!("c{i}"),"name":"f","arguments":"{}"}),
        );
        hist.push(json!({"type":"function_call_output","call_id":format!("c{i}"),"output":"x"}));
    }
    let tail = metas(&[json!({"role":"user","content":"next"})]);
    let mut idx = GraphIndex::new();
    idx.extend(metas(&hist));
    // A call costs 10, an output 50 whole and 20 masked; its masked floor is an item's
    // overhead. The window of a masked pack counts outputs at their masked cost.
    let overhead = protoprompt_core::tokens::ITEM_OVERHEAD;
    let is_output = |p: usize| p >= 2 && p % 2 == 1;
    let lower =
        |m: &[usize]| Ok::<u64, ()>(m.iter().map(|&p| if is_output(p) { 20 } else { 10 }).sum());
    let floor = |m: &[usize]| {
        Ok::<u64, ()>(
            m.iter()
                .map(|&p| if is_output(p) { overhead } else { 10 })
                .sum(),
        )
    };
    let budget = 65;
    let plain = idx.window(&tail, budget, lower).unwrap();
    let masked = idx.window_masked(&tail, budget, lower, floor).unwrap();
    assert!(masked.start < plain.start, "{masked:?} vs {plain:?}");
    assert_eq!(masked.pull.map(|p| p.tie), Some(Tie::Turn));
    // With a budget the floors pass before the user message, the window stops there.
    let short = idx.window_masked(&tail, 25, lower, floor).unwrap();
    assert!(short.start > 1, "{short:?}");

    struct Costs(Vec<usize>);
    impl CostSource for Costs {
        fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
            self.0.extend_from_slice(positions);
            Ok(positions
                .iter()
                .map(|&p| if p >= 2 && p % 2 == 1 { 50 } else { 10 })
                .collect())
        }
        fn masked_costs(&mut self, members: &[usize]) -> Result<Vec<u64>, CostFailure> {
            self.0.extend_from_slice(members);
            Ok(members
                .iter()
                .map(|&p| if p >= 2 && p % 2 == 1 { 20 } else { 10 })
                .collect())
        }
        fn maskable(&self, p: usize) -> bool {
            p >= 2 && p % 2 == 1
        }
    }
    let mut all = metas(&hist);
    all.extend(tail.iter().cloned());
    let graph = build_graph(&all[..hist.len()], &tail);
    let is_user = |p: usize| all[p].is_user_message();
    let masking = Masking {
        excerpt_tokens: 16,
        after_turns: None,
    };
    for (budget, window) in [(65, masked), (25, short)] {
        let o = PackOptions {
            budget,
            ..PackOptions::default()
        };
        let mut costs = Costs(Vec::new());
        pack_view_masked(
            GraphView::whole(&graph),
            &is_user,
            &mut costs,
            &o,
            Some(masking),
            &[],
            None,
        )
        .unwrap();
        let costed: Vec<usize> = costs.0.into_iter().filter(|&p| p < hist.len()).collect();
        assert!(
            costed.iter().all(|&p| p >= window.start),
            "budget {budget}: the window starts at {}, the pack costed {costed:?}",
            window.start,
        );
        if budget == 65 {
            // The window of the rule without the turn check is too short for it: the defect.
            assert!(costed.iter().any(|&p| p < plain.start), "{costed:?}");
        }
    }
}
