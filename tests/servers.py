"""Run the gateway on a real loopback socket, in a background thread, for tests."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from dragoman.app import create_app
from dragoman.config import Config, from_dict


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class GatewayServer:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.port = free_port()
        self.app = create_app(config)
        uv_config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False, lifespan="on")
        self.server = uvicorn.Server(uv_config)
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


def config_for(upstream_url: str, **server: Any) -> Config:
    data: dict[str, Any] = {"server": server, "upstreams": {"default": {"url": upstream_url}}}
    return from_dict(data)
