"""What a turn recalls: the candidates of each layer from the memory store, re-ranked by
an embedder, and the recalled passages left out because their turn is in the request."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._context._blocks import Candidate, header_of, when
from .._context._plan import ContextBlock, ContextPlan
from ..memory import MemoryHit, MemoryScope, MemoryStore
from ..memory._ranking import cosine, rrf_weight
from ..memory._records import flat_meta
from ..memory.store import layers_present
from ._ledger import item_digests

Embedder = Callable[[list[str]], list[list[float]]]

TOKENS_PER_HIT = 60
MIN_HITS, MAX_HITS = 4, 32
"""Passages a turn asks the store for at most (before their neighbours), by
``recall_tokens``: one per :data:`TOKENS_PER_HIT` tokens, within these bounds; fewer when
their texts already hold ``recall_tokens`` (the store's ``tokens=``). The context message
then takes them best first while they fit."""

VOLATILE_LAYERS = frozenset({"rag", "history"})
"""Layers found for each question: with a split context they go into the recall message."""

EXCLUSION_ROUNDS = 4
"""Builds at most of one turn that leave out recalled passages found in the request."""

stats = {"rows_read": 0}
"""Turns whose recalled passages were made from a :class:`MemoryStore`'s rows (not from its
hits: :meth:`Recall.recalled`) since the process started: what the tests read to see the
fast path taken."""


def _found_rows(store: Any) -> Callable[..., list[tuple[Any, float, int]]] | None:
    """The store's ``_history_found`` when ``store`` is a :class:`MemoryStore` whose
    ``search_history`` is its own (not overridden by a subclass, nor replaced on the
    object), else ``None``."""
    search = getattr(store, "search_history", None)
    if getattr(search, "__func__", None) is not MemoryStore.search_history:
        return None
    found: Callable[..., list[tuple[Any, float, int]]] = store._history_found
    return found


def _candidate_of_row(row: Any, score: float, session_id: str, turn: int | None) -> Candidate:
    """The candidate :meth:`Recall.recalled` makes of the hit of a history ``row`` (the
    columns :func:`history_hit_of_row` reads)."""
    sid, key, passage, digest, text = row[5], int(row[6]), int(row[7]), row[10], row[11]
    meta = flat_meta(row[12])
    where = f"{key}" if sid == session_id else f"{sid}/{key}"
    return Candidate(
        "history",
        f"history:{where}#{passage}",
        text,
        float(score),
        True,
        header=header_of(meta if meta is not None else json.loads(row[12]), sid, session_id, turn),
        digest=digest,
        row=(sid, key),
    )


@dataclass(frozen=True)
class Recall:
    """The builder's settings that decide what a turn recalls (read when a turn is built)."""

    store: Any
    priorities: tuple[str, ...]
    include_parents: bool
    fact_limit: int
    rag_limit: int
    recall_evicted: bool
    recall_limit: int | None
    recall_tokens: int
    """Tokens the recalled passages can take at most this turn (``recall_tokens``, less when
    the budget leaves less): how many passages the store is asked for."""
    recall_other_sessions: bool
    embedder: Embedder | None

    def candidates(
        self,
        query: str,
        scope: MemoryScope | None,
        *,
        session_id: str | None = None,
        turn: int | None = None,
        summary: str | None = None,
        split: bool = False,
        sent: Collection[str] = (),
    ) -> list[Candidate]:
        """Recall candidates from the store, in pool order (priority, then relevance); with
        ``session_id``, the summary and the evicted turns of that session too (``sent``:
        digests of rows the request sends for sure or most likely, whose passages do not
        count among the passages asked for; see :class:`Sent`).

        ``split``: what the question finds is marked :attr:`Candidate.volatile` (recalled
        passages, document chunks, facts found by the search) and the facts the store lists
        (most recent first, whatever the question) come first, in the store's order, so the
        context message without them stays the same from turn to turn."""
        by_layer: dict[str, list[Candidate]] = {}
        if summary and summary.strip() and "summary" in self.priorities:
            by_layer["summary"] = [Candidate("summary", "summary", summary, None, True)]
        if self.store is None or scope is None:
            return by_layer.get("summary", [])
        has_terms = any(ch.isalnum() for ch in query)
        if self.recall_evicted and session_id is not None and has_terms:
            found = self.recalled(query, scope, session_id, turn, sent)
            by_layer["history"] = self.rerank(query, found)
        # Empty layers are not read (one statement finds which are, on every turn).
        has_profile, has_facts, has_documents = layers_present(
            self.store, scope, self.include_parents
        )
        if "profile" in self.priorities and has_profile:
            profile = self.store.get_profile(scope=scope, include_parents=self.include_parents)
            if profile and profile.strip():
                by_layer["profile"] = [Candidate("profile", "profile", profile, None, False)]
        if "facts" in self.priorities and self.fact_limit and has_facts:
            if split:
                by_layer["facts"] = self._split_facts(query, scope, has_terms)
            else:
                by_layer["facts"] = self.rerank(query, self._facts(query, scope, has_terms))
        if "rag" in self.priorities and self.rag_limit and has_terms and has_documents:
            hits = self.store.search(
                query,
                scope=scope,
                limit=self.rag_limit,
                kinds=("document",),
                include_parents=self.include_parents,
            )
            chunks = [
                Candidate("rag", f"{h.doc_id}#{h.chunk_index}", h.text, h.score, True) for h in hits
            ]
            by_layer["rag"] = self.rerank(query, chunks)
        pool = [c for layer in self.priorities[1:] for c in by_layer.get(layer, [])]
        if split:
            for c in pool:
                c.volatile = c.volatile or c.layer in VOLATILE_LAYERS
        return pool

    def _split_facts(self, query: str, scope: MemoryScope, has_terms: bool) -> list[Candidate]:
        """The facts the store lists (most recent first, the same for every question), then
        those the search finds for ``query`` among the others (volatile, re-ranked), each
        up to the limit."""
        listed = self.store.facts(
            scope=scope, limit=self.fact_limit, include_parents=self.include_parents
        )
        seen = {h.fact_id for h in listed}
        found: list[MemoryHit] = []
        if has_terms:
            found = self.store.search(
                query,
                scope=scope,
                limit=self.fact_limit,
                kinds=("fact",),
                include_parents=self.include_parents,
            )
        stable = [Candidate("facts", f"fact:{h.fact_id}", h.text, h.score, True) for h in listed]
        extra = [
            Candidate("facts", f"fact:{h.fact_id}", h.text, h.score, True, volatile=True)
            for h in found
            if h.fact_id not in seen
        ]
        return stable + self.rerank(query, extra)

    def _facts(self, query: str, scope: MemoryScope, has_terms: bool) -> list[Candidate]:
        """The session facts relevant to ``query``, then the latest ones, up to the limit."""
        hits: list[MemoryHit] = []
        if has_terms:
            hits = self.store.search(
                query,
                scope=scope,
                limit=self.fact_limit,
                kinds=("fact",),
                include_parents=self.include_parents,
            )
        seen = {h.fact_id for h in hits}
        for h in self.store.facts(
            scope=scope, limit=self.fact_limit, include_parents=self.include_parents
        ):
            if len(hits) >= self.fact_limit:
                break
            if h.fact_id not in seen:
                hits.append(h)
                seen.add(h.fact_id)
        return [Candidate("facts", f"fact:{h.fact_id}", h.text, h.score, True) for h in hits]

    def recalled(
        self,
        query: str,
        scope: MemoryScope,
        session_id: str,
        turn: int | None,
        sent: Collection[str] = (),
    ) -> list[Candidate]:
        """Passages of the evicted turns (of ``session_id``, or of every session of the
        scope with ``recall_other_sessions``) most relevant to ``query``, best first, each
        followed by its neighbouring turns: enough to fill ``recall_tokens`` (or
        ``recall_limit`` of them), those of the rows in ``sent`` not counted."""
        limit = self.recall_limit
        if limit is None:
            limit = min(max(self.recall_tokens // TOKENS_PER_HIT, MIN_HITS), MAX_HITS)
        else:
            sent = ()  # the first ``recall_limit`` passages, whatever they are
        store = self.store
        search = functools.partial(
            store.search_history,
            query,
            scope=scope,
            session_id=None if self.recall_other_sessions else session_id,
            limit=limit,
            include_parents=self.include_parents,
            neighbours=True,
        )
        # Hits until their passages could fill the room (long passages: fewer hits); the
        # neighbours and the hits after a passage that does not fit are the margin.
        tokens = self.recall_tokens if self.recall_limit is None else None
        found_rows = _found_rows(store)
        if found_rows is not None:
            # A MemoryStore's own search: the rows its hits are made of, the candidates made
            # from them (the same as from its hits, without making them).
            stats["rows_read"] += 1
            rows = found_rows(query, **search.keywords, uncounted=sent, tokens=tokens)
            if self.recall_limit is not None:
                rows = rows[: self.recall_limit]
            return [_candidate_of_row(row, score, session_id, turn) for row, score, _ in rows]
        # ``uncounted`` only to a store whose class declares it takes it (a capability; a
        # wrapper that hands its other attributes to a MemoryStore does not inherit it).
        takes = getattr(type(store), "search_history_uncounted", False) is True
        if tokens is not None and getattr(type(store), "search_history_tokens", False) is True:
            search = functools.partial(search, tokens=tokens)
        hits = search(uncounted=sent) if sent and takes else search()
        if self.recall_limit is not None:
            hits = hits[: self.recall_limit]
        found = []
        for h in hits:
            sid, row = str(h.metadata.get("session_id")), h.metadata.get("row")
            where = f"{row}" if sid == session_id else f"{sid}/{row}"
            found.append(
                Candidate(
                    "history",
                    f"history:{where}#{h.chunk_index}",
                    h.text,
                    h.score,
                    True,
                    header=when(h, session_id, turn),
                    digest=h.metadata.get("digest"),
                    row=(sid, row) if isinstance(row, int) else None,
                )
            )
        return found

    def rerank(self, query: str, candidates: list[Candidate]) -> list[Candidate]:
        """Fuse the store's order with cosine similarity to the query (when an embedder is set)."""
        if self.embedder is None or len(candidates) < 2 or not query.strip():
            return candidates
        vectors = self.embedder([query] + [c.text for c in candidates])
        if not isinstance(vectors, Sequence) or len(vectors) != len(candidates) + 1:
            raise ValueError("embedder must return exactly one vector per input text")
        q = [float(x) for x in vectors[0]]
        sims = [cosine(q, [float(x) for x in v]) for v in vectors[1:]]
        by_sim = sorted(range(len(candidates)), key=lambda i: (-sims[i], i))
        fused = [rrf_weight(i + 1) for i in range(len(candidates))]
        for rank, i in enumerate(by_sim):
            fused[i] += rrf_weight(rank + 1)
        order = sorted(range(len(candidates)), key=lambda i: (-fused[i], i))
        return [candidates[i] for i in order]


NEWEST_GUESS = 8
"""How many of the newest history items :func:`without_repeats` takes as in the request
before the first build (a question that shares the words of the turns just before it finds
them first)."""

repeat_stats = {"guessed": 0, "guess_failed": 0}
"""How often :func:`without_repeats` left out passages of the newest turns before the first
build, and how often one of them turned out not to be in the request (read by tests)."""


@dataclass(frozen=True)
class Sent:
    """Digests of the rows a turn's request sends for sure (its new input) and most likely
    (the newest :data:`NEWEST_GUESS` history items: the last a pack drops)."""

    sure: frozenset[str]
    newest: frozenset[str]

    @classmethod
    def of(cls, history: Sequence[Any], new_input: Sequence[Any]) -> Sent:
        """The digests of ``new_input`` and of the end of ``history``."""
        tail = list(history[-NEWEST_GUESS:]) if NEWEST_GUESS else []
        digests = item_digests([*new_input, *tail])
        sure = frozenset(d for d in digests[: len(new_input)] if d is not None)
        return cls(sure, frozenset(d for d in digests[len(new_input) :] if d is not None))

    @property
    def either(self) -> frozenset[str]:
        """Both sets."""
        return self.sure | self.newest


def without_repeats(
    pool: list[Candidate],
    build_with: Callable[[list[Candidate]], ContextPlan],
    history: list[Any],
    offset: int,
    sent_rows: Sent,
    block_sizes: Callable[[list[Candidate]], list[int]],
) -> ContextPlan:
    """The plan built from ``pool`` without the recalled passages whose row is in the
    request (kept history or new input: compared by the digest of the item's canonical
    text), built again until none is; they are reported as dropped blocks. A row sent as
    a masked copy is not in the request: only its excerpt is, so its passages may be
    recalled.

    Before the first build, passages of the new input (always sent) are left out, and so
    are those of the newest :data:`NEWEST_GUESS` history items (the newest turns are the
    last a pack drops); it is checked that each of the latter is in that plan's request,
    and when one is not, the plan is built again from the pool without the former only and
    checked as before. The passages left out are reported with the sizes of their blocks
    (``block_sizes``: :meth:`Assembler.block_sizes`, as the passages the assembly passes
    over are, so their counts are found in the count memo)."""
    new_digests: set[str | None] = set(sent_rows.sure)
    newest = sent_rows.newest
    left_out: dict[str, tuple[Candidate, str]] = {
        c.source: (c, "its turn is in the request")
        for c in pool
        if c.layer == "history" and c.digest in new_digests
    }
    pool = [c for c in pool if c.source not in left_out]
    guessed = {c.source for c in pool if c.layer == "history" and c.digest in newest}
    plan = build_with([c for c in pool if c.source not in guessed] if guessed else pool)
    present: dict[int, str | None] = {}  # digest by position

    def sent() -> set[str | None]:
        masked = set(plan.pack.masked)
        todo = [p for p in plan.pack.kept_history if p not in masked and p not in present]
        present.update(zip(todo, item_digests([history[p - offset] for p in todo]), strict=True))
        return new_digests | {present[p] for p in plan.pack.kept_history if p not in masked}

    if guessed:
        repeat_stats["guessed"] += 1
        digests = sent()
        if all(c.digest in digests for c in pool if c.source in guessed):
            for c in pool:
                if c.source in guessed:
                    left_out[c.source] = (c, "its turn is in the request")
            pool = [c for c in pool if c.source not in guessed]
        else:
            repeat_stats["guess_failed"] += 1
            plan = build_with(pool)
    rounds = 0
    while True:
        recalled = {b.source for b in plan.blocks if b.layer == "history" and b.kept}
        if not recalled:
            break
        digests = sent()
        repeats = [
            (c, "its turn is in the request")
            for c in pool
            if c.layer == "history" and c.source in recalled and c.digest in digests
        ]
        if not repeats:
            break
        rounds += 1
        if rounds > EXCLUSION_ROUNDS:  # never reached in practice: give the layer up
            named = {c.source for c, _ in repeats}
            repeats += [
                (c, "left out: recalled turns kept coming back into the request")
                for c in pool
                if c.layer == "history" and c.source not in named
            ]
        for c, why in repeats:
            left_out[c.source] = (c, why)
        pool = [c for c in pool if c.source not in left_out]
        plan = build_with(pool)
    if not left_out:
        return plan
    counts = block_sizes([c for c, _ in left_out.values()])
    extra = [
        ContextBlock(c.layer, c.source, "dropped", why, tokens, c.text, c.score)
        for (c, why), tokens in zip(left_out.values(), counts, strict=True)
    ]
    return replace(plan, blocks=[*plan.blocks, *extra])
