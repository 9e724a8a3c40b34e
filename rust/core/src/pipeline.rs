//! Appending a long history to an [`IndexedHistory`] on two threads: the caller classifies
//! the next chunk of items (an embedding reads its own objects there, under its own lock)
//! while a scoped helper thread appends the previous chunk to the index, so a cold start
//! costs about the larger of the two instead of their sum. A failed classification puts the
//! index back as it was, memory included.

use crate::costs::{
    earlier_thinking, id_optional_follower, omittable_reasoning, reasoning_omittable_unit,
    CostEngine, CostFailure, CountStore, EarlierThinkingFree, ItemSource,
};
use crate::graph::GraphView;
use crate::incremental::GraphIndex;
use crate::indexed::IndexedHistory;
use crate::indexed::{counted_masked_window_start, counted_window_start};
use crate::items::ItemKind;
use crate::items::ItemMeta;
use crate::mask::{MaskMemo, MaskedCosts, MaskedField, Masking, ReasoningOmitted, ValueSource};
use crate::pack::{pack_view_masked, ContextHook, CostSource, PackError, PackOptions, PackResult};
use std::sync::Arc;

use crate::tokens::{CostBasis, TokenError};

/// Items classified per step (bounds the full-size copies: up to three chunks are alive
/// while pipelined). At 100k items, 2048 gave the speed of 4096 with a peak 6-8 MB lower
/// (4096: +13-19 MB over the unpipelined path, 1024: slower).
pub const CLASSIFY_CHUNK: usize = 2048;

/// Runs a wait, or work that needs no lock of the embedding's, with that lock released (the
/// Python binding: the GIL). `|f| f()` for a caller with no such lock.
pub type Blocking<'a> = &'a dyn Fn(&mut (dyn FnMut() + Send));

/// Run `f` once through `blocking`.
pub fn run_blocking<T: Send>(blocking: Blocking<'_>, f: impl FnOnce() -> T + Send) -> T {
    let mut f = Some(f);
    let mut out = None;
    blocking(&mut || {
        if let Some(f) = f.take() {
            out = Some(f());
        }
    });
    out.unwrap_or_else(|| panic!("a Blocking must run the closure it is given"))
}

impl IndexedHistory {
    /// Append `total` items, classified by `classify(first_position, count)` (at most
    /// [`CLASSIFY_CHUNK`] at a time, positions from `self.len()` on; fewer than `count`
    /// items ends the append). On an error of `classify` the index is put back as it was
    /// and the error returned.
    pub fn append_classified<E>(
        &mut self,
        total: usize,
        mut classify: impl FnMut(usize, usize) -> Result<Vec<ItemMeta>, E>,
        blocking: Blocking<'_>,
    ) -> Result<(), E> {
        let start = self.len();
        let mark = self.mark();
        let outcome = if total <= CLASSIFY_CHUNK {
            classify(start, total).map(|metas| run_blocking(blocking, || self.append(metas)))
        } else {
            self.append_pipelined(total, &mut classify, blocking)
        };
        if outcome.is_err() {
            run_blocking(blocking, || self.undo(mark));
        }
        outcome
    }

    fn append_pipelined<E>(
        &mut self,
        total: usize,
        classify: &mut dyn FnMut(usize, usize) -> Result<Vec<ItemMeta>, E>,
        blocking: Blocking<'_>,
    ) -> Result<(), E> {
        let mut position = self.len();
        let end = position + total;
        let (index, mut notes) = self.appender();
        std::thread::scope(|scope| {
            // A chunk and the number of items still to come after it.
            let (send, receive) = std::sync::mpsc::sync_channel::<(Vec<ItemMeta>, usize)>(1);
            let helper = scope.spawn(move || {
                let mut first = true;
                for (metas, rest) in receive {
                    index.extend(metas);
                    if std::mem::take(&mut first) && rest > 0 {
                        // Sized from the first chunk: the rest is stored without regrowth.
                        index.reserve(rest);
                    }
                }
            });
            let mut outcome = Ok(());
            while position < end {
                let metas = match classify(position, CLASSIFY_CHUNK.min(end - position)) {
                    Ok(metas) if metas.is_empty() => break, // fewer items than said
                    Ok(metas) => metas,
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                };
                position += metas.len();
                let rest = end.saturating_sub(position);
                notes.note(&metas, rest);
                // Wait for the helper (when it is behind) with the lock released.
                let sent = match send.try_send((metas, rest)) {
                    Err(std::sync::mpsc::TrySendError::Full(chunk)) => {
                        run_blocking(blocking, || send.send(chunk).is_ok())
                    }
                    other => other.is_ok(),
                };
                if !sent {
                    break; // the helper panicked: reported by the join below
                }
            }
            drop(send);
            if let Err(panic) = run_blocking(blocking, || helper.join()) {
                std::panic::resume_unwind(panic);
            }
            outcome
        })
    }
}

/// The window start a later `window_start` with `budget` finds from exact costs, counted
/// over `engine` for the history from `offset` on: `counted_window_start`, or with
/// `masking` `counted_masked_window_start` (masked costs kept in `masks`), behind one call.
/// Returns the start or the cost failure that ended the walk, and the tokenizer failure of
/// the masking wrapper (its position and error) if one ended it.
#[allow(clippy::too_many_arguments)]
pub fn counted_window<F: ItemSource, S: CountStore>(
    graph: &GraphIndex,
    engine: &mut CostEngine<'_, F, S>,
    masks: &mut MaskMemo,
    basis: CostBasis,
    masking: Option<Masking>,
    n_history: usize,
    budget: u64,
    offset: usize,
) -> (Result<usize, CostFailure>, Option<(usize, TokenError)>) {
    let Some(m) = masking else {
        return (counted_window_start(graph, engine, budget, offset), None);
    };
    let kinds = |p: usize| graph.kind(p);
    let mut masked = MaskedCosts::new(engine, basis, m.excerpt_tokens)
        .with_memo(masks, n_history)
        .with_kinds(&kinds);
    let walked = counted_masked_window_start(graph, &mut masked, budget, offset);
    let failure = masked.tokenizer_failure().map(|(p, e)| (p, e.clone()));
    (walked, failure)
}

/// What [`pack_indexed`] packed.
#[derive(Debug)]
pub struct Packed {
    /// The pack's result (omitted reasoning already taken out of its kept history).
    pub result: PackResult,
    /// The masked copies of the tool outputs it masked (`(position, copy)`).
    pub copies: Vec<(usize, Arc<MaskedField>)>,
    /// The reasoning positions left out of units sent masked (sorted; see
    /// [`earlier_reasoning`]).
    pub omitted: Vec<usize>,
    /// The members of those units to send without their `id` (sorted).
    pub stripped: Vec<usize>,
}

/// One change to the request a pack sends (its kept history, then the new input): the item
/// at `index` of the request (history `position`) goes as its masked copy (`masked`),
/// without its `id` (`strip_id`: when it has one), or both.
#[derive(Debug, Clone)]
pub struct RequestEdit {
    pub index: usize,
    pub position: usize,
    pub masked: Option<Arc<MaskedField>>,
    pub strip_id: bool,
}

impl Packed {
    /// The changes to the request, by position: a kept item with a masked copy, a kept item
    /// to send without its `id`, or both. The positions of the edits an embedding applies
    /// (sorted) are the result's masked positions.
    pub fn request_edits(&self) -> Vec<RequestEdit> {
        let kept = &self.result.kept_history;
        let mut edits: Vec<RequestEdit> = self
            .copies
            .iter()
            .filter_map(|(p, field)| {
                let index = kept.binary_search(p).ok()?; // never missing: a masked unit is kept
                Some(RequestEdit {
                    index,
                    position: *p,
                    masked: Some(Arc::clone(field)),
                    strip_id: false,
                })
            })
            .collect();
        edits.sort_by_key(|e| e.position);
        for &p in &self.stripped {
            match edits.binary_search_by_key(&p, |e| e.position) {
                Ok(at) => edits[at].strip_id = true,
                Err(at) => {
                    if let Ok(index) = kept.binary_search(&p) {
                        let edit = RequestEdit {
                            index,
                            position: p,
                            masked: None,
                            strip_id: true,
                        };
                        edits.insert(at, edit);
                    }
                }
            }
        }
        edits
    }
}

/// Why [`pack_indexed`] ended without a pack: the packer's error, or an item the masked
/// copies could not be made of.
#[derive(Debug)]
pub enum PackFailure {
    Pack(PackError),
    Item(CostFailure),
}

/// The positions whose thinking costs 0 in one pack: under a model that strips earlier
/// turns' thinking (`strips`, [`crate::tokens::strips_earlier_thinking`]), the reasoning
/// items before the last user message of the history (`graph`, `n_history` items) and the
/// new input (`new_input`), decided from positions (the index's memo keeps whole costs).
pub fn earlier_thinking_free(
    graph: &GraphIndex,
    new_input: &[ItemMeta],
    n_history: usize,
    strips: bool,
) -> Vec<usize> {
    if !strips {
        return Vec::new();
    }
    let user_at = |p: usize| {
        if p < n_history {
            graph.is_user_message(p)
        } else {
            new_input[p - n_history].is_user_message()
        }
    };
    let thinking_at = |p: usize| {
        if p < n_history {
            graph.kind(p) == ItemKind::Reasoning
        } else {
            new_input[p - n_history].kind == ItemKind::Reasoning
        }
    };
    earlier_thinking(n_history + new_input.len(), &user_at, &thinking_at)
}

/// Pack `view` (the index `graph` with a tail of new input) over `costs`, unmasked or with
/// `masking` (masked costs kept in `masks`, the masked copies made), behind one call: the
/// outcome, and the tokenizer failure of the masking wrapper (its position and error) if
/// one ended the pack. Positions from the graph's length on are new input (`new_input`),
/// never masked; the positions in `free` (see [`earlier_thinking_free`]) cost 0, masked or
/// not; with `omit_reasoning`, units sent masked leave out the reasoning
/// [`earlier_reasoning`] allows.
#[allow(clippy::too_many_arguments)]
pub fn pack_indexed<C: CostSource + ValueSource>(
    graph: &GraphIndex,
    view: GraphView<'_>,
    costs: &mut C,
    masks: &mut MaskMemo,
    basis: CostBasis,
    opts: &PackOptions,
    masking: Option<Masking>,
    pinned: &[usize],
    new_input: &[ItemMeta],
    free: Vec<usize>,
    omit_reasoning: bool,
    context: Option<ContextHook<'_>>,
) -> (Result<Packed, PackFailure>, Option<(usize, TokenError)>) {
    let n_history = graph.len();
    let is_user = |p: usize| graph.is_user_message(p);
    let Some(m) = masking else {
        let mut costs = EarlierThinkingFree::new(costs, free);
        let packed = pack_view_masked(view, &is_user, &mut costs, opts, None, pinned, context);
        let packed = packed.map(|result| Packed {
            result,
            copies: Vec::new(),
            omitted: Vec::new(),
            stripped: Vec::new(),
        });
        return (packed.map_err(PackFailure::Pack), None);
    };
    let (omit, strip) = if omit_reasoning {
        earlier_reasoning(graph, new_input, n_history, &view)
    } else {
        (Vec::new(), Vec::new())
    };
    // Masked units are history units (never new input): the guard only keeps a position
    // past the history from reaching the index.
    let kinds = |p: usize| {
        if p < n_history {
            graph.kind(p)
        } else {
            ItemKind::UserMessage
        }
    };
    let mut masked = MaskedCosts::new(costs, basis, m.excerpt_tokens)
        .with_memo(masks, n_history)
        .with_kinds(&kinds);
    let packed = {
        let mut omitted = ReasoningOmitted::new(&mut masked, omit.clone(), strip, basis);
        let mut source = EarlierThinkingFree::new(&mut omitted, free);
        pack_view_masked(view, &is_user, &mut source, opts, Some(m), pinned, context)
    };
    let packed = packed.map_err(PackFailure::Pack).and_then(|mut result| {
        let units: Vec<&[usize]> = result
            .masked_units
            .iter()
            .map(|&u| view.unit(u).members.as_slice())
            .collect();
        let copies = masked.copies(&units).map_err(PackFailure::Item)?;
        let (omitted, stripped) = leave_out(&mut result, &view, &omit, (graph, new_input));
        Ok(Packed {
            result,
            copies,
            omitted,
            stripped,
        })
    });
    let failure = masked.tokenizer_failure().map(|(p, e)| (p, e.clone()));
    (packed, failure)
}

/// The reasoning items this call may leave out of a unit it sends masked
/// (`Masking(omit_reasoning=True)`): OpenAI reasoning items (no `provider_data`: Claude's
/// thinking and other providers' reasoning are always sent) before the last user message of
/// the history and the new input, in units whose other model items may be sent without
/// their `id` ([`reasoning_omittable_unit`]) and whose every reasoning item may go. The
/// current turn's tool loop (after that message) keeps its reasoning.
pub fn earlier_reasoning(
    index: &GraphIndex,
    new_metas: &[ItemMeta],
    n_history: usize,
    view: &GraphView<'_>,
) -> (Vec<usize>, Vec<usize>) {
    let kind = |p: usize| {
        if p < n_history {
            index.kind(p)
        } else {
            new_metas[p - n_history].kind
        }
    };
    let user_at = |p: usize| kind(p) == ItemKind::UserMessage;
    let reasoning_at = |p: usize| {
        kind(p) == ItemKind::Reasoning
            && if p < n_history {
                !index.has_provider_data(p)
            } else {
                !new_metas[p - n_history].raw.has_provider_data
            }
    };
    // Every reasoning item of the unit goes, or none: an assistant message without its id
    // is no follower for a reasoning item that stays (Claude's thinking, say).
    let mut unit_ok = |p: usize| {
        let unit = view.unit(view.unit_of(p));
        unit.is_valid()
            && reasoning_omittable_unit(unit.members.iter().map(|&q| kind(q)))
            && unit
                .members
                .iter()
                .all(|&q| kind(q) != ItemKind::Reasoning || reasoning_at(q))
    };
    let omit = omittable_reasoning(
        n_history + new_metas.len(),
        &user_at,
        &reasoning_at,
        &mut unit_ok,
    );
    // The model items of those units, sent without their `id` when the unit is masked.
    let mut strip: Vec<usize> = omit
        .iter()
        .flat_map(|&p| view.unit(view.unit_of(p)).members.iter().copied())
        .filter(|&q| id_optional_follower(kind(q)))
        .collect();
    strip.sort_unstable();
    strip.dedup();
    (omit, strip)
}

/// Reasoning left out of the units `result` sends masked (taken out of its kept history),
/// and the members of those units to send without their `id` (see `earlier_reasoning`).
pub fn leave_out(
    result: &mut PackResult,
    view: &GraphView<'_>,
    omit: &[usize],
    (index, new_metas): (&GraphIndex, &[ItemMeta]),
) -> (Vec<usize>, Vec<usize>) {
    // The history is indexed whole by now (`classify_into`): new input follows it.
    let n_history = index.len();
    let kind = |p: usize| {
        if p < n_history {
            index.kind(p)
        } else {
            new_metas[p - n_history].kind
        }
    };
    let (omitted, stripped) = omitted_in(result, view, omit, &kind);
    if !omitted.is_empty() {
        result
            .kept_history
            .retain(|p| omitted.binary_search(p).is_err());
    }
    (omitted, stripped)
}

/// Of the units `result` sends masked: the omitted reasoning positions among their members
/// (sorted), and the members to send without their `id` (model messages and function or
/// other `id_optional_follower`s of a unit that lost its reasoning; sorted).
fn omitted_in(
    result: &PackResult,
    view: &GraphView<'_>,
    omit: &[usize],
    kind: &dyn Fn(usize) -> ItemKind,
) -> (Vec<usize>, Vec<usize>) {
    let mut omitted = Vec::new();
    let mut stripped = Vec::new();
    if omit.is_empty() {
        return (omitted, stripped);
    }
    for &u in &result.masked_units {
        let members = &view.unit(u).members;
        let before = omitted.len();
        omitted.extend(members.iter().filter(|p| omit.binary_search(p).is_ok()));
        if omitted.len() > before {
            stripped.extend(
                members
                    .iter()
                    .copied()
                    .filter(|&p| id_optional_follower(kind(p))),
            );
        }
    }
    omitted.sort_unstable();
    stripped.sort_unstable();
    (omitted, stripped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metas(n: usize) -> Vec<ItemMeta> {
        (0..n)
            .map(|i| {
                let item = match i % 3 {
                    0 => json!({"role": "user", "content": format!("q{i}")}),
                    1 => json!({"type": "function_call", "call_id": format!("c{i}"),
                                "name": "f", "arguments": "{}"}),
                    _ => json!({"type": "function_call_output", "call_id": format!("c{}", i - 1),
                                "output": "ok"}),
                };
                ItemMeta::from_json(&item).expect("a valid item")
            })
            .collect()
    }

    fn direct(f: &mut (dyn FnMut() + Send)) {
        f();
    }

    struct Values(Vec<serde_json::Value>);

    impl crate::costs::ItemSource for Values {
        fn values(&mut self, positions: &[usize]) -> Result<Vec<serde_json::Value>, CostFailure> {
            Ok(positions.iter().map(|&p| self.0[p].clone()).collect())
        }
    }

    /// A history whose tool outputs are long: masked, they cost far less.
    fn long_outputs(turns: usize) -> Vec<serde_json::Value> {
        let long = "word ".repeat(400);
        (0..turns)
            .flat_map(|t| {
                [
                    json!({"role": "user", "content": format!("question {t}")}),
                    json!({"type": "function_call", "call_id": format!("c{t}"),
                           "name": "f", "arguments": "{}"}),
                    json!({"type": "function_call_output", "call_id": format!("c{t}"),
                           "output": format!("{t} {long}")}),
                ]
            })
            .collect()
    }

    /// A fresh index of `items`.
    fn index_of(items: &[serde_json::Value]) -> IndexedHistory {
        let mut index = IndexedHistory::new();
        index.append(
            items
                .iter()
                .map(|i| ItemMeta::from_json(i).unwrap())
                .collect(),
        );
        index
    }

    /// `counted_window` with `masking` from a fresh index of `items`.
    fn window_of(items: &[serde_json::Value], masking: Option<Masking>, budget: u64) -> usize {
        let mut index = index_of(items);
        let n = index.len();
        let basis = CostBasis::from(crate::tokens::Encoding::O200kBase);
        let (graph, costs, masks) = index.graph_costs_and_masks();
        let mut engine = CostEngine::<_, crate::costs::NoStore>::new(Values(items.to_vec()), basis)
            .with_memo(costs, n);
        let (start, failure) =
            counted_window(graph, &mut engine, masks, basis, masking, n, budget, 0);
        assert!(failure.is_none());
        start.expect("the items cost")
    }

    #[test]
    fn one_call_counts_the_masked_and_the_unmasked_window() {
        let items = long_outputs(12);
        let budget = 2_000;
        // Unmasked: as the core's own walk over exact costs.
        let mut index = index_of(&items);
        let n = index.len();
        let (graph, costs, _) = index.graph_costs_and_masks();
        let mut engine = CostEngine::<_, crate::costs::NoStore>::new(
            Values(items.clone()),
            crate::tokens::Encoding::O200kBase,
        )
        .with_memo(costs, n);
        let direct = counted_window_start(graph, &mut engine, budget, 0).unwrap();
        let plain = window_of(&items, None, budget);
        assert_eq!(plain, direct);
        assert!(plain > 0, "the budget must not reach the oldest unit");
        // Masked: tool outputs count at most their masked cost, so the window reaches back
        // further with the same budget.
        let masking = Masking::checked(64, None).unwrap();
        let masked = window_of(&items, Some(masking), budget);
        assert!(masked < plain, "masked {masked}, unmasked {plain}");
    }

    /// `pack_indexed` over a fresh index of `items` with one new user message.
    fn pack_of(items: &[serde_json::Value], masking: Option<Masking>, budget: u64) -> Packed {
        pack_omitting(items, masking, budget, false)
    }

    /// `pack_of`, leaving earlier reasoning out of masked units when `omit_reasoning`.
    fn pack_omitting(
        items: &[serde_json::Value],
        masking: Option<Masking>,
        budget: u64,
        omit_reasoning: bool,
    ) -> Packed {
        let mut index = index_of(items);
        let n = index.len();
        let new = json!({"role": "user", "content": "and now?"});
        let new_metas = vec![ItemMeta::from_json(&new).unwrap()];
        let mut all = items.to_vec();
        all.push(new);
        let basis = CostBasis::from(crate::tokens::Encoding::O200kBase);
        let (graph, costs, masks) = index.graph_costs_and_masks();
        let tail = graph.tail(&new_metas);
        let view = graph.view(&tail);
        let mut engine =
            CostEngine::<_, crate::costs::NoStore>::new(Values(all), basis).with_memo(costs, n);
        let opts = PackOptions {
            budget,
            output_reserve: 0,
            context_tokens: 0,
            policy: crate::pack::Policy::Contiguous,
        };
        let (packed, failure) = pack_indexed(
            graph,
            view,
            &mut engine,
            masks,
            basis,
            &opts,
            masking,
            &[],
            &new_metas,
            Vec::new(),
            omit_reasoning,
            None,
        );
        assert!(failure.is_none());
        packed.expect("a pack")
    }

    #[test]
    fn one_call_packs_masked_and_unmasked() {
        let items = long_outputs(12);
        let Packed {
            result: plain,
            copies,
            ..
        } = pack_of(&items, None, 3_000);
        assert!(copies.is_empty());
        assert!(plain.masked_units.is_empty());
        assert!(!plain.kept_history.is_empty());
        assert!(plain.kept_history.len() < items.len());
        let masking = Masking::checked(64, Some(1)).unwrap();
        let Packed {
            result: masked,
            copies,
            ..
        } = pack_of(&items, Some(masking), 3_000);
        // Older outputs masked: more of the history is kept, each masked output has its copy.
        assert!(masked.kept_history.len() > plain.kept_history.len());
        assert!(!copies.is_empty());
        assert!(masked.masking_saved > 0);
        for (p, _) in &copies {
            assert!(masked.kept_history.contains(p));
            assert_eq!(items[*p]["type"], "function_call_output");
        }
        // New input is never masked.
        assert!(copies.iter().all(|(p, _)| *p < items.len()));
    }

    /// Turns of a reasoning model: a user message, a reasoning item, a function call with a
    /// long output and an answer, every model item with its `id`.
    fn reasoning_turns(turns: usize) -> Vec<serde_json::Value> {
        let long = "word ".repeat(400);
        (0..turns)
            .flat_map(|t| {
                [
                    json!({"role": "user", "content": format!("question {t}")}),
                    json!({"type": "reasoning", "id": format!("rs_{t}"),
                           "summary": [{"type": "summary_text", "text": "think ".repeat(200)}]}),
                    json!({"type": "function_call", "id": format!("fc_{t}"),
                           "call_id": format!("c{t}"), "name": "f", "arguments": "{}"}),
                    json!({"type": "function_call_output", "call_id": format!("c{t}"),
                           "output": format!("{t} {long}")}),
                    json!({"type": "message", "id": format!("msg_{t}"), "role": "assistant",
                           "content": [{"type": "output_text", "text": "done",
                                        "annotations": []}]}),
                ]
            })
            .collect()
    }

    #[test]
    fn masked_units_leave_earlier_reasoning_out() {
        let items = reasoning_turns(12);
        let masking = Masking::checked(64, Some(1)).ok();
        let kept = pack_omitting(&items, masking, 2_500, false);
        assert!(kept.omitted.is_empty() && kept.stripped.is_empty());
        let Packed {
            result,
            copies,
            omitted,
            stripped,
        } = pack_omitting(&items, masking, 2_500, true);
        assert!(!copies.is_empty());
        assert!(!omitted.is_empty());
        // More of the history fits once the masked units' reasoning is left out.
        let turns = |r: &PackResult| {
            r.kept_history
                .iter()
                .filter(|&&p| items[p]["role"] == "user")
                .count()
        };
        assert!(turns(&result) > turns(&kept.result));
        let masked_at: Vec<usize> = copies.iter().map(|(p, _)| *p).collect();
        for &p in &omitted {
            assert_eq!(items[p]["type"], "reasoning");
            assert!(!result.kept_history.contains(&p), "omitted {p} is not sent");
            // Its turn's output was masked: only masked units lose their reasoning.
            assert!(masked_at.contains(&(p + 2)), "{p}'s unit was sent masked");
        }
        // The unit's model items go without their id; the output is no model item.
        for &p in &stripped {
            assert!(result.kept_history.contains(&p));
            assert!(["function_call", "message"].contains(&items[p]["type"].as_str().unwrap()));
            assert!(omitted.contains(&(p - 1)) || omitted.contains(&(p - 3)));
        }
        // Unmasked, nothing is left out, whatever the flag says.
        assert!(pack_omitting(&items, None, 2_500, true).omitted.is_empty());
    }

    #[test]
    fn a_context_error_ends_the_pack() {
        let items = long_outputs(2);
        let mut index = index_of(&items);
        let n = index.len();
        let basis = CostBasis::from(crate::tokens::Encoding::O200kBase);
        let (graph, costs, masks) = index.graph_costs_and_masks();
        let tail = graph.tail(&[]);
        let mut engine = CostEngine::<_, crate::costs::NoStore>::new(Values(items.clone()), basis)
            .with_memo(costs, n);
        let opts = PackOptions {
            budget: 10_000,
            output_reserve: 0,
            context_tokens: 0,
            policy: crate::pack::Policy::Contiguous,
        };
        let mut hook = |_: u64| Err(PackError::Context("no room".into()));
        let masking = Masking::checked(64, None).ok();
        let (packed, _) = pack_indexed(
            graph,
            graph.view(&tail),
            &mut engine,
            masks,
            basis,
            &opts,
            masking,
            &[],
            &[],
            Vec::new(),
            false,
            Some(&mut hook),
        );
        assert!(matches!(
            packed,
            Err(PackFailure::Pack(PackError::Context(_)))
        ));
    }

    #[test]
    fn a_pipelined_append_equals_one_append() {
        for n in [
            0,
            5,
            CLASSIFY_CHUNK,
            CLASSIFY_CHUNK + 1,
            3 * CLASSIFY_CHUNK + 7,
        ] {
            let all = metas(n);
            let mut one = IndexedHistory::new();
            one.append(all.clone());
            let mut chunked = IndexedHistory::new();
            let mut asked = Vec::new();
            chunked
                .append_classified::<()>(
                    n,
                    |first, count| {
                        asked.push((first, count));
                        Ok(all[first..first + count].to_vec())
                    },
                    &direct,
                )
                .unwrap();
            assert_eq!(chunked.snapshot(b""), one.snapshot(b""), "{n} items");
            assert_eq!(asked.iter().map(|a| a.1).sum::<usize>(), n);
            assert!(asked.iter().all(|a| a.1 <= CLASSIFY_CHUNK));
        }
    }

    #[test]
    fn a_failed_chunk_leaves_the_index_as_it_was() {
        let before = metas(10);
        for fail_at in [0, CLASSIFY_CHUNK, 2 * CLASSIFY_CHUNK] {
            let mut index = IndexedHistory::new();
            index.append(before.clone());
            let snapshot = index.snapshot(b"");
            let more = metas(3 * CLASSIFY_CHUNK);
            let outcome = index.append_classified(
                more.len(),
                |first, count| {
                    let i = first - 10;
                    if (i..i + count).contains(&fail_at) {
                        Err(format!("bad item {}", first + fail_at - i))
                    } else {
                        Ok(more[i..i + count].to_vec())
                    }
                },
                &direct,
            );
            assert_eq!(outcome, Err(format!("bad item {}", 10 + fail_at)));
            assert_eq!(index.snapshot(b""), snapshot, "failed at {fail_at}");
        }
    }

    #[test]
    fn fewer_items_than_said_end_the_append() {
        let all = metas(CLASSIFY_CHUNK + 10);
        let mut index = IndexedHistory::new();
        let mut calls = 0;
        index
            .append_classified::<()>(
                3 * CLASSIFY_CHUNK,
                |first, count| {
                    calls += 1;
                    Ok(all[first.min(all.len())..(first + count).min(all.len())].to_vec())
                },
                &direct,
            )
            .unwrap();
        assert_eq!(index.len(), all.len());
        assert_eq!(calls, 3); // the third returned nothing: no loop on nothing
    }
}
