"""A real MCP server, built with the official `mcp` SDK, on a loopback socket: one tool,
`define(word)`, over Streamable HTTP (`/mcp`) or SSE (`/sse`). It keeps the Authorization
headers it was sent, for the tests to check."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from tests.support.servers import server_socket

DEFINITIONS = {"dragoman": "an interpreter and guide, in lands where Arabic, Turkish or Persian was spoken"}


class McpTestServer:
    def __init__(self, transport: str = "streamable-http", token: str | None = None) -> None:
        from mcp.server import MCPServer

        server = MCPServer("dictionary")

        @server.tool()
        def define(word: str) -> str:
            """Define a word."""
            return DEFINITIONS.get(word.lower(), f"no definition for {word}")

        self.transport = transport
        self.authorizations: list[str | None] = []
        app = server.sse_app() if transport == "sse" else server.streamable_http_app()
        self._token = token
        self._socket = server_socket()
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(self._guarded(app), log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{'sse' if self.transport == 'sse' else 'mcp'}"

    def _guarded(self, app: Any) -> Any:
        async def guarded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                headers = dict(scope["headers"])
                given = headers.get(b"authorization")
                self.authorizations.append(given.decode() if given else None)
                if self._token is not None and given != f"Bearer {self._token}".encode():
                    await send({"type": "http.response.start", "status": 401, "headers": []})
                    await send({"type": "http.response.body", "body": b"unauthorized"})
                    return
            await app(scope, receive, send)

        return guarded

    def start(self) -> McpTestServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the MCP server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._socket.close()
