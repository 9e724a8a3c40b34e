"""The ``protoprompt`` command's argument parser: one function per command."""

from __future__ import annotations

import argparse
from typing import Any

from .. import __version__
from ._args import (
    PROG,
    TOKEN_ENV,
    Parser,
    add_tokenizer,
    http_path,
    mask_excerpt,
    name_arg,
    non_negative,
    port,
    positive,
    row_count,
    text_arg,
)
from ._commands import run_count, run_demo, run_inspect, run_mcp


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``protoprompt`` and its commands (each sets ``run``)."""
    parser = Parser(
        prog=PROG,
        description="Token-budgeted requests and scoped long-term memory for the OpenAI "
        "Agents SDK.",
        epilog=f"Run '{PROG} COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=Parser
    )

    _add_demo(commands)
    _add_mcp(commands)
    _add_inspect(commands)
    _add_count(commands)
    return parser


def _add_demo(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="run a budgeted agent session offline (no key) and print each turn's plan",
        description="Run six turns of a contract assistant on a scripted model (no API key, "
        "no network) through a ProtoPromptSession with a small token budget: a tool loop per "
        "question, long-term memory (a contract, a fact, a profile) recalled into a context "
        "message, old tool outputs masked to excerpts, turns dropped and recalled when they "
        "match a later question. Prints each turn's plan, then the command that inspects "
        "the stored session. Needs the agents extra: pip install 'protoprompt[agents]'.",
        epilog=f"example: {PROG} demo my-demo",
    )
    demo.add_argument(
        "folder",
        nargs="?",
        default="protoprompt-demo",
        metavar="FOLDER",
        help="where to write demo.db (session and memory in one SQLite file; created if "
        "missing, an earlier demo there is replaced; default ./protoprompt-demo)",
    )
    demo.set_defaults(run=run_demo)


def _add_mcp(commands: Any) -> None:
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
    scope.add_argument("--tenant", required=True, type=text_arg, help="tenant of the scope")
    scope.add_argument("--user", required=True, type=text_arg, help="user of the scope")
    scope.add_argument(
        "--thread", type=text_arg, help="thread of the scope (default: user-wide memory)"
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
        "--port", type=port, default=8000, help="HTTP port (default 8000; 0 picks a free one)"
    )
    net.add_argument(
        "--path", default="/mcp", type=http_path, help="HTTP endpoint path (default /mcp)"
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
        type=name_arg,
        metavar="NAME",
        help="also answer requests addressed to NAME (e.g. the machine's DNS name; "
        "repeatable). Loopback names and the bound address are always answered",
    )
    guard.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        type=name_arg,
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
    add_tokenizer(mcp, "memory_context counts with")
    mcp.add_argument(
        "--name",
        default="protoprompt-memory",
        type=text_arg,
        help="server name shown to clients (default protoprompt-memory)",
    )
    mcp.add_argument(
        "--log-level",
        default="WARNING",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
        help="server log level; logs go to stderr (default WARNING)",
    )
    mcp.set_defaults(run=run_mcp)


def _add_inspect(commands: Any) -> None:
    inspect = commands.add_parser(
        "inspect",
        help="show what the next request of a stored session keeps and drops",
        description="Read an Agents SDK session store (read-only: a SQLiteSession database "
        "file, or the PostgreSQL database of a SQLAlchemySession or the Redis server of a "
        "RedisSession by URL) and show, for one session, what the next request would keep "
        "and drop under a token budget: one row per atomic unit (its items, kinds, tokens, "
        "decision and the reason), then the totals. Without --session, list the sessions.",
        epilog=f"example: {PROG} inspect agents.db --session legal-chat --max-tokens 128000 "
        "--model gpt-5 --output-reserve 8000",
    )
    inspect.add_argument(
        "db",
        metavar="DB",
        help="a SQLiteSession database file, or a URL: postgresql://... (SQLAlchemySession "
        "on PostgreSQL), sqlite+aiosqlite:///FILE (SQLAlchemySession on SQLite), "
        "redis://... (RedisSession)",
    )
    inspect.add_argument("--session", metavar="ID", type=text_arg, help="session id to inspect")
    inspect.add_argument(
        "--max-tokens",
        "--budget",
        dest="budget",
        type=positive,
        default=128_000,
        metavar="N",
        help="the budget (max_tokens): the request plus the output reserve (default 128000; "
        "--budget is the old name, kept until 1.1)",
    )
    add_tokenizer(inspect, "counts with")
    inspect.add_argument(
        "--output-reserve",
        type=non_negative,
        default=0,
        metavar="N",
        help="tokens kept free for the answer (default 0)",
    )
    inspect.add_argument(
        "--context-tokens",
        type=non_negative,
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
        type=text_arg,
        help="a user message as the next turn's new input (default: none)",
    )
    inspect.add_argument(
        "--limit",
        type=row_count,
        metavar="N",
        help="read only the newest N items (as session_settings.limit does)",
    )
    inspect.add_argument(
        "--masking",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mask old tool outputs to excerpts before dropping turns, as a session's builder "
        "does by default (Masking()); --no-masking: drop whole units only",
    )
    inspect.add_argument(
        "--excerpt-tokens",
        type=mask_excerpt,
        default=64,
        metavar="N",
        help="tokens a masked tool output keeps, marker included (default 64)",
    )
    inspect.add_argument(
        "--mask-after-turns",
        type=non_negative,
        metavar="N",
        help="also mask the outputs older than the N newest turns",
    )
    inspect.add_argument(
        "--dropped", action="store_true", help="list only the units that are not sent"
    )
    inspect.add_argument(
        "--messages-table",
        default="agent_messages",
        type=text_arg,
        metavar="NAME",
        help="the messages table of a SQL store (default agent_messages)",
    )
    inspect.add_argument(
        "--key-prefix",
        default="agents:session",
        type=text_arg,
        metavar="PREFIX",
        help="the RedisSession key prefix (default agents:session)",
    )
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    from ._request import add_request_arguments

    add_request_arguments(inspect)
    inspect.set_defaults(run=run_inspect)


def _add_count(commands: Any) -> None:
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
    add_tokenizer(count, "counts with")
    count.add_argument(
        "--as",
        dest="mode",
        choices=("auto", "text", "items"),
        default="auto",
        help="what the input is (default auto: items if it parses as JSONL or "
        "a JSON array of objects, else text)",
    )
    count.add_argument("--json", action="store_true", help="print the counts as JSON")
    count.set_defaults(run=run_count)
