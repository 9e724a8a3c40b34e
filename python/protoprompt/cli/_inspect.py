"""``protoprompt inspect``: what the next request of a stored Agents SDK session keeps and drops.

Reads the SDK's ``SQLiteSession`` tables read-only (the same rows, in the same order, that
``SQLiteSession.get_items`` returns), packs them with :func:`protoprompt.pack` exactly as a
turn would, and reports every history unit's decision. Nothing is written to the database.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..packing import PackOptions, PackResult, UnitDecision, item_tokens, pack
from ..plan import RequestCost, RequestSections, Section
from ._args import InspectError
from ._request import add_request_arguments, read_request, sections_of
from ._text import JsonReadError, read_json, terminal_safe

__all__ = [
    "InspectError",
    "SessionRows",
    "add_request_arguments",
    "decision_reason",
    "inspect_session",
    "list_sessions",
    "preview",
    "read_request",
    "read_session",
    "render_report",
    "report_html",
    "report_json",
    "sections_of",
]


@dataclass(frozen=True)
class SessionRows:
    """A session's history as ``SQLiteSession.get_items`` returns it, with the row ids."""

    items: list[Any]
    row_ids: list[int]
    skipped_rows: list[int]
    """Rows whose ``message_data`` is not JSON (the SDK skips them too)."""


def _ident(name: str) -> str:
    if not name or "\x00" in name:
        raise InspectError(f"invalid table name {name!r}")
    return '"' + name.replace('"', '""') + '"'


def connect_read_only(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection to an existing database file (never creates or writes one)."""
    p = Path(path)
    if not p.is_file():
        raise InspectError(f"no database file {str(p)!r}")
    try:
        uri = f"file:{quote(os.fsencode(p.resolve()))}?mode=ro"  # any file name, as bytes
        conn = sqlite3.connect(uri, uri=True, timeout=10)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        raise InspectError(f"cannot read {str(p)!r} as an SQLite database: {exc}") from None
    return conn


def _check_table(conn: sqlite3.Connection, table: str, path: str) -> None:
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    if row is None:
        raise InspectError(
            f"{path!r} has no table {table!r}: not an Agents SDK SQLiteSession database, or "
            "one with other table names (see --messages-table)"
        )


def list_sessions(conn: sqlite3.Connection, messages_table: str, path: str) -> list[dict[str, Any]]:
    """Every session of the messages table: id, item rows, first and last row time."""
    _check_table(conn, messages_table, path)
    try:
        rows = conn.execute(
            f"SELECT session_id, COUNT(*), MIN(created_at), MAX(created_at) "
            f"FROM {_ident(messages_table)} GROUP BY session_id ORDER BY MAX(id) DESC"
        ).fetchall()
    except sqlite3.DatabaseError as exc:
        raise InspectError(f"cannot read table {messages_table!r}: {exc}") from None
    return [{"session": s, "items": n, "first": first, "last": last} for s, n, first, last in rows]


def read_session(
    conn: sqlite3.Connection,
    session_id: str,
    *,
    messages_table: str,
    path: str,
    limit: int | None = None,
) -> SessionRows:
    """The session's items in chronological order (the newest ``limit`` if given)."""
    _check_table(conn, messages_table, path)
    table = _ident(messages_table)
    try:
        if limit is None:
            rows = conn.execute(
                f"SELECT id, message_data FROM {table} WHERE session_id = ? ORDER BY id ASC",
                (session_id,),
            ).fetchall()
        else:
            rows = conn.execute(
                f"SELECT id, message_data FROM {table} WHERE session_id = ? "
                "ORDER BY id DESC LIMIT ?",
                (session_id, limit),
            ).fetchall()
            rows.reverse()
    except sqlite3.DatabaseError as exc:
        raise InspectError(f"cannot read table {messages_table!r}: {exc}") from None
    if not rows:
        known = [s["session"] for s in list_sessions(conn, messages_table, path)]
        shown = ", ".join(repr(k) for k in known[:10]) + (" ..." if len(known) > 10 else "")
        raise InspectError(
            f"no session {session_id!r} in {path!r}"
            + (f" (sessions: {shown})" if known else " (it has no sessions)")
        )
    items: list[Any] = []
    row_ids: list[int] = []
    skipped: list[int] = []
    for row_id, data in rows:
        try:
            item = read_json(data)
        except (json.JSONDecodeError, TypeError):  # skipped by the SDK too
            skipped.append(row_id)
            continue
        except JsonReadError as exc:  # the SDK raises on it: this session cannot be read
            raise InspectError(
                f"row id {row_id} of session {session_id!r} cannot be read: {exc} (the "
                "Agents SDK cannot read this session either)"
            ) from None
        items.append(item)
        row_ids.append(row_id)
    return SessionRows(items, row_ids, skipped)


def decision_reason(decision: UnitDecision, result: PackResult | None = None) -> str:
    """Why a unit was kept or dropped, as a phrase for a person (``result.reason``; without
    the result, the decision's code as words)."""
    if result is not None:
        return result.reason(decision)
    return decision.decision.replace("_", " ")


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            text = _field(part, "text")
            if isinstance(text, str):
                parts.append(text)
            elif isinstance(_field(part, "type"), str):
                parts.append(f"[{_field(part, 'type')}]")
        return " ".join(parts)
    return ""


def preview(item: Any, width: int = 48) -> str:
    """A one-line glimpse of an item's content, for the table."""
    kind = _field(item, "type")
    if _field(item, "role") is not None and kind in (None, "message"):
        text = f"{_field(item, 'role')}: {_content_text(_field(item, 'content'))}"
    elif kind in ("function_call", "custom_tool_call"):
        args = _field(item, "arguments") or _field(item, "input") or ""
        text = f"{_field(item, 'name')}({args if isinstance(args, str) else json.dumps(args)})"
    elif isinstance(_field(item, "output"), str):
        text = f"-> {_field(item, 'output')}"
    elif kind == "reasoning":
        text = "reasoning: " + _content_text(_field(item, "summary"))
    else:
        text = str(kind) if kind is not None else type(item).__name__
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _kind(item: Any) -> str:
    kind = _field(item, "type")
    if isinstance(kind, str):
        return kind
    return "message" if _field(item, "role") is not None else "?"


def inspect_session(
    rows: SessionRows, options: PackOptions, new_input: list[dict[str, Any]]
) -> PackResult:
    """Pack the stored history as the next turn would (``new_input`` may be empty) under
    ``options`` (the command's ``max_tokens``, reserve, tokenizer, policy and masking)."""
    return pack(rows.items, new_input, options=options)


def _span(positions: Sequence[int]) -> str:
    if not positions:
        return "-"
    if len(positions) == 1:
        return str(positions[0])
    if list(positions) == list(range(positions[0], positions[-1] + 1)):
        return f"{positions[0]}-{positions[-1]}"
    return ",".join(str(p) for p in positions)


def _whole_tokens(items: list[Any], positions: Sequence[int], encoding: str) -> int | None:
    """What a unit the fill never tried would cost whole (``None``: an item cannot be
    counted, e.g. an invalid one)."""
    try:
        return sum(item_tokens(items[p], encoding=encoding).total for p in positions)
    except (ValueError, TypeError):
        return None


def report_json(
    path: str,
    session_id: str,
    rows: SessionRows,
    result: PackResult,
    new_input: list[dict[str, Any]],
    *,
    request: RequestCost | None = None,
    context_tokens: int | None = None,
) -> dict[str, Any]:
    """The whole report as JSON-able data (``--json``). ``context_tokens``: the context
    message's part of the pack's reserve (default: all of it), ``request`` the rest."""
    if context_tokens is None:
        context_tokens = result.context_tokens - (request.total if request else 0)
    units = [
        {
            "unit": d.unit,
            "positions": list(d.positions),
            "rows": [rows.row_ids[p] for p in d.positions],
            "kinds": list(d.kinds),
            "tokens": d.tokens,
            "whole_tokens": d.tokens
            if d.tokens is not None
            else _whole_tokens(rows.items, d.positions, result.encoding),
            "masked_tokens": d.masked_tokens,
            "decision": d.decision,
            "kept": d.kept,
            "reason": result.reason(d),
            "problems": [
                {"code": p.code, "message": p.message, "location": p.location} for p in d.problems
            ],
            "preview": preview(rows.items[d.positions[0]]) if d.positions else "",
        }
        for d in result.decisions
    ]
    counts = result.decision_counts()
    kept_items = sum(n for k, n in counts.items() if k in ("kept", "mandatory", "masked"))
    totals = result.totals
    sections = sections_of(result, request, context_tokens)
    stop = result.stop
    return {
        "database": path,
        "session": session_id,
        "items": len(rows.items),
        "skipped_rows": rows.skipped_rows,
        "new_input_items": len(new_input),
        "budget": result.max_tokens,
        "encoding": result.encoding,
        "policy": result.policy,
        "output_reserve": result.output_reserve,
        "context_tokens": context_tokens,
        "new_input_tokens": result.new_input_tokens,
        "dependency_tokens": result.dependency_tokens,
        "history_tokens": result.history_tokens,
        "request_tokens": result.request_tokens,
        "used": result.used,
        "remaining": result.remaining,
        "kept_items": kept_items,
        "dropped_items": len(rows.items) - kept_items,
        "masked_units": totals.masked_units,
        "masked_items": totals.masked_items,
        "masking_saved": totals.masking_saved,
        "decision_counts": counts,
        "sections": [
            {
                "name": x.name,
                "label": x.label,
                "tokens": x.tokens,
                "items": x.items,
                "note": x.note,
                "counted": x.counted,
            }
            for x in sections
        ],
        "request": None
        if request is None
        else {
            "instructions": request.instructions,
            "tools": request.tools,
            "output_schema": request.output_schema,
        },
        "stop": None
        if stop is None
        else {
            "unit": stop.unit,
            "positions": list(stop.positions),
            "rows": [rows.row_ids[p] for p in stop.positions],
            "tokens": stop.tokens,
            "masked_tokens": stop.masked_tokens,
            "left": stop.left,
            "cause": stop.cause,
            "reason": result.reason(result.decisions[stop.unit]),
        },
        "units": units,
    }


def render_report(report: Mapping[str, Any], *, dropped_only: bool = False) -> str:
    """The report as a table per unit and the request by section, for a terminal."""
    lines = [
        f"session {terminal_safe(repr(report['session']))} in "
        f"{terminal_safe(str(report['database']))}: {report['items']} items"
        + (
            f" ({len(report['skipped_rows'])} rows skipped: not JSON)"
            if report["skipped_rows"]
            else ""
        )
    ]
    units = [u for u in report["units"] if not (dropped_only and u["kept"])]
    header = ("unit", "items", "kinds", "tokens", "decision", "content", "reason")
    table = [header]
    for u in units:
        kinds = terminal_safe("+".join(u["kinds"]))
        table.append(
            (
                str(u["unit"]),
                _span(u["positions"]),
                kinds if len(kinds) <= 40 else kinds[:39] + "…",
                _tokens(u),
                u["decision"],
                terminal_safe(u["preview"]),
                terminal_safe(u["reason"]),
            )
        )
    if len(table) > 1:
        widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
        right = {0, 3}
        lines.append("")
        for row in table:
            cells = [
                row[i].rjust(widths[i]) if i in right else row[i].ljust(widths[i])
                for i in range(len(header) - 1)
            ]
            lines.append("  ".join([*cells, row[-1]]).rstrip())
    elif dropped_only:
        lines.append("")
        lines.append("no unit is dropped")
    lines.append("")
    lines.extend(_section_lines(report))
    counts = report["decision_counts"]
    dropped = ", ".join(
        f"{n} {k}" for k, n in sorted(counts.items()) if k not in ("kept", "mandatory", "masked")
    )
    lines.append(
        f"policy {report['policy']}: kept {report['kept_items']} of {report['items']} history "
        "items; "
        + (f"dropped {report['dropped_items']} ({dropped})" if dropped else "nothing dropped")
    )
    stop = report.get("stop")
    if stop:
        rows = stop["rows"]
        where = f"row {rows[0]}" if len(rows) == 1 else f"rows {rows[0]}-{rows[-1]}"
        why = str(stop["reason"]).removeprefix("the fill stopped here: ")
        lines.append(f"the fill stopped at unit {stop['unit']} ({where}): {terminal_safe(why)}")
    if report.get("masked_units"):
        items, units = report["masked_items"], report["masked_units"]
        lines.append(
            f"masked {items} tool output{'s' if items != 1 else ''} in {units} "
            f"unit{'s' if units != 1 else ''}, saving {report['masking_saved']} tokens"
        )
    return "\n".join(lines)


def _section_lines(report: Mapping[str, Any]) -> list[str]:
    """The request by section, from the report (as ``explain()`` prints a plan's)."""
    sections = RequestSections(
        report["budget"],
        tuple(
            Section(x["name"], x["tokens"], x["items"], x["note"], x["counted"])
            for x in report["sections"]
        ),
        report["encoding"],
    )
    return sections.lines()


def _tokens(unit: Mapping[str, Any]) -> str:
    """The tokens cell: the unit's tokens, and for a masked unit ``whole->masked``."""
    if unit["tokens"] is None:
        return "-"
    if unit["decision"] == "masked":
        return f"{unit['tokens']}->{unit['masked_tokens']}"
    return str(unit["tokens"])


def report_html(report: Mapping[str, Any], notes: Sequence[str] = ()) -> str:
    """The report as one self-contained HTML page (``--html``): the budget bar by section,
    the units along the session with their rows, content and reasons (escaped: the database
    is not trusted), and ``notes`` (whether the next turn is windowed)."""
    from ..plan_html import PlanView, UnitView, render

    units = [
        UnitView(
            label=f"history[{_span(u['positions'])}] (row{'s' if len(u['rows']) > 1 else ''} "
            f"{_span(u['rows'])})",
            kinds="+".join(u["kinds"]),
            tokens=u["whole_tokens"],
            decision=u["decision"],
            reason=u["reason"],
            sent_tokens=u["masked_tokens"]
            if u["decision"] == "masked"
            else (u["tokens"] if u["kept"] else None),
            preview=u["preview"],
        )
        for u in report["units"]
    ]
    run_input = next(x for x in report["sections"] if x["name"] == "run_input")
    if run_input["items"]:
        units.append(
            UnitView(
                label="the next turn's input",
                kinds=f"{run_input['items']} item{'s' if run_input['items'] != 1 else ''}",
                tokens=run_input["tokens"],
                decision="mandatory",
                reason="mandatory: the run input",
                sent_tokens=run_input["tokens"],
                region="run_input",
            )
        )
    sections = RequestSections(
        report["budget"],
        tuple(
            Section(x["name"], x["tokens"], x["items"], x["note"], x["counted"])
            for x in report["sections"]
        ),
        report["encoding"],
    )
    view = PlanView(
        title=f"session {report['session']!r}, next request",
        sections=sections,
        units=units,
        notes=list(notes),
    )
    return render([view], title=f"protoprompt inspect: {report['database']}")
