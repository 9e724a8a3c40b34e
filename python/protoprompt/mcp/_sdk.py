"""The two live majors of the ``mcp`` Python SDK, behind one small surface.

mcp 1.x serves with ``mcp.server.fastmcp.FastMCP``; mcp 2.x renamed it
``mcp.server.mcpserver.MCPServer`` (and ``mcp.server.fastmcp`` raises there) and moved the
HTTP options from the constructor to ``run`` / ``streamable_http_app``. Registration of tools
and resources is the same in both; only construction and the HTTP app differ. Nothing else
in protoprompt imports the SDK.
"""

import importlib.metadata
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

from .. import __version__
from .._seams import mcp_low_level_server
from ._guard import Guard, GuardMiddleware

__all__ = [
    "MCP_MAJOR",
    "MCP_VERSION",
    "ServerType",
    "ToolError",
    "annotations",
    "http_app",
    "new_server",
]

ServerType = _Server
"""The server class of the installed SDK (``FastMCP`` or ``MCPServer``)."""

# ToolError: the exception whose message the SDK sends to the client as a tool error (mcp 2.x
# withholds the text of any other exception, as a crash).

MCP_VERSION = importlib.metadata.version("mcp")


def new_server(name: str, instructions: str, log_level: str) -> Any:
    """A server object of the installed SDK, with no tools yet, reporting protoprompt's
    version in its ``serverInfo``."""
    options: dict[str, Any] = {"name": name, "instructions": instructions, "log_level": log_level}
    if MCP_MAJOR >= 2:
        return _Server(**options, version=__version__)
    server: Any = _Server(**options)
    mcp_low_level_server(server).version = __version__  # FastMCP takes no version argument
    return server


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


def http_app(
    server: Any,
    *,
    host: str,
    port: int,
    path: str,
    guard: Guard,
    max_request_bytes: int,
) -> Any:
    """The streamable-HTTP ASGI app of ``server`` at ``path``, behind ``guard`` (Host, Origin
    and bearer token on every request). The SDK's own DNS-rebinding check gets the same
    hosts and origins, and its request body limit is ``max_request_bytes``."""
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=list(guard.hosts),
        allowed_origins=list(guard.origins),
    )
    if MCP_MAJOR >= 2:
        app = server.streamable_http_app(
            streamable_http_path=path,
            host=host,
            transport_security=security,
            max_request_body_size=max_request_bytes,
        )
    else:
        server.settings.host = host
        server.settings.port = port
        server.settings.streamable_http_path = path
        server.settings.transport_security = security
        if hasattr(server.settings, "max_request_body_size"):
            server.settings.max_request_body_size = max_request_bytes
        app = server.streamable_http_app()
    return GuardMiddleware(app, guard)
