"""protoprompt.embed: the offline embedder of the [embed] extra (a model shipped inside the
wordllama wheel), and hybrid recall with it. The tests that run the model skip when the
extra is not installed; what a missing extra says is tested everywhere."""

from __future__ import annotations

import asyncio
import math
import socket
import sys
from typing import Any

import pytest

from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder, embed
from protoprompt.memory import HistoryRecord

needs_extra = pytest.mark.skipif(
    not embed.available(), reason="the [embed] extra (wordllama) is not installed"
)

SCOPE = MemoryScope("acme", user="alice")

FACTS = [
    "I bought a used Corolla last week from a dealer in Oakland.",
    "The weather was lovely at the beach on Sunday.",
    "We talked about the quarterly budget review for a while.",
    "I started taking pottery lessons at the community studio.",
    "The access code for project Zephyr is 48213.",
]


@pytest.fixture(scope="module")
def embedder() -> embed.OfflineEmbedder:
    if not embed.available():
        pytest.skip("the [embed] extra (wordllama) is not installed")
    return embed.OfflineEmbedder()


def test_a_missing_extra_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wordllama", None)  # as if not installed
    assert not embed.available()
    with pytest.raises(embed.EmbedderUnavailableError, match=r"protoprompt\[embed\]"):
        embed.OfflineEmbedder()
    assert issubclass(embed.EmbedderUnavailableError, ImportError)


@needs_extra
def test_the_model_loads_and_runs_without_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is downloaded: with every connection refused, the model loads from the
    package's own files and embeds."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    model = embed.OfflineEmbedder(dimensions=128)
    (vec,) = model(["hello world"])
    assert len(vec) == 128 and math.isclose(math.fsum(x * x for x in vec), 1.0, rel_tol=1e-5)


def test_vectors_are_unit_length_and_deterministic(embedder: embed.OfflineEmbedder) -> None:
    a = embedder(FACTS)
    assert a == embedder(FACTS) and len(a) == len(FACTS)
    assert all(len(v) == 256 for v in a)
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-5) for v in a)
    assert embedder([]) == []
    (blank,) = embedder([""])  # no token: all zeros, which matches nothing
    assert blank == [0.0] * 256
    # Closer in meaning, closer in space (no shared word).
    question = "What vehicle did I purchase?"
    assert embedder.similarity(question, FACTS[0]) > embedder.similarity(question, FACTS[1])


def test_bad_arguments_are_refused(embedder: embed.OfflineEmbedder) -> None:
    with pytest.raises(ValueError, match="dimensions must be one of"):
        embed.OfflineEmbedder(dimensions=100)
    with pytest.raises(TypeError, match="dimensions must be an int"):
        embed.OfflineEmbedder(dimensions=True)
    with pytest.raises(TypeError, match="sequence of str"):
        embedder("one text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        embedder(["a", 2])  # type: ignore[list-item]


def test_hybrid_history_search_finds_a_paraphrase(embedder: embed.OfflineEmbedder) -> None:
    """A question that shares no word with the passage that answers it: full-text ranking
    finds nothing, the hybrid ranking finds it first."""
    lexical, hybrid = MemoryStore(":memory:"), MemoryStore(":memory:", embedder=embedder)
    for store in (lexical, hybrid):
        store.index_history("c", [HistoryRecord(i, t) for i, t in enumerate(FACTS)], scope=SCOPE)
    question = "What vehicle did I purchase?"
    assert lexical.search_history(question, scope=SCOPE) == []
    hits = hybrid.search_history(question, scope=SCOPE, limit=3)
    assert hits and hits[0].text == FACTS[0]
    # Full-text matches still rank by the text, fused with the vectors.
    (top, *_) = hybrid.search_history("access code Zephyr", scope=SCOPE)
    assert top.text == FACTS[4]


def test_recall_brings_back_a_paraphrased_evicted_turn(embedder: embed.OfflineEmbedder) -> None:
    """Through a session: the turn that answers a paraphrased question was evicted; with the
    embedder on the store it reaches the request, without it it does not. The turn embeds
    only its question; the evicted rows are embedded in the background worker."""
    from protoprompt.integrations import ProtoPromptSession

    filler = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"small talk {i} " * 40}
        for i in range(30)
    ]
    history = [
        {"role": "user", "content": FACTS[0]},
        {"role": "assistant", "content": "Congratulations on the car!"},
        *filler,
    ]

    async def sent(store: MemoryStore) -> str:
        builder = TokenBudgetedContextBuilder(
            store, max_tokens=1200, scope=SCOPE, recall_evicted=True, output_reserve=0
        )
        session = ProtoPromptSession("chat")
        await session.add_items(history)
        callback = session.input_callback(builder)
        await callback(list(history), [{"role": "user", "content": "Good morning!"}])
        assert await builder.wait_for_background(60)
        question = [{"role": "user", "content": "What vehicle did I purchase?"}]
        await callback(list(history), question)
        plan = builder.last_plan
        assert plan is not None
        session.close()
        return str(plan.context_message) + str(plan.items)

    assert "Corolla" not in asyncio.run(sent(MemoryStore(":memory:")))
    assert "Corolla" in asyncio.run(sent(MemoryStore(":memory:", embedder=embedder)))
