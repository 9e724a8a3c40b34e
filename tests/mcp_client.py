"""The ``mcp`` SDK's own in-process client, on either major, behind one small test surface.

mcp 1.x connects a ``ClientSession`` to a server over memory streams
(``mcp.shared.memory.create_connected_server_and_client_session``); mcp 2.x has ``mcp.Client``,
which takes the server object itself. Results differ in field names (``isError`` vs
``is_error``); :class:`Reply` reads both.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from protoprompt.mcp import MCP_MAJOR


@dataclass
class Reply:
    """One tool call's result: error flag, text content, and the JSON it carries."""

    is_error: bool
    text: str

    @property
    def data(self) -> Any:
        assert not self.is_error, self.text
        return json.loads(self.text)


def _flag(result: Any, snake: str, camel: str) -> Any:
    return getattr(result, snake) if hasattr(result, snake) else getattr(result, camel)


class Connection:
    def __init__(self, session: Any) -> None:
        self._session = session

    async def call(self, name: str, arguments: dict[str, Any] | None = None) -> Reply:
        result = await self._session.call_tool(name, arguments or {})
        texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
        return Reply(bool(_flag(result, "is_error", "isError")), "\n".join(texts))

    async def tools(self) -> dict[str, Any]:
        return {t.name: t for t in (await self._session.list_tools()).tools}

    async def resources(self) -> list[str]:
        return sorted(str(r.uri) for r in (await self._session.list_resources()).resources)

    async def read(self, uri: str) -> str:
        result = await self._session.read_resource(uri)
        return "".join(c.text for c in result.contents)


@asynccontextmanager
async def connect(server: Any) -> AsyncIterator[Connection]:
    """An initialised client session on ``server`` (a FastMCP / MCPServer object)."""
    if MCP_MAJOR >= 2:
        from mcp import Client

        async with Client(server) as client:
            yield Connection(client)
    else:
        from mcp.shared.memory import create_connected_server_and_client_session

        async with create_connected_server_and_client_session(server) as session:
            yield Connection(session)
