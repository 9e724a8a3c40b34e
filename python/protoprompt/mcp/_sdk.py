"""The two live majors of the ``mcp`` Python SDK, behind one small surface.

mcp 1.x serves with ``mcp.server.fastmcp.FastMCP``; mcp 2.x renamed it
``mcp.server.mcpserver.MCPServer`` (and ``mcp.server.fastmcp`` raises there) and moved the
HTTP options from the constructor to ``run`` / ``streamable_http_app``. Registration of tools
and resources is the same in both; only construction and the HTTP app differ. Nothing else
in protoprompt imports the SDK.
"""

import importlib.metadata
import ipaddress
from typing import Any

try:
    from mcp.server.mcpserver import MCPServer as _Server
    from mcp.server.mcpserver.exceptions import ToolError

    MCP_MAJOR = 2
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as _Server  # type: ignore[no-redef,attr-defined,unused-ignore]
    from mcp.server.fastmcp.exceptions import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        ToolError,
    )

    MCP_MAJOR = 1

from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations

__all__ = [
    "MCP_MAJOR",
    "MCP_VERSION",
    "ServerType",
    "ToolError",
    "annotations",
    "http_app",
    "is_loopback",
    "new_server",
]

ServerType = _Server
"""The server class of the installed SDK (``FastMCP`` or ``MCPServer``)."""

# ToolError: the exception whose message the SDK sends to the client as a tool error (mcp 2.x
# withholds the text of any other exception, as a crash).

MCP_VERSION = importlib.metadata.version("mcp")

_LOOPBACK_NAMES = ("localhost",)


def new_server(name: str, instructions: str, log_level: str) -> Any:
    """A server object of the installed SDK, with no tools yet."""
    return _Server(name=name, instructions=instructions, log_level=log_level)  # type: ignore[arg-type,unused-ignore]


def annotations(
    *,
    read_only: bool,
    destructive: bool = False,
    idempotent: bool = False,
    title: str | None = None,
) -> Any:
    """Tool annotations (hints for clients), built from the wire names both majors accept."""
    return ToolAnnotations.model_validate(
        {
            "title": title,
            "readOnlyHint": read_only,
            "destructiveHint": destructive,
            "idempotentHint": idempotent,
            "openWorldHint": False,
        }
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1 or localhost)."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _security(host: str, port: int) -> Any:
    """DNS-rebinding protection for a loopback bind: only requests addressed to this host and
    port (and browser origins of it) are served, so a web page cannot reach the memory
    through a name that resolves to 127.0.0.1."""
    if not is_loopback(host):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = {host, "localhost", "127.0.0.1", "[::1]"}
    hosts = sorted(
        {f"{(f'[{n}]' if ':' in n and not n.startswith('[') else n)}:{port}" for n in names}
    )
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts],
    )


def http_app(server: Any, *, host: str, port: int, path: str = "/mcp") -> Any:
    """The streamable-HTTP ASGI app of ``server``, served at ``path``."""
    security = _security(host, port)
    if MCP_MAJOR >= 2:
        return server.streamable_http_app(
            streamable_http_path=path, host=host, transport_security=security
        )
    server.settings.host = host
    server.settings.port = port
    server.settings.streamable_http_path = path
    server.settings.transport_security = security
    return server.streamable_http_app()
