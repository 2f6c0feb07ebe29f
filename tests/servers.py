"""Run the gateway on a real loopback socket, in a background thread, for tests."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

from dragoman.app import create_app
from dragoman.config import Config, from_dict
from dragoman.serving import http_protocol


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Server(uvicorn.Server):
    """uvicorn checks `should_exit` every 100 ms; tests stop hundreds of servers."""

    async def main_loop(self) -> None:
        while not await self.on_tick(0):
            await asyncio.sleep(0.005)


class GatewayServer:
    def __init__(self, config: Config, *, http: Any = None, timeout_keep_alive: float = 5) -> None:
        """`http`: uvicorn's protocol; by default the one `dragoman serve` runs. `timeout_keep_alive`:
        uvicorn's, 5 s as `dragoman serve` leaves it (a float: uvicorn types it int, but tests want less than 1 s)."""
        self.config = config
        self.port = free_port()
        self.app = create_app(config)
        uv_config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False, lifespan="on",
                                   http=http or http_protocol(), timeout_keep_alive=timeout_keep_alive)  # type: ignore[arg-type]  # fmt: skip
        self.server = _Server(uv_config)
        self._thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)

    def wait_discovered(self, timeout: float = 5.0) -> None:
        """Wait until model discovery has a list for every upstream without configured models."""
        router = self.app.state.gateway.router
        deadline = time.monotonic() + timeout
        while not all(router.discovered.get(name) for name in router.discovering):
            if time.monotonic() > deadline:
                raise RuntimeError("model discovery did not finish")
            time.sleep(0.01)


def make_config(
    upstream_url: str, *, server: dict[str, Any] | None = None, upstream: dict[str, Any] | None = None,
    models: list[dict[str, Any]] | None = None,
) -> Config:
    """A config with one upstream named `default`; `upstream` adds keys to it (timeouts, flavor).
    Retries are off unless asked for, so one scripted failure is one failure."""
    data: dict[str, Any] = {"server": server or {}, "upstreams": {"default": {"url": upstream_url, "max_retries": 0, **(upstream or {})}}}
    if models:
        data["models"] = models
    return from_dict(data)


def config_for(upstream_url: str, **server: Any) -> Config:
    data: dict[str, Any] = {"server": server, "upstreams": {"default": {"url": upstream_url, "max_retries": 0}}}
    return from_dict(data)


def sse_frames(body: str) -> list[tuple[str | None, Any]]:
    """(event name, decoded data) per SSE frame of a response body, comments skipped;
    the name is None for a frame without an `event:` line."""
    import json

    frames: list[tuple[str | None, Any]] = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        event = next((line[6:].strip() for line in lines if line.startswith("event:")), None)
        data = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
        try:
            frames.append((event, json.loads(data)))
        except ValueError:
            frames.append((event, data))
    return frames
