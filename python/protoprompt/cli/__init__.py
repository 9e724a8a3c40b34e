"""The ``protoprompt`` command: ``mcp`` (memory server), ``inspect`` (a stored session's next
request) and ``count`` (tokens of text or items).

``main(argv)`` returns the exit status: 0 on success, 1 when the input cannot be served
(the message on stderr says why), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import __version__
from ..errors import ProtoPromptError
from ..packing import Masking
from ._text import terminal_safe

__all__ = ["main"]

PROG = "protoprompt"


class _CommandError(Exception):
    """A user-facing error: printed as ``protoprompt <command>: error: ...``, exit 1."""


class _UsageError(_CommandError):
    """A combination of options that is refused: printed like a :class:`_CommandError`,
    exit 2."""


TOKEN_ENV = "PROTOPROMPT_MCP_TOKEN"
"""Where ``protoprompt mcp`` reads its bearer token when ``--auth-token`` is not given."""


def _whole_number(text: str, least: int, rule: str, most: int, what: str) -> int:
    """``text`` as an int in ``[least, most]`` (``rule`` and ``what`` say so in the error)."""
    digits = text.strip().removeprefix("+").removeprefix("-")
    if not digits.isascii() or not digits.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a whole number, got {terminal_safe(repr(text[:40]))}"
            + ("…" if len(text) > 40 else "")
        )
    if len(digits.lstrip("0")) > len(str(most)):  # never converts thousands of digits
        raise argparse.ArgumentTypeError(f"{what} is at most {most}, got {len(digits)} digits")
    value = int(text)
    if value < least:
        raise argparse.ArgumentTypeError(f"{rule}, got {value}")
    if value > most:
        raise argparse.ArgumentTypeError(f"{what} is at most {most}, got {value}")
    return value


_MAX_TOKENS = 2**64 - 1
"""Largest token count the core takes."""
_MAX_ROWS = 2**63 - 1
"""Largest row count SQLite takes."""


def _positive(text: str) -> int:
    return _whole_number(text, 1, "must be at least 1", _MAX_TOKENS, "a token count")


def _non_negative(text: str) -> int:
    return _whole_number(text, 0, "must be 0 or more", _MAX_TOKENS, "a token count")


def _row_count(text: str) -> int:
    return _whole_number(text, 1, "must be at least 1", _MAX_ROWS, "a row count")


def _mask_excerpt(text: str) -> int:
    return _whole_number(text, 16, "must be at least 16", _MAX_TOKENS, "a token count")


def _port(text: str) -> int:
    return _whole_number(text, 0, "must be 0 or more", 65535, "a TCP port")


def _text(text: str) -> str:
    """A text argument: valid Unicode (bytes that are not UTF-8 come in as lone surrogates)."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text: {terminal_safe(repr(text[:40]))}")
    return text


def _name(text: str) -> str:
    """A name (session id, scope part, host, table): valid Unicode without control
    characters."""
    text = _text(text)
    if terminal_safe(text) != text:
        raise argparse.ArgumentTypeError(
            f"control characters are not allowed: {terminal_safe(repr(text[:40]))}"
        )
    return text


def _http_path(text: str) -> str:
    text = _name(text)
    if not text.startswith("/") or not text.isascii() or " " in text:
        raise argparse.ArgumentTypeError(f"an HTTP path starts with '/' (ASCII), got {text!r}")
    return text


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line naming the argument (and where
    to read more), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2,
            f"{self.prog}: error: {terminal_safe(message)} (see '{self.prog} --help')\n",
        )


def _add_tokenizer(parser: argparse.ArgumentParser, what: str) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--model", metavar="M", help=f"model whose tokenizer {what} (gpt-5, gpt-4o, gpt-4…)"
    )
    group.add_argument(
        "--encoding",
        metavar="E",
        help="tokenizer by name (o200k_base, cl100k_base…); default o200k_base",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Token-budgeted requests and scoped long-term memory for the OpenAI "
        "Agents SDK.",
        epilog=f"Run '{PROG} COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )

    # ---------------------------------------------------------------- mcp
    mcp = commands.add_parser(
        "mcp",
        help="serve a memory scope to MCP clients (stdio or streamable HTTP)",
        description="Serve one memory scope of a protoprompt MemoryStore database to MCP "
        "clients: tools memory_search, memory_remember, memory_forget, "
        "memory_index_document, memory_get_profile, memory_set_profile and "
        "memory_context; resources memory://profile and memory://facts. The scope "
        "is fixed here; no client request can name another one. Needs the mcp "
        "extra: pip install 'protoprompt[mcp]'.",
        epilog=f"example: {PROG} mcp --db agents.db --tenant acme --user alice",
    )
    mcp.add_argument(
        "--db",
        required=True,
        metavar="PATH|URL",
        help="SQLite database of the memory (created if missing, unless "
        "--read-only), or a postgresql:// URL (needs the postgres extra); the same "
        "database the budgeted callback recalls from",
    )
    scope = mcp.add_argument_group("scope (fixed for the server's lifetime)")
    scope.add_argument("--tenant", required=True, type=_text, help="tenant of the scope")
    scope.add_argument("--user", required=True, type=_text, help="user of the scope")
    scope.add_argument(
        "--thread", type=_text, help="thread of the scope (default: user-wide memory)"
    )
    scope.add_argument(
        "--include-parents",
        action="store_true",
        help="reads also see the scope's ancestors (the user's and the "
        "tenant's memories for a thread scope); writes stay in the scope",
    )
    mcp.add_argument(
        "--read-only",
        action="store_true",
        help="expose only memory_search, memory_get_profile and memory_context, and open "
        "the database read-only (it is never changed)",
    )
    net = mcp.add_argument_group("transport")
    net.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default; for clients that start the server) or streamable HTTP",
    )
    net.add_argument(
        "--host",
        default="127.0.0.1",
        help="HTTP address to bind (default 127.0.0.1: this machine only)",
    )
    net.add_argument(
        "--port", type=_port, default=8000, help="HTTP port (default 8000; 0 picks a free one)"
    )
    net.add_argument(
        "--path", default="/mcp", type=_http_path, help="HTTP endpoint path (default /mcp)"
    )
    guard = mcp.add_argument_group(
        "HTTP access (every request's Host and Origin are checked, on every bind)"
    )
    guard.add_argument(
        "--auth-token",
        metavar="TOKEN",
        help="require 'Authorization: Bearer TOKEN' on every request (at least 16 "
        f"characters; default: the {TOKEN_ENV} environment variable, which other users "
        "of this machine cannot read from the process list). Required for a bind that is "
        "not loopback-only",
    )
    guard.add_argument(
        "--allow-host",
        action="append",
        default=[],
        type=_name,
        metavar="NAME",
        help="also answer requests addressed to NAME (e.g. the machine's DNS name; "
        "repeatable). Loopback names and the bound address are always answered",
    )
    guard.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        type=_name,
        metavar="URL",
        help="also accept browser requests from this origin (e.g. https://app.example; "
        "repeatable). Requests without an Origin header are not affected",
    )
    guard.add_argument(
        "--insecure",
        action="store_true",
        help="serve a non-loopback bind without a token (anyone who can reach it can "
        "read and change the memory)",
    )
    _add_tokenizer(mcp, "memory_context counts with")
    mcp.add_argument(
        "--name",
        default="protoprompt-memory",
        type=_text,
        help="server name shown to clients (default protoprompt-memory)",
    )
    mcp.add_argument(
        "--log-level",
        default="WARNING",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="server log level; logs go to stderr (default WARNING)",
    )
    mcp.set_defaults(run=_run_mcp)

    # ---------------------------------------------------------------- inspect
    inspect = commands.add_parser(
        "inspect",
        help="show what the next request of a stored session keeps and drops",
        description="Read an Agents SDK session store (read-only: a SQLiteSession database "
        "file, or the PostgreSQL database of a SQLAlchemySession or the Redis server of a "
        "RedisSession by URL) and show, for one session, what the next request would keep "
        "and drop under a token budget: one row per atomic unit (its items, kinds, tokens, "
        "decision and the reason), then the totals. Without --session, list the sessions.",
        epilog=f"example: {PROG} inspect agents.db --session legal-chat --budget 128000 "
        "--model gpt-5 --output-reserve 8000",
    )
    inspect.add_argument(
        "db",
        metavar="DB",
        help="a SQLiteSession database file, or a URL: postgresql://... (SQLAlchemySession "
        "on PostgreSQL), sqlite+aiosqlite:///FILE (SQLAlchemySession on SQLite), "
        "redis://... (RedisSession)",
    )
    inspect.add_argument("--session", metavar="ID", type=_text, help="session id to inspect")
    inspect.add_argument(
        "--budget",
        type=_positive,
        default=128_000,
        help="token budget of the request plus the output reserve (default 128000)",
    )
    _add_tokenizer(inspect, "counts with")
    inspect.add_argument(
        "--output-reserve",
        type=_non_negative,
        default=0,
        metavar="N",
        help="tokens kept free for the answer (default 0)",
    )
    inspect.add_argument(
        "--context-tokens",
        type=_non_negative,
        default=0,
        metavar="N",
        help="tokens of your system/context message (default 0)",
    )
    inspect.add_argument(
        "--policy",
        choices=("contiguous", "greedy"),
        default="contiguous",
        help="history policy (default contiguous)",
    )
    inspect.add_argument(
        "--input",
        metavar="TEXT",
        type=_text,
        help="a user message as the next turn's new input (default: none)",
    )
    inspect.add_argument(
        "--limit",
        type=_row_count,
        metavar="N",
        help="read only the newest N items (as session_settings.limit does)",
    )
    inspect.add_argument(
        "--masking",
        action="store_true",
        help="mask old tool outputs before dropping turns (as the builder does by default)",
    )
    inspect.add_argument(
        "--excerpt-tokens",
        type=_mask_excerpt,
        default=64,
        metavar="N",
        help="with --masking: tokens a masked tool output keeps, marker included (default 64)",
    )
    inspect.add_argument(
        "--mask-after-turns",
        type=_non_negative,
        metavar="N",
        help="with --masking: also mask the outputs older than the N newest turns",
    )
    inspect.add_argument(
        "--dropped", action="store_true", help="list only the units that are not sent"
    )
    inspect.add_argument(
        "--messages-table",
        default="agent_messages",
        type=_text,
        metavar="NAME",
        help="the messages table of a SQL store (default agent_messages)",
    )
    inspect.add_argument(
        "--key-prefix",
        default="agents:session",
        type=_text,
        metavar="PREFIX",
        help="the RedisSession key prefix (default agents:session)",
    )
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    from ._inspect import add_request_arguments

    add_request_arguments(inspect)
    inspect.set_defaults(run=_run_inspect)

    # ---------------------------------------------------------------- count
    count = commands.add_parser(
        "count",
        help="count the tokens of a text or of input items",
        description="Count tokens with the model's real tokenizer. Input is a text, or "
        "Responses input items as JSONL (one JSON object per line) or a JSON "
        "array; items are costed like protoprompt packs them (text, media and "
        "per-item overhead).",
        epilog=f"examples: {PROG} count notes.txt | {PROG} count --model gpt-4 - < items.jsonl",
    )
    count.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE",
        help="file to count, or - for standard input (default)",
    )
    _add_tokenizer(count, "counts with")
    count.add_argument(
        "--as",
        dest="mode",
        choices=("auto", "text", "items"),
        default="auto",
        help="what the input is (default auto: items if it parses as JSONL or "
        "a JSON array of objects, else text)",
    )
    count.add_argument("--json", action="store_true", help="print the counts as JSON")
    count.set_defaults(run=_run_count)
    return parser


# ------------------------------------------------------------------ commands


def _run_mcp(args: argparse.Namespace) -> int:
    try:
        from ..mcp import create_server, run_server
        from ..mcp._guard import BindError, allowed_origins, check_bind, check_token
    except ImportError as exc:
        raise _CommandError(str(exc)) from None
    from ..memory import MemoryScope, MemoryStore
    from ..memory._backend import is_postgres_url
    from ..memory._pg_connect import redact

    try:
        scope = MemoryScope(args.tenant, user=args.user, thread=args.thread)
    except (TypeError, ValueError) as exc:
        raise _CommandError(f"bad scope: {exc}") from None
    token = args.auth_token if args.auth_token is not None else os.environ.get(TOKEN_ENV) or None
    if args.transport == "http":
        try:  # refused before anything is opened or bound
            check_bind(args.host, token=check_token(token), insecure=args.insecure)
            allowed_origins([], args.allow_origin)
        except BindError as exc:
            raise _UsageError(str(exc)) from None
    postgres = is_postgres_url(args.db)
    if args.read_only and not postgres and not os.path.isfile(args.db):
        raise _CommandError(
            f"no database file {args.db!r} (a read-only server does not create one)"
        )
    try:
        store = MemoryStore(args.db, read_only=args.read_only)
    except Exception as exc:  # noqa: BLE001 - sqlite3 errors, a directory, no permission
        shown = redact(args.db) if postgres else args.db  # no password on the terminal
        raise _CommandError(f"cannot open the memory database {shown!r}: {exc}") from None
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
        raise _CommandError(f"cannot serve on {args.host}:{args.port}: {exc}") from None
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
    return 0


def _run_inspect(args: argparse.Namespace) -> int:
    from . import _inspect as ins
    from ._next_turn import next_turn_window, render_next_turn
    from ._stored import open_stored

    try:
        stored = open_stored(
            args.db, messages_table=args.messages_table, key_prefix=args.key_prefix
        )
    except ins.InspectError as exc:
        raise _CommandError(str(exc)) from None
    name = stored.name
    try:
        if args.session is None:
            sessions = stored.list_sessions()
            if args.json:
                _print_json({"database": name, "sessions": sessions})
            elif not sessions:
                print(f"{terminal_safe(name)}: no sessions")
            else:
                names = [terminal_safe(str(s["session"])) for s in sessions]
                width = max(len(n) for n in names)
                print(f"{'session'.ljust(width)}  {'items':>6}  last item")
                for name, s in zip(names, sessions, strict=True):
                    print(f"{name.ljust(width)}  {s['items']:>6}  {terminal_safe(str(s['last']))}")
                n = len(sessions)
                print(f"\n{n} session{'s' if n != 1 else ''}; inspect one with --session ID")
            return 0
        rows = stored.read_session(args.session, args.limit)
        snapshot_items = stored.snapshot_items(args.session)
    except ins.InspectError as exc:
        raise _CommandError(str(exc)) from None
    finally:
        stored.close()
    try:
        request, request_input = ins.read_request(
            args.instructions, args.tools, args.request, model=args.model, encoding=args.encoding
        )
    except ins.InspectError as exc:
        raise _CommandError(str(exc)) from None
    if args.input is not None and request_input is not None:
        raise _UsageError("give the next turn's input once: --input or the input of --request")
    new_input = [] if args.input is None else [{"role": "user", "content": args.input}]
    if request_input is not None:
        new_input = request_input
    if not args.masking and (args.mask_after_turns is not None or args.excerpt_tokens != 64):
        raise _CommandError("--excerpt-tokens and --mask-after-turns need --masking")
    masking = (
        Masking(excerpt_tokens=args.excerpt_tokens, after_turns=args.mask_after_turns)
        if args.masking
        else None
    )
    try:
        result = ins.inspect_session(
            rows,
            budget=args.budget,
            output_reserve=args.output_reserve,
            context_tokens=args.context_tokens + (request.total if request else 0),
            model=args.model,
            encoding=args.encoding,
            policy=args.policy,
            new_input=new_input,
            masking=masking,
        )
    except ProtoPromptError as exc:
        location = getattr(exc, "location", "")
        hint = ""
        if location.startswith("history[") and location.endswith("]"):
            try:
                hint = f" (row id {rows.row_ids[int(location[8:-1])]})"
            except (ValueError, IndexError):
                hint = ""
        raise _CommandError(f"{exc}{hint}") from None
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
        budget=args.budget,
        output_reserve=args.output_reserve,
        model=args.model,
        encoding=args.encoding,
        policy=args.policy,
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
            raise _CommandError(f"cannot write {args.html}: {exc.strerror or exc}") from None
    if args.json:
        _print_json(report)
    else:
        print(ins.render_report(report, dropped_only=args.dropped))
        print("\n".join(next_lines))
    return 0


def _run_count(args: argparse.Namespace) -> int:
    from . import _count as cnt

    name = "<stdin>" if args.file == "-" else args.file
    try:
        if args.file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        raise _CommandError(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _CommandError(f"{name}: not UTF-8 text (byte {exc.start})") from None
    text = text.removeprefix("\ufeff")
    try:
        parsed = cnt.parse_input(text, args.mode, name)
        result = cnt.count_input(parsed, model=args.model, encoding=args.encoding, name=name)
    except cnt.CountError as exc:
        raise _CommandError(str(exc)) from None
    if args.json:
        _print_json(result)
    else:
        print(cnt.render_count(result))
    return 0


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, ensure_ascii=False, indent=2)
    sys.stdout.write("\n")


def _fail(command: str, message: str) -> int:
    print(f"{PROG} {command}: error: {terminal_safe(message)}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``protoprompt`` command with ``argv`` (default ``sys.argv[1:]``)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else 0
    try:
        status: int = args.run(args)
    except _UsageError as exc:
        _fail(args.command, str(exc))
        return 2
    except (_CommandError, ProtoPromptError) as exc:  # ProtoPromptError: unknown model, encoding
        return _fail(args.command, str(exc))
    except BrokenPipeError:  # `protoprompt inspect ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    return status
