"""The memory tools, independent of any MCP SDK: validation, scope, and JSON-able results.

:class:`MemoryTools` is what the MCP server calls. It holds the one scope the server serves and
never takes a scope from its arguments, so no call can read or write another scope. Every
method checks its arguments first and raises :class:`MemoryToolError` with a message meant for
the caller (a model, or a person behind an MCP client); the SDK adapter turns that into an MCP
tool error, and the server keeps serving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..context import TokenBudgetedContextBuilder
from ..errors import ProtoPromptError
from ..memory import MemoryHit, MemoryScope, MemoryStore
from ..packing import count_tokens, encoding_for_model

__all__ = ["MemoryLimits", "MemoryToolError", "MemoryTools"]

SEARCH_LAYERS = ("memory", "facts", "rag", "history")
"""``memory_search``'s layers: ``memory`` is ``facts`` and ``rag`` together; hits name
their own layer as plans do (``facts``, ``rag``, ``history``)."""
_KINDS: dict[str, dict[str, tuple[str, ...]]] = {
    "facts": {"kinds": ("fact",)},
    "rag": {"kinds": ("document",)},
}
"""The store's record kinds of the layers that narrow ``memory``."""
_DOC_PREFIX = "doc:"
_FACT_PREFIX = "fact:"


class MemoryToolError(ProtoPromptError, ValueError):
    """A memory tool was called with arguments it cannot serve (the message says why).

    Nothing was read or changed. The MCP server reports it as a tool error and keeps serving.
    """


@dataclass(frozen=True)
class MemoryLimits:
    """Upper bounds on what one tool call may send or ask for (oversize input is refused).

    Attributes:
        max_query_chars: longest ``query`` of ``memory_search`` / ``memory_context``.
        max_fact_chars: longest ``memory_remember`` text.
        max_document_chars: longest ``memory_index_document`` text.
        max_doc_id_chars: longest document id.
        max_profile_chars: longest profile text.
        max_top_k: most hits one ``memory_search`` returns.
        max_context_tokens: largest ``max_tokens`` of ``memory_context``.
        max_listed_facts: most facts the ``memory://facts`` resource lists (newest first).
    """

    max_query_chars: int = 4_000
    max_fact_chars: int = 16_000
    max_document_chars: int = 2_000_000
    max_doc_id_chars: int = 256
    max_profile_chars: int = 16_000
    max_top_k: int = 50
    max_context_tokens: int = 1_000_000
    max_listed_facts: int = 1_000

    @property
    def max_request_bytes(self) -> int:
        """The largest HTTP request body a call within these limits can need: the longest
        set of arguments with every character JSON-escaped (12 bytes at most: a character
        outside the BMP as two ``\\uXXXX`` escapes) plus 64 KiB for the rest of the
        message. The HTTP server's body limit, so HTTP accepts every call stdio accepts."""
        longest = max(
            self.max_document_chars + self.max_doc_id_chars,
            self.max_fact_chars,
            self.max_profile_chars,
            self.max_query_chars,
        )
        return 12 * longest + 65_536

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"MemoryLimits.{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"MemoryLimits.{name} must be >= 1, got {value}")


def _text(name: str, value: object, limit: int, *, allow_blank: bool = False) -> str:
    if not isinstance(value, str):
        raise MemoryToolError(f"{name} must be a string, got {type(value).__name__}")
    if not allow_blank and not value.strip():
        raise MemoryToolError(f"{name} must not be empty")
    if "\x00" in value:
        raise MemoryToolError(f"{name} must not contain NUL characters")
    if len(value) > limit:
        raise MemoryToolError(
            f"{name} is too long: {len(value)} characters, at most {limit} are accepted"
        )
    return value


def _integer(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)  # JSON has one number type; 5.0 is the integer 5
    if isinstance(value, bool) or not isinstance(value, int):
        raise MemoryToolError(f"{name} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise MemoryToolError(f"{name} must be between {low} and {high}, got {value}")
    return value


class MemoryTools:
    """The memory operations of one scope, with argument checks and JSON-able results.

    Args:
        store: the :class:`~protoprompt.memory.MemoryStore` to serve (not closed here).
        scope: the only scope read and written. Writes go to exactly this scope.
        include_parents: reads (search, profile, facts, context) also see the scope's
            ancestors (see :meth:`MemoryScope.ancestors`), never siblings or other tenants;
            memories of ancestors can be read but not forgotten here.
        model, encoding: the tokenizer ``memory_context`` counts with (default
            ``o200k_base``).
        limits: bounds on arguments (:class:`MemoryLimits`).
    """

    def __init__(
        self,
        store: MemoryStore,
        scope: MemoryScope,
        *,
        include_parents: bool = False,
        model: str | None = None,
        encoding: str | None = None,
        limits: MemoryLimits | None = None,
    ) -> None:
        for method in (
            "search",
            "facts",
            "get_profile",
            "remember",
            "forget",
            "index_document",
            "set_profile",
            "clear_profile",
        ):
            if not callable(getattr(store, method, None)):
                raise TypeError(f"store must be a MemoryStore, got {type(store).__name__}")
        if not isinstance(scope, MemoryScope):
            raise TypeError(f"scope must be a MemoryScope, got {type(scope).__name__}")
        if not isinstance(include_parents, bool):
            raise TypeError("include_parents must be a bool")
        if limits is None:
            limits = MemoryLimits()
        elif not isinstance(limits, MemoryLimits):
            raise TypeError(f"limits must be a MemoryLimits, got {type(limits).__name__}")
        if encoding is not None:
            count_tokens("", encoding=encoding)  # UnknownEncodingError now, not on a call
        elif model is not None:
            encoding_for_model(model)  # UnknownModelError now, not on a call
        self.store = store
        self.scope = scope
        self.include_parents = include_parents
        self.model = model
        self.encoding = encoding
        self.limits = limits

    # ------------------------------------------------------------------ reads

    def search(self, query: object, top_k: object = 5, layer: object = "memory") -> dict[str, Any]:
        """Rank facts and document chunks of the scope against ``query`` (``layer="facts"``
        or ``"rag"``: only those), or with ``layer="history"`` the passages of the turns the
        scope's sessions evicted (see ``TokenBudgetedContextBuilder(recall_evicted=True)``)."""
        query = _text("query", query, self.limits.max_query_chars)
        top_k = _integer("top_k", top_k, 1, self.limits.max_top_k)
        if layer not in SEARCH_LAYERS:
            raise MemoryToolError(f"layer must be one of {', '.join(SEARCH_LAYERS)}, got {layer!r}")
        if layer == "history":
            if not callable(getattr(self.store, "search_history", None)):
                raise MemoryToolError("this memory has no history layer")
            hits = self.store.search_history(
                query, scope=self.scope, limit=top_k, include_parents=self.include_parents
            )
        else:
            hits = self.store.search(
                query,
                scope=self.scope,
                limit=top_k,
                include_parents=self.include_parents,
                **_KINDS.get(str(layer), {}),
            )
        result: dict[str, Any] = {
            "query": query,
            "hits": [self._hit(rank, h) for rank, h in enumerate(hits, 1)],
        }
        if layer != "memory":
            result["layer"] = layer
        return result

    def get_profile(self) -> dict[str, Any]:
        """The scope's profile text, or ``None`` when none is set."""
        profile = self.store.get_profile(scope=self.scope, include_parents=self.include_parents)
        return {"profile": profile if profile and profile.strip() else None}

    def facts(self) -> dict[str, Any]:
        """The newest facts of the scope (at most ``limits.max_listed_facts``)."""
        limit = self.limits.max_listed_facts
        hits = self.store.facts(
            scope=self.scope, limit=limit + 1, include_parents=self.include_parents
        )
        return {
            "facts": [
                {
                    "memory_id": h.fact_id,
                    "text": h.text,
                    "created_at": h.metadata.get("created_at"),
                    "inherited": h.scope != self.scope,
                }
                for h in hits[:limit]
            ],
            "truncated": len(hits) > limit,
        }

    def context(self, query: object, max_tokens: object) -> dict[str, Any]:
        """What :class:`~protoprompt.TokenBudgetedContextBuilder` recalls for ``query`` within
        ``max_tokens``: the context text and the plan of every block it considered."""
        query = _text("query", query, self.limits.max_query_chars, allow_blank=True)
        max_tokens = _integer("max_tokens", max_tokens, 1, self.limits.max_context_tokens)
        builder = TokenBudgetedContextBuilder(
            self.store,
            max_tokens=max_tokens,
            model=self.model,
            encoding=self.encoding,
            scope=self.scope,
            include_parents=self.include_parents,
        )
        plan = builder.build([], [], query=query)
        message = plan.context_message
        blocks = [
            {
                "layer": b.layer,
                "source": b.source,
                "status": b.status,
                "reason": b.reason,
                "tokens": b.tokens,
                "score": b.score,
            }
            for b in plan.blocks
        ]
        return {
            "query": query,
            "context": message["content"] if message is not None else "",
            "tokens": plan.context_tokens,
            "max_tokens": max_tokens,
            "encoding": builder.encoding,
            "kept": sum(1 for b in plan.blocks if b.kept),
            "dropped": sum(1 for b in plan.blocks if not b.kept),
            "blocks": blocks,
        }

    # ------------------------------------------------------------------ writes

    def remember(self, text: object) -> dict[str, Any]:
        """Store a fact in the scope; returns its id."""
        text = _text("text", text, self.limits.max_fact_chars)
        return {"memory_id": self.store.remember(text, scope=self.scope)}

    def forget(self, memory_id: object) -> dict[str, Any]:
        """Delete one fact (``<fact id>`` or ``fact:<fact id>``) or one whole document
        (``doc:<doc id>``) of the scope."""
        memory_id = _text("memory_id", memory_id, self.limits.max_doc_id_chars + len(_DOC_PREFIX))
        # Exactly as returned: "doc:notes " names the document "notes ", never "notes".
        if memory_id.startswith(_DOC_PREFIX):
            doc_id = memory_id[len(_DOC_PREFIX) :]
            if not doc_id.strip():
                raise MemoryToolError("memory_id 'doc:' names no document")
            deleted = self.store.forget(scope=self.scope, doc_id=doc_id)
            what = f"document {doc_id!r}"
        else:
            fact_id = memory_id.removeprefix(_FACT_PREFIX)
            deleted = self.store.forget(scope=self.scope, fact_id=fact_id)
            what = f"fact {fact_id!r}"
        if not deleted:
            hint = (
                " (memories of parent scopes can be read here but not forgotten)"
                if self.include_parents
                else ""
            )
            raise MemoryToolError(
                f"no {what} in this server's memory{hint}; ids come from memory_remember, "
                "memory_search (memory_id) or memory://facts"
            )
        return {"forgotten": memory_id, "deleted": deleted}

    def index_document(self, doc_id: object, text: object) -> dict[str, Any]:
        """Chunk and index a document in the scope (replacing a previous version)."""
        doc_id = _text("doc_id", doc_id, self.limits.max_doc_id_chars)
        text = _text("text", text, self.limits.max_document_chars)
        chunks = self.store.index_document(doc_id, text, scope=self.scope)
        return {"doc_id": doc_id, "memory_id": _DOC_PREFIX + doc_id, "chunks": chunks}

    def set_profile(self, profile: object) -> dict[str, Any]:
        """Replace the scope's profile; an empty (or blank) profile removes it, so the scope
        has no profile of its own and an ancestor's shows through (``include_parents``). A
        mapping of strings is stored as ``key: value`` lines."""
        if isinstance(profile, dict):
            for key, value in profile.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    raise MemoryToolError("profile must be a string or an object of strings")
            profile = "\n".join(f"{k}: {v}" for k, v in profile.items())
        profile = _text("profile", profile, self.limits.max_profile_chars, allow_blank=True)
        if not profile.strip():
            self.store.clear_profile(scope=self.scope)
            return {"profile": None}
        self.store.set_profile(profile, scope=self.scope)
        return {"profile": profile}

    # ------------------------------------------------------------------ helpers

    def _hit(self, rank: int, hit: MemoryHit) -> dict[str, Any]:
        """A hit as JSON, with :class:`~protoprompt.memory.MemoryHit`'s names (``kind`` is
        the earlier name of ``layer``, kept for compatibility)."""
        result: dict[str, Any] = {
            "rank": rank,
            "layer": hit.layer,
            "kind": hit.kind,
            "score": hit.score,
            "text": hit.text,
            "inherited": hit.scope != self.scope,
            "source": hit.source,
            "memory_id": hit.memory_id,
        }
        if hit.kind == "history":
            for key in ("session_id", "row", "passage", "turn", "label"):
                result[key] = hit.metadata.get(key)
        elif hit.kind != "fact":
            result["doc_id"] = hit.doc_id
            result["chunk_index"] = hit.chunk_index
            result["span"] = list(hit.span) if hit.span is not None else None
        return result
