"""What the ``protoprompt`` commands do, once their arguments are parsed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import ProtoPromptError
from ..packing import Masking, PackOptions
from ._args import TOKEN_ENV, CommandError, UsageError
from ._text import terminal_safe


def run_mcp(args: argparse.Namespace) -> int:
    try:
        from ..mcp import create_server, run_server
        from ..mcp._guard import BindError, allowed_origins, check_bind, check_token
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    from ..memory import MemoryScope, MemoryStore
    from ..memory._backend import is_postgres_url
    from ..memory._pg_connect import redact

    try:
        scope = MemoryScope(args.tenant, user=args.user, thread=args.thread)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"bad scope: {exc}") from None
    token = args.auth_token if args.auth_token is not None else os.environ.get(TOKEN_ENV) or None
    if args.transport == "http":
        try:  # refused before anything is opened or bound
            check_bind(args.host, token=check_token(token), insecure=args.insecure)
            allowed_origins([], args.allow_origin)
        except BindError as exc:
            raise UsageError(str(exc)) from None
    postgres = is_postgres_url(args.db)
    if args.read_only and not postgres and not os.path.isfile(args.db):
        raise CommandError(f"no database file {args.db!r} (a read-only server does not create one)")
    try:
        store = MemoryStore(args.db, read_only=args.read_only)
    except Exception as exc:  # noqa: BLE001 - sqlite3 errors, a directory, no permission
        shown = redact(args.db) if postgres else args.db  # no password on the terminal
        raise CommandError(f"cannot open the memory database {shown!r}: {exc}") from None
    try:
        server = create_server(
            store,
            scope,
            name=args.name,
            read_only=args.read_only,
            include_parents=args.include_parents,
            model=args.model,
            encoding=args.encoding,
            log_level=args.log_level,
        )
        run_server(
            server,
            transport=args.transport,
            host=args.host,
            port=args.port,
            path=args.path,
            auth_token=token,
            allow_hosts=args.allow_host,
            allow_origins=args.allow_origin,
            insecure=args.insecure,
        )
    except OSError as exc:
        raise CommandError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    from . import _inspect as ins
    from ._next_turn import next_turn_window, render_next_turn
    from ._stored import open_stored

    try:
        stored = open_stored(
            args.db, messages_table=args.messages_table, key_prefix=args.key_prefix
        )
    except ins.InspectError as exc:
        raise CommandError(str(exc)) from None
    name = stored.name
    try:
        if args.session is None:
            _print_sessions(name, stored.list_sessions(), as_json=args.json)
            return 0
        rows = stored.read_session(args.session, args.limit)
        snapshot_items = stored.snapshot_items(args.session)
    except ins.InspectError as exc:
        raise CommandError(str(exc)) from None
    finally:
        stored.close()
    try:
        request, request_input = ins.read_request(
            args.instructions, args.tools, args.request, model=args.model, encoding=args.encoding
        )
    except ins.InspectError as exc:
        raise CommandError(str(exc)) from None
    new_input = _new_input(args, request_input)
    masking = _masking(args)
    try:
        options = PackOptions(
            args.budget,
            output_reserve=args.output_reserve,
            context_tokens=args.context_tokens + (request.total if request else 0),
            model=args.model,
            encoding=args.encoding,
            policy=args.policy,
            masking=masking,
        )
        result = ins.inspect_session(rows, options, new_input)
    except ProtoPromptError as exc:
        raise CommandError(f"{exc}{_row_hint(exc, rows.row_ids)}") from None
    report = ins.report_json(
        name,
        args.session,
        rows,
        result,
        new_input,
        request=request,
        context_tokens=args.context_tokens,
    )
    report["next_turn"] = next_turn_window(
        rows.items,
        rows.row_ids,
        options,
        new_input=new_input,
        limited=args.limit is not None,
        snapshot_items=snapshot_items,
    )
    next_lines = render_next_turn(report["next_turn"], len(rows.items))
    if args.html is not None:
        try:
            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(ins.report_html(report, next_lines))
        except OSError as exc:
            raise CommandError(f"cannot write {args.html}: {exc.strerror or exc}") from None
    if args.json:
        print_json(report)
    else:
        print(ins.render_report(report, dropped_only=args.dropped))
        print("\n".join(next_lines))
    return 0


def _print_sessions(name: str, sessions: list[dict[str, Any]], *, as_json: bool) -> None:
    """The sessions of a store, as JSON or one line each."""
    if as_json:
        print_json({"database": name, "sessions": sessions})
    elif not sessions:
        print(f"{terminal_safe(name)}: no sessions")
    else:
        names = [terminal_safe(str(s["session"])) for s in sessions]
        width = max(len(n) for n in names)
        print(f"{'session'.ljust(width)}  {'items':>6}  last item")
        for shown, s in zip(names, sessions, strict=True):
            print(f"{shown.ljust(width)}  {s['items']:>6}  {terminal_safe(str(s['last']))}")
        n = len(sessions)
        print(f"\n{n} session{'s' if n != 1 else ''}; inspect one with --session ID")


def _new_input(args: argparse.Namespace, request_input: list[Any] | None) -> list[Any]:
    """The next turn's input: ``--input`` or the input of ``--request`` (not both)."""
    if args.input is not None and request_input is not None:
        raise UsageError("give the next turn's input once: --input or the input of --request")
    if request_input is not None:
        return request_input
    return [] if args.input is None else [{"role": "user", "content": args.input}]


def _masking(args: argparse.Namespace) -> Masking | None:
    """The masking of ``--masking`` and its options (refused without it)."""
    if not args.masking and (args.mask_after_turns is not None or args.excerpt_tokens != 64):
        raise CommandError(
            "--excerpt-tokens and --mask-after-turns need masking (not --no-masking)"
        )
    if not args.masking:
        return None
    return Masking(excerpt_tokens=args.excerpt_tokens, after_turns=args.mask_after_turns)


def _row_hint(exc: ProtoPromptError, row_ids: Any) -> str:
    """`` (row id N)`` for an error located at ``history[i]`` (the row a person can find)."""
    location = getattr(exc, "location", "")
    if location.startswith("history[") and location.endswith("]"):
        try:
            return f" (row id {row_ids[int(location[8:-1])]})"
        except (ValueError, IndexError):
            return ""
    return ""


def run_demo(args: argparse.Namespace) -> int:
    from .._demo import run_demo as demo

    try:
        return demo(args.folder)
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise CommandError(f"cannot write to {args.folder}: {exc.strerror or exc}") from None


def run_count(args: argparse.Namespace) -> int:
    from . import _count as cnt

    name = "<stdin>" if args.file == "-" else args.file
    try:
        if args.file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        raise CommandError(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandError(f"{name}: not UTF-8 text (byte {exc.start})") from None
    text = text.removeprefix("\ufeff")
    try:
        parsed = cnt.parse_input(text, args.mode, name)
        result = cnt.count_input(parsed, model=args.model, encoding=args.encoding, name=name)
    except cnt.CountError as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print_json(result)
    else:
        print(cnt.render_count(result))
    return 0


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, ensure_ascii=False, indent=2)
    sys.stdout.write("\n")
