"""An MCP server for protoprompt's scoped long-term memory (``pip install 'protoprompt[mcp]'``).

The same SQLite :class:`~protoprompt.MemoryStore` that a
:class:`~protoprompt.TokenBudgetedContextBuilder` recalls from, served over the Model Context
Protocol to any MCP client (the Agents SDK's ``MCPServerStdio`` / ``MCPServerStreamableHttp``,
desktop apps, IDEs)::

    from protoprompt import MemoryScope, MemoryStore
    from protoprompt.mcp import create_server, run_server

    server = create_server(MemoryStore("agents.db"), MemoryScope("acme", user="alice"))
    run_server(server)                      # stdio; transport="http" for streamable HTTP

or from the shell: ``protoprompt mcp --db agents.db --tenant acme --user alice``.

One server serves one scope, fixed when it is created: no tool argument names a scope, so a
client can never read or write another tenant's, user's or thread's memory. Works with the
``mcp`` SDK 1.x (``FastMCP``) and 2.x (``MCPServer``).
"""

try:
    from . import _sdk
except ImportError as exc:
    if isinstance(exc, ModuleNotFoundError) and exc.name == "mcp":
        raise ImportError(
            "protoprompt.mcp needs the 'mcp' package: pip install 'protoprompt[mcp]'"
        ) from exc
    raise ImportError(
        f"protoprompt.mcp cannot import the installed 'mcp' package: {exc}; "
        "protoprompt supports mcp>=1.19,<3"
    ) from exc

from ._tools import MemoryLimits, MemoryToolError, MemoryTools
from .server import READ_TOOLS, RESOURCES, TOOLS, WRITE_TOOLS, create_server, run_server

MCP_MAJOR = _sdk.MCP_MAJOR
"""Major version of the installed ``mcp`` SDK (1 or 2)."""

__all__ = [
    "MCP_MAJOR",
    "READ_TOOLS",
    "RESOURCES",
    "TOOLS",
    "WRITE_TOOLS",
    "MemoryLimits",
    "MemoryToolError",
    "MemoryTools",
    "create_server",
    "run_server",
]
