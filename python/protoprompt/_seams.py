"""Every private name of a third-party library protoprompt relies on, in one place.

The Agents SDK, SQLAlchemy's and Redis's sessions of the SDK, its tracing and FastMCP (mcp
1.x) keep some of what protoprompt needs behind private names: the client and keys of a
``RedisSession``, the table and ``AsyncSession`` of a ``SQLAlchemySession``, the validated
pop of a ``SQLiteSession``... Each is read here, by an accessor named for what it gives,
and listed in :data:`SEAMS` with the library line that has it, so that
``tests/package/test_seams.py`` checks on each supported SDK line (CI runs 0.22.3, 0.23.1 and
0.24.0) that every seam still resolves. Nothing here imports a third-party library: the
callers pass the objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ATOMIC_REPLACE_ITEMS",
    "COMPACTION_HOOKS",
    "COMPACTION_REWRITES",
    "COMPACTION_SNAPSHOT",
    "COMPACTION_SNAPSHOT_CLASS",
    "DEDUPE_KEY",
    "DESERIALIZE_ITEM",
    "IGNORE_IDS_FOR_MATCHING",
    "POP_ITEM_WITH_VALIDATION",
    "READ_COMPACTION_ITEMS",
    "REDIS_FIELDS",
    "SEAMS",
    "SESSION_GET_ITEMS",
    "Seam",
    "atomic_replace_items",
    "compaction_snapshot_reader",
    "compacts_to_a_snapshot",
    "ignores_ids_for_matching",
    "mcp_low_level_server",
    "pop_item_with_validation",
    "redis_client",
    "redis_keys",
    "redis_readable",
    "session_closed",
    "span_previous_token",
    "sqlalchemy_ensure_tables",
    "sqlalchemy_readable",
    "sqlalchemy_session",
    "sqlalchemy_shares_a_connection",
    "sqlalchemy_table",
    "tracing_disabled",
]

Where = Literal["class", "instance", "module"]


@dataclass(frozen=True)
class Seam:
    """One private name: whose it is, how it is found, and from which SDK line on."""

    module: str
    """The module of the class that has it."""
    owner: str
    """The class."""
    name: str
    where: Where
    """``"class"``: an attribute of the class (a method, a property); ``"instance"``: set on
    each object by the module's code (``obj.<name> = ...``); ``"module"``: a name of the
    module itself (``owner`` is empty)."""
    since: tuple[int, int] | None = None
    """The first openai-agents line (major, minor) that has it; ``None``: every supported
    one (or not an SDK name)."""
    library: str = "openai-agents"
    note: str = ""


_REDIS = "agents.extensions.memory.redis_session"
_SQLALCHEMY = "agents.extensions.memory.sqlalchemy_session"
_SQLITE = "agents.memory.sqlite_session"
_COMPACTION = "agents.memory.openai_responses_compaction_session"

ATOMIC_REPLACE_ITEMS = "_atomic_replace_items"
"""``RedisSession`` (0.24): replaces the whole history in one transaction."""
COMPACTION_SNAPSHOT = "_get_compaction_snapshot"
"""A session's bounded compaction snapshot (0.23), read by ``OpenAIResponsesCompactionSession``."""
DESERIALIZE_ITEM = "_deserialize_item"
"""How a SQLAlchemy or Redis session decodes a row (a subclass that overrides it is not read)."""
IGNORE_IDS_FOR_MATCHING = "_ignore_ids_for_matching"
"""A session's item-matching policy, which the runner reads before a retry's rollback."""
POP_ITEM_WITH_VALIDATION = "_pop_item_with_validation"
"""``SQLiteSession`` (0.23): the pop ``EncryptedSession`` calls with its key check."""
REDIS_FIELDS = ("_redis", "_session_key", "_messages_key", "_key_prefix")
"""What a ``RedisSession`` keeps: its client, the keys of its session and its messages, its
key prefix."""
CLOSED = "_closed"
"""Set when a session (``RedisSession``, ``SQLiteSession``...) was closed."""
COMPACTION_SNAPSHOT_CLASS = "_CompactionSnapshot"
"""``agents.memory.session`` (0.23): the SDK matches the stored history to the request
before an automatic compaction."""
COMPACTION_HOOKS = (
    "_defer_compaction",
    "_get_deferred_compaction_response_id",
    "_clear_deferred_compaction",
    "_get_items_with_generation",
    "_add_items_with_generation",
)
"""``OpenAIResponsesCompactionSession``'s hooks, which the runner calls on a session that
has them (a ``ProtoPromptSession`` forwards each one its inner session has)."""
READ_COMPACTION_ITEMS = "_read_compaction_items"
"""``EncryptedSession``'s (0.24) read of the items a compaction rewrites (forwarded too)."""
COMPACTION_REWRITES = ("_replace_underlying_session_items", "_restore_underlying_session_items")
"""``OpenAIResponsesCompactionSession``'s replacement of its history (a clear, then adds)."""
SESSION_GET_ITEMS = "_session_get_items"
"""What the runner's ``prepare_input_with_session`` calls to read the history."""
DEDUPE_KEY = "_dedupe_key"
"""``agents.run_internal.items``: the runner's de-duplication key of input items."""

SEAMS: tuple[Seam, ...] = (
    *(Seam(_REDIS, "RedisSession", name, "instance") for name in REDIS_FIELDS),
    Seam(_REDIS, "RedisSession", ATOMIC_REPLACE_ITEMS, "class", since=(0, 24)),
    Seam(_REDIS, "RedisSession", DESERIALIZE_ITEM, "class"),
    Seam(_SQLALCHEMY, "SQLAlchemySession", "_messages", "instance"),
    Seam(_SQLALCHEMY, "SQLAlchemySession", "_session_factory", "instance"),
    Seam(_SQLALCHEMY, "SQLAlchemySession", "_ensure_tables", "class"),
    Seam(_SQLALCHEMY, "SQLAlchemySession", "_session", "class", since=(0, 23)),
    Seam(_SQLALCHEMY, "SQLAlchemySession", "_connection_lock", "instance", since=(0, 23)),
    Seam(_SQLALCHEMY, "SQLAlchemySession", COMPACTION_SNAPSHOT, "class", since=(0, 23)),
    Seam(_SQLALCHEMY, "SQLAlchemySession", DESERIALIZE_ITEM, "class"),
    Seam(_SQLITE, "SQLiteSession", POP_ITEM_WITH_VALIDATION, "class", since=(0, 23)),
    Seam(
        "agents.memory.openai_responses_compaction_session",
        "OpenAIResponsesCompactionSession",
        IGNORE_IDS_FOR_MATCHING,
        "class",
        since=(0, 23),
        note="also read by the runner (run_internal.session_persistence) on every line",
    ),
    Seam(_REDIS, "RedisSession", CLOSED, "instance", note="read by the session's close"),
    Seam("agents.memory.session", "", COMPACTION_SNAPSHOT_CLASS, "module", since=(0, 23)),
    *(Seam(_COMPACTION, "OpenAIResponsesCompactionSession", n, "class") for n in COMPACTION_HOOKS),
    *(
        Seam(_COMPACTION, "OpenAIResponsesCompactionSession", n, "class")
        for n in COMPACTION_REWRITES
    ),
    Seam("agents.run_internal.items", "", DEDUPE_KEY, "module"),
    Seam("agents.tracing.spans", "SpanImpl", "_prev_span_token", "instance"),
    Seam("agents.tracing.provider", "DefaultTraceProvider", "_disabled", "instance"),
    Seam(
        "mcp.server.fastmcp",
        "FastMCP",
        "_mcp_server",
        "instance",
        library="mcp",
        note="mcp 1.x only (2.x takes the server's version as an argument)",
    ),
)
"""Every seam, for the test of each supported SDK line."""


# ------------------------------------------------------------------ RedisSession


def redis_readable(inner: Any) -> bool:
    """Whether ``inner`` keeps what a history store reads (:data:`REDIS_FIELDS`)."""
    return all(hasattr(inner, name) for name in REDIS_FIELDS)


def redis_client(inner: Any) -> Any:
    """The ``RedisSession``'s client."""
    return inner._redis


def redis_keys(inner: Any) -> tuple[str, str, str]:
    """The ``RedisSession``'s session key, messages key and key prefix."""
    return str(inner._session_key), str(inner._messages_key), str(inner._key_prefix)


def atomic_replace_items(cls: type[Any]) -> Callable[..., Any] | None:
    """The session class's atomic replacement of its history (``RedisSession``, 0.24)."""
    found: Callable[..., Any] | None = getattr(cls, ATOMIC_REPLACE_ITEMS, None)
    return found


# ------------------------------------------------------------------ SQLAlchemySession


def sqlalchemy_readable(inner: Any) -> bool:
    """Whether ``inner`` keeps what a history store reads: its table, its engine, its table
    set-up and a way to open an ``AsyncSession``."""
    needed = ("_messages", "_ensure_tables", "engine")
    return all(hasattr(inner, name) for name in needed) and (
        hasattr(inner, "_session") or hasattr(inner, "_session_factory")
    )


def sqlalchemy_table(inner: Any) -> Any:
    """The ``SQLAlchemySession``'s messages table."""
    return inner._messages


def sqlalchemy_session(inner: Any) -> Any:
    """A new ``AsyncSession`` of the ``SQLAlchemySession`` (0.23 on: through its connection
    guard)."""
    opener = getattr(inner, "_session", None)
    return opener() if opener is not None else inner._session_factory()


async def sqlalchemy_ensure_tables(inner: Any) -> None:
    """The ``SQLAlchemySession`` creates its tables if it was asked to and has not yet."""
    await inner._ensure_tables()


def sqlalchemy_shares_a_connection(inner: Any) -> bool:
    """Whether the ``SQLAlchemySession`` guards one shared connection (0.23 on, over a
    ``StaticPool``)."""
    return getattr(inner, "_connection_lock", None) is not None


# ------------------------------------------------------------------ the SDK's sessions


def pop_item_with_validation(inner: Any) -> Callable[..., Any]:
    """The ``SQLiteSession``'s validated pop (0.23 on)."""
    found: Callable[..., Any] = getattr(inner, POP_ITEM_WITH_VALIDATION)
    return found


def ignores_ids_for_matching(inner: Any) -> bool:
    """The session's item-matching policy (an id-stripping session sets it)."""
    return bool(getattr(inner, IGNORE_IDS_FOR_MATCHING, False))


def session_closed(inner: Any) -> bool:
    """Whether the session was closed (a session that does not say: not)."""
    return bool(getattr(inner, CLOSED, False))


def compacts_to_a_snapshot(session_module: Any) -> bool:
    """Whether the SDK (its ``agents.memory.session``) matches the stored history to the
    request before an automatic compaction (0.23 on)."""
    return hasattr(session_module, COMPACTION_SNAPSHOT_CLASS)


def compaction_snapshot_reader(inner: Any) -> Callable[..., Any] | None:
    """The session's bounded compaction snapshot reader, or ``None`` (before 0.23, or a
    session without one)."""
    found: Callable[..., Any] | None = getattr(inner, COMPACTION_SNAPSHOT, None)
    return found


# ------------------------------------------------------------------ tracing, MCP


def span_previous_token(span: Any) -> Any:
    """The context token a started span keeps of the span it replaced (``None`` if none)."""
    return getattr(span, "_prev_span_token", None)


def tracing_disabled(provider: Any) -> bool:
    """Whether the SDK's trace provider has tracing off."""
    return bool(getattr(provider, "_disabled", False))


def mcp_low_level_server(server: Any) -> Any:
    """The low-level server of an mcp 1.x ``FastMCP`` (whose ``version`` it reports)."""
    return server._mcp_server
