"""The session's options: argument checks (``TypeError`` / ``ValueError`` naming the
argument) and why a fast path is off for good (for the turn reports)."""

from __future__ import annotations

import os
from typing import Any

from .._sdk._names import OpenAIConversationsSession, Session
from .._stores._store import Unsupported


def positive_int(name: str, value: object) -> int:
    """``value``, an int of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def non_negative_int(name: str, value: object) -> int:
    """``value``, an int of at least 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be at least 0, got {value}")
    return value


def check_inner_session(
    inner_session: Any,
    session_id: str,
    db_path: str | os.PathLike[str],
    sessions_table: str,
    messages_table: str,
) -> None:
    """``inner_session`` can store the history of ``session_id`` alone (the other arguments
    left at their defaults)."""
    if not isinstance(inner_session, Session):
        raise TypeError(
            "inner_session must implement agents.memory.Session, "
            f"got {type(inner_session).__name__}"
        )
    if isinstance(inner_session, OpenAIConversationsSession):
        raise ValueError(
            "inner_session cannot be an OpenAIConversationsSession: its history lives "
            "on the server and the SDK treats that session specially (it would not "
            "recognise it behind a wrapper)"
        )
    if os.fspath(db_path) != ":memory:":
        raise ValueError("pass either db_path or inner_session, not both")
    if (sessions_table, messages_table) != ("agent_sessions", "agent_messages"):
        raise ValueError(
            "sessions_table and messages_table name the tables of the "
            "default SQLiteSession; pass them to your inner_session"
        )
    inner_id = getattr(inner_session, "session_id", None)
    if inner_id != session_id:
        raise ValueError(
            f"inner_session.session_id is {inner_id!r} but session_id is {session_id!r}"
        )


def off_reasons(windowed_reads: bool, opened: object) -> tuple[str, str | None, str]:
    """Why token windows are off (a code of ``turn_report.READ_REASONS`` and detail) and why
    nothing outlives the process, when the session's history store ``opened`` is not one
    (``Unsupported``) or windows were not asked for."""
    no_window_detail: str | None = None
    if not windowed_reads:
        no_window = "windowed_reads_off"
    elif isinstance(opened, Unsupported):
        no_window, no_window_detail = opened
    else:
        no_window = "no_index"
    if isinstance(opened, Unsupported):
        no_store = (
            "memory database"
            if opened.code == "memory_database"
            else f"the history lives in an inner session ({opened.detail})"
        )
    else:
        no_store = "the history is not indexed (incremental=False)"
    return no_window, no_window_detail, no_store
