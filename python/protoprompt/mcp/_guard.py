"""Who may talk to the HTTP memory server: bind rules, Host/Origin checks, bearer tokens.

Threat model (docs/mcp-security.md has the whole of it): the memory holds what users told
their agents, so reading it is as sensitive as writing it. Three ways in are closed here:

* **DNS rebinding**: a web page on ``evil.example`` whose name the attacker re-points at
  127.0.0.1 makes the victim's browser send requests to a loopback-only server. Every
  request's ``Host`` must name this server (a loopback name, the bound address, or a name
  the operator allowed), and a browser's ``Origin``, when present, must be one the
  operator allowed (by default only this server's own origins). This holds on **every**
  bind, loopback or not: a server bound to 0.0.0.0 is also reachable on loopback.
* **Other machines**: a bind that is not loopback-only needs a bearer token (every request
  carries ``Authorization: Bearer <token>``, compared in constant time), unless the
  operator explicitly accepts an unauthenticated server (``insecure``).
* **Oversize requests** are refused by the SDK's body limit, which is set to fit the
  largest call the tools accept (see ``MemoryLimits.max_request_bytes``), so stdio and HTTP
  accept exactly the same calls.

Decisions are pure functions (:func:`check_bind`, :func:`allowed_hosts`,
:func:`allowed_origins`, :meth:`Guard.verdict`) tested in tables; :class:`GuardMiddleware`
applies them to an ASGI app.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MIN_TOKEN_CHARS",
    "TOKEN_ENV",
    "BindError",
    "Guard",
    "GuardMiddleware",
    "allowed_hosts",
    "allowed_origins",
    "check_bind",
    "check_token",
    "is_loopback",
    "is_wildcard",
]

TOKEN_ENV = "PROTOPROMPT_MCP_TOKEN"
"""Environment variable the ``protoprompt mcp`` command reads the bearer token from."""

MIN_TOKEN_CHARS = 16
"""Shortest bearer token accepted (a guessable token is no protection)."""

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


class BindError(ValueError):
    """The HTTP server may not be started this way (the message says what to add)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1 or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (0.0.0.0, ::, or an empty host)."""
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def check_token(token: str | None) -> str | None:
    """``token`` if it is usable as a bearer token (``None`` stays ``None``)."""
    if token is None:
        return None
    if not isinstance(token, str):
        raise BindError(f"the auth token must be a string, got {type(token).__name__}")
    if len(token) < MIN_TOKEN_CHARS:
        raise BindError(f"the auth token must have at least {MIN_TOKEN_CHARS} characters")
    if not all("!" <= c <= "~" for c in token):
        raise BindError("the auth token must be printable ASCII without spaces")
    return token


def check_bind(host: str, *, token: str | None, insecure: bool) -> str | None:
    """Whether an HTTP server may bind ``host``: ``None`` when it may quietly, a warning to
    print when it may only because ``insecure`` says so; raises :class:`BindError` when it
    may not (a non-loopback bind without a token)."""
    if is_loopback(host) or token is not None:
        return None
    if not insecure:
        raise BindError(
            f"refusing to serve on {host or '0.0.0.0'} without authentication: anyone who "
            "can reach it could read and change this memory; set a bearer token "
            f"(--auth-token, or the {TOKEN_ENV} environment variable), or bind 127.0.0.1, "
            "or pass --insecure to accept an unauthenticated server"
        )
    return (
        f"serving on {host or '0.0.0.0'} WITHOUT authentication (--insecure): anyone who can "
        "reach it can read and change this scope's memory"
    )


def _with_port(name: str, port: int) -> list[str]:
    """``name`` as ``Host`` header values: with this server's port unless it has one (and
    also bare on port 80, where clients leave the port out)."""
    if name.startswith("["):
        if "]:" in name:
            return [name]
    elif name.count(":") > 1:
        name = f"[{name}]"  # a bare IPv6 address
    elif ":" in name:
        return [name]
    return [f"{name}:{port}"] + ([name] if port == 80 else [])


def allowed_hosts(host: str, port: int, extra: Iterable[str] = ()) -> list[str]:
    """The ``Host`` header values a server bound to ``host:port`` answers: the loopback names,
    the bound address (unless it is a wildcard) and the operator's ``extra`` names (a name
    without a port means this server's port)."""
    names = list(_LOOPBACK_NAMES)
    if not is_wildcard(host) and host not in names:
        names.append(host)
    names.extend(extra)
    out: list[str] = []
    for name in names:
        for value in _with_port(name.strip().lower(), port):
            if value not in out:
                out.append(value)
    return out


def allowed_origins(hosts: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """Browser origins allowed to call: this server's own (``http://<allowed host>``) and the
    operator's ``extra`` origins (exact, e.g. ``https://app.example.com``)."""
    out = [f"http://{h}" for h in hosts]
    for origin in extra:
        origin = origin.strip().rstrip("/").lower()
        if not origin.startswith(("http://", "https://")):
            raise BindError(f"an allowed origin is a URL like https://app.example, got {origin!r}")
        if origin not in out:
            out.append(origin)
    return out


@dataclass(frozen=True)
class Guard:
    """What every HTTP request must satisfy."""

    hosts: tuple[str, ...]
    origins: tuple[str, ...]
    token: str | None = None

    def verdict(
        self, host: str | None, origin: str | None, authorization: str | None
    ) -> tuple[int, str] | None:
        """``None`` to serve the request, else the HTTP status and reason to refuse it."""
        if not host or host.strip().lower() not in self.hosts:
            return 421, "Misdirected Request: this server does not answer for that Host"
        if origin is not None and origin.strip().rstrip("/").lower() not in self.origins:
            return 403, "Forbidden: requests from that Origin are not allowed"
        if self.token is not None:
            scheme, _, given = (authorization or "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self.token.encode()
            ):
                return 401, "Unauthorized: a valid bearer token is required"
        return None


_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class GuardMiddleware:
    """ASGI middleware that refuses every HTTP request :meth:`Guard.verdict` refuses, before
    the app (and its body parsing) sees it."""

    def __init__(self, app: Callable[[_Scope, _Receive, _Send], Awaitable[None]], guard: Guard):
        self.app = app
        self.guard = guard

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope.get("headers", ()):
            name = raw_name.decode("latin-1").lower()
            if name in ("host", "origin", "authorization") and name not in headers:
                headers[name] = raw_value.decode("latin-1")
        refused = self.guard.verdict(
            headers.get("host"), headers.get("origin"), headers.get("authorization")
        )
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, reason = refused
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        extra = [(b"www-authenticate", b'Bearer realm="protoprompt-mcp"')] if status == 401 else []
        body = reason.encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
