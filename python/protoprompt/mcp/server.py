"""The MCP memory server: :func:`create_server` builds it, :func:`run_server` serves it.

The tools are plain async functions registered on the installed SDK's server object; each
runs its :class:`~protoprompt.mcp.MemoryTools` call on a worker thread (SQLite is blocking),
so one slow call never stalls the other sessions of an HTTP server.

Annotations here are evaluated (no ``from __future__ import annotations``): the SDK reads the
tools' parameter types, bounds and descriptions from them to build each input schema.
"""

import socket
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, Literal, cast

import anyio
from pydantic import Field

from ..errors import MemoryStoreError
from ..memory import MemoryScope, MemoryStore
from . import _sdk
from ._guard import Guard, allowed_hosts, allowed_origins, check_bind, check_token
from ._tools import MemoryLimits, MemoryTools

__all__ = ["READ_TOOLS", "RESOURCES", "TOOLS", "WRITE_TOOLS", "create_server", "run_server"]

READ_TOOLS = ("memory_search", "memory_get_profile", "memory_context")
"""Tools of a read-only server."""
WRITE_TOOLS = ("memory_remember", "memory_forget", "memory_index_document", "memory_set_profile")
"""Tools that change memory (absent when ``read_only=True``)."""
TOOLS = READ_TOOLS + WRITE_TOOLS

RESOURCES = ("memory://profile", "memory://facts")

_INSTRUCTIONS = (
    "Long-term memory shared with the user's other agents and sessions: facts, indexed "
    "documents and a user profile. Everything is stored in one fixed memory scope chosen "
    "when this server was started; no argument selects or widens it. Search before "
    "answering questions about the user or their documents; remember durable facts the "
    "user states; use memory_context to get a token-budgeted context block."
)


_Spec = tuple[Callable[..., Any], Any]
"""A tool function and its annotations (hints for clients)."""


async def _call(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run a tool's call on a worker thread; its errors as the SDK's ``ToolError``."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except (ValueError, TypeError) as exc:  # MemoryToolError and the store's own checks
        raise _sdk.ToolError(str(exc)) from exc
    except (sqlite3.Error, MemoryStoreError) as exc:  # e.g. a locked database, a lost server
        raise _sdk.ToolError(f"memory store error: {exc}") from exc


def _read_tools(tools: MemoryTools) -> list[_Spec]:
    """The tools of every server (they never change memory)."""
    limits = tools.limits

    async def memory_search(
        query: Annotated[
            str,
            Field(
                description="What to look for, in plain words. Matched "
                "as words, never as a query language.",
                max_length=limits.max_query_chars,
            ),
        ],
        top_k: Annotated[
            int,
            Field(description="How many hits to return.", ge=1, le=limits.max_top_k, strict=True),
        ] = 5,
        layer: Annotated[
            Literal["memory", "facts", "rag", "history"],
            Field(
                description='"memory": remembered facts and indexed documents; "facts" or '
                '"rag": only those; "history": passages of earlier conversation turns that '
                "no longer fit in the agents' context (every session of this memory). Hits "
                "name their layer the same way: facts, rag or history."
            ),
        ] = "memory",
    ) -> dict[str, Any]:
        """Search the remembered facts and indexed documents of this memory, or (layer
        "history") the earlier turns of its conversations that agents no longer see.

        Returns ranked hits, best first: layer ("facts" for facts, "rag" for document
        chunks, "history" for passages of earlier turns, as plans name them), source (as
        memory_context names it), memory_id (for memory_forget; none for history), score
        (higher is better, comparable within one result) and text; history hits also name
        their session_id, row, turn and label (what the passage was: a user message, a tool
        output...).
        """
        return await _call(tools.search, query, top_k, layer)

    async def memory_get_profile() -> dict[str, Any]:
        """Return the user profile of this memory ({"profile": null} when none is set)."""
        return await _call(tools.get_profile)

    async def memory_context(
        query: Annotated[
            str,
            Field(
                description="The question or topic to recall for "
                "(empty: the profile and the newest facts).",
                max_length=limits.max_query_chars,
            ),
        ],
        max_tokens: Annotated[
            int,
            Field(
                description="Token budget of the whole context block (a system message).",
                ge=1,
                le=limits.max_context_tokens,
                strict=True,
            ),
        ],
    ) -> dict[str, Any]:
        """Build the context block protoprompt's budgeted builder would recall for a query.

        Profile, then relevant facts, then document chunks, accepted while they fit in
        max_tokens (the last fact or chunk may be cut at a word boundary). Returns the
        context text, its tokens, and the plan: every block considered with its status
        (kept, truncated, dropped), reason and tokens.
        """
        return await _call(tools.context, query, max_tokens)

    reading = _sdk.annotations(read_only=True)
    return [(memory_search, reading), (memory_get_profile, reading), (memory_context, reading)]


def _write_tools(tools: MemoryTools) -> list[_Spec]:
    """The tools that change memory (absent from a read-only server)."""
    limits = tools.limits

    async def memory_remember(
        text: Annotated[
            str,
            Field(
                description="One self-contained fact, e.g. 'Alice prefers short answers.'",
                max_length=limits.max_fact_chars,
            ),
        ],
    ) -> dict[str, Any]:
        """Remember a durable fact. Returns its memory_id."""
        return await _call(tools.remember, text)

    async def memory_forget(
        memory_id: Annotated[
            str,
            Field(
                description="A memory_id exactly as memory_remember, memory_search or "
                "memory_index_document returned it: a fact id, or 'doc:<doc_id>' for a "
                "whole document.",
                max_length=limits.max_doc_id_chars + 4,
            ),
        ],
    ) -> dict[str, Any]:
        """Forget one fact, or one whole indexed document. Unknown ids are an error."""
        return await _call(tools.forget, memory_id)

    async def memory_index_document(
        doc_id: Annotated[
            str,
            Field(
                description="Your id for the document; indexing the same id again replaces it.",
                max_length=limits.max_doc_id_chars,
            ),
        ],
        text: Annotated[
            str,
            Field(
                description=f"The document text, at most {limits.max_document_chars:,} "
                "characters (over stdio and HTTP alike).",
                max_length=limits.max_document_chars,
            ),
        ],
    ) -> dict[str, Any]:
        """Split a document into chunks and index them for search. Returns the chunk count."""
        return await _call(tools.index_document, doc_id, text)

    async def memory_set_profile(
        profile: Annotated[
            str | dict[str, str],
            Field(
                description="The whole profile: text, or an object of "
                "'key': 'value' strings. Replaces the previous "
                "profile; an empty string removes it (a parent scope's profile, if "
                "any, shows through again)."
            ),
        ],
    ) -> dict[str, Any]:
        """Replace the user profile of this memory."""
        return await _call(tools.set_profile, profile)

    return [
        (memory_remember, _sdk.annotations(read_only=False)),
        (memory_forget, _sdk.annotations(read_only=False, destructive=True, idempotent=False)),
        (
            memory_index_document,
            _sdk.annotations(read_only=False, destructive=True, idempotent=True),
        ),
        (
            memory_set_profile,
            _sdk.annotations(read_only=False, destructive=True, idempotent=True),
        ),
    ]


def _register_tools(server: Any, tools: MemoryTools, read_only: bool) -> None:
    specs = _read_tools(tools) + ([] if read_only else _write_tools(tools))
    for fn, hints in specs:
        server.add_tool(fn, name=fn.__name__, annotations=hints)


_Resource = Callable[[], Awaitable[str]]


def _register_resources(server: Any, tools: MemoryTools) -> None:
    # The server object is either SDK major's (typed Any here); its decorator keeps the function.
    resource = cast("Callable[..., Callable[[_Resource], _Resource]]", server.resource)

    @resource(
        "memory://profile",
        name="profile",
        mime_type="text/plain",
        description="The user profile of this memory (empty when none is set).",
    )
    async def profile() -> str:
        return (await anyio.to_thread.run_sync(tools.get_profile))["profile"] or ""

    @resource(
        "memory://facts",
        name="facts",
        mime_type="application/json",
        description="The remembered facts, newest first, as JSON "
        f"(at most {tools.limits.max_listed_facts}).",
    )
    async def facts() -> str:
        import json

        listing = await anyio.to_thread.run_sync(tools.facts)
        return json.dumps(listing, ensure_ascii=False)


def create_server(
    store: MemoryStore,
    scope: MemoryScope,
    *,
    name: str = "protoprompt-memory",
    read_only: bool = False,
    include_parents: bool = False,
    model: str | None = None,
    encoding: str | None = None,
    limits: MemoryLimits | None = None,
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "WARNING",
) -> Any:
    """An MCP server that serves one memory scope of ``store``.

    Returns the installed ``mcp`` SDK's own server object (``FastMCP`` with mcp 1.x,
    ``MCPServer`` with mcp 2.x), so it can be run, mounted or tested with the SDK's tools;
    :func:`run_server` runs it over stdio or streamable HTTP.

    Tools: ``memory_search``, ``memory_get_profile``, ``memory_context`` and, unless
    ``read_only``, ``memory_remember``, ``memory_forget``, ``memory_index_document``,
    ``memory_set_profile``. Resources: ``memory://profile``, ``memory://facts``.

    Args:
        store: the memory store (the same database a ``TokenBudgetedContextBuilder`` recalls
            from). The caller keeps ownership and closes it.
        scope: the only scope this server reads and writes; fixed for its lifetime. No tool
            argument can name another scope.
        name: the server name clients see.
        read_only: expose only the reading tools (and the resources).
        include_parents: reads also see the scope's ancestors (e.g. the user's memories
            from a thread-scoped server); writes and forgets stay in ``scope``.
        model, encoding: tokenizer of ``memory_context`` (default ``o200k_base``).
        limits: bounds on tool arguments; oversize input is a tool error.
        log_level: the SDK's log level (logs go to stderr).

    Raises:
        TypeError: ``store``, ``scope`` or ``limits`` has the wrong type.
        UnknownModelError, UnknownEncodingError: the tokenizer is unknown.
    """
    if not isinstance(read_only, bool):
        raise TypeError("read_only must be a bool")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name must be a non-empty string")
    tools = MemoryTools(
        store, scope, include_parents=include_parents, model=model, encoding=encoding, limits=limits
    )
    server = _sdk.new_server(name, _INSTRUCTIONS, log_level)
    _register_tools(server, tools, read_only)
    _register_resources(server, tools)
    server.protoprompt_limits = tools.limits  # run_server sizes the HTTP body limit by them
    return server


def _listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket (port 0 picks a free one)."""
    infos = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def run_server(
    server: Any,
    *,
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    path: str = "/mcp",
    on_ready: Callable[[str], None] | None = None,
    auth_token: str | None = None,
    allow_hosts: Sequence[str] = (),
    allow_origins: Sequence[str] = (),
    insecure: bool = False,
) -> None:
    """Serve ``server`` (from :func:`create_server`) until the client or a signal stops it.

    ``transport="stdio"`` talks MCP over stdin/stdout (how desktop clients and the Agents
    SDK's ``MCPServerStdio`` start a server). ``transport="http"`` serves streamable HTTP at
    ``http://host:port/path``, bound to 127.0.0.1 by default; ``port=0`` picks a free port.
    ``on_ready`` is called with the URL once the socket listens (default: print it to
    stderr). SIGINT/SIGTERM stop it cleanly.

    Every HTTP request is checked, whatever the bind (see ``docs/mcp-security.md``): its
    ``Host`` must name this server (loopback names, the bound address, or ``allow_hosts``)
    and a browser ``Origin``, when sent, must be this server's or one of ``allow_origins``
    (DNS rebinding); with ``auth_token`` it must carry ``Authorization: Bearer <token>``.
    A bind that is not loopback-only needs ``auth_token`` unless ``insecure=True``. The
    request body limit fits the largest call the tools accept, so HTTP and stdio accept the
    same calls.

    Raises:
        BindError (a ``ValueError``): a non-loopback bind without a token and not
            ``insecure``, a token shorter than 16 characters, a malformed origin.
        OSError: the address cannot be bound.
    """
    if transport == "stdio":
        anyio.run(server.run_stdio_async)
        return
    if transport != "http":
        raise ValueError(f"transport must be 'stdio' or 'http', got {transport!r}")
    import uvicorn

    token = check_token(auth_token)
    warning = check_bind(host, token=token, insecure=insecure)
    allowed_origins([], allow_origins)  # a malformed origin fails before the bind
    limits = getattr(server, "protoprompt_limits", None) or MemoryLimits()
    sock = _listening_socket(host, port)
    bound = sock.getsockname()[1]
    hosts = allowed_hosts(host, bound, allow_hosts)
    guard = Guard(tuple(hosts), tuple(allowed_origins(hosts, allow_origins)), token)
    url_host = f"[{host.strip('[]')}]" if ":" in host else host
    url = f"http://{url_host}:{bound}{path}"
    app = _sdk.http_app(
        server,
        host=host,
        port=bound,
        path=path,
        guard=guard,
        max_request_bytes=limits.max_request_bytes,
    )
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    if warning is not None:
        print(f"protoprompt mcp: warning: {warning}", file=sys.stderr, flush=True)
    if on_ready is None:

        def on_ready(url: str) -> None:
            print(f"protoprompt mcp: serving streamable HTTP on {url}", file=sys.stderr, flush=True)

    on_ready(url)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
