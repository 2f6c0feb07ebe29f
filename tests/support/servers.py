"""Run the gateway on a real loopback socket, in a background thread, for tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import uvicorn

from dragoman.assembly.gateway import Timings
from dragoman.core.config import Config
from dragoman.core.config_load import from_dict
from dragoman.server.app import create_app
from dragoman.server.serving import server_options
from tests.support.waiting import eventually


def free_port() -> int:
    """A port free a moment ago, for a server in another process (`dragoman serve --port`):
    another test may take it before that server binds it, so start such servers in a way
    that survives that (see tests/integration/test_cli.py `serving`). For a port where
    nothing listens use `dead_port`; for an in-process gateway, GatewayServer binds its own."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def dead_port() -> Iterator[int]:
    """A loopback port where nothing listens, for as long as the block runs: a socket bound
    there but never listening holds it (connections are refused), so no other test (no
    other pytest-xdist worker) can start a server on it in the meantime. No SO_REUSEADDR:
    a server that asks for it cannot share the port either."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


def server_socket() -> socket.socket:
    """A loopback socket bound to a port of its own (listen() is left to the server), set
    up as uvicorn sets up the sockets it binds itself."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def _tcp_sockets(wanted: Callable[[int, int, str], bool]) -> set[str]:
    """The loopback TCP sockets (as /proc/PID/fd links name them, `socket:[INODE]`) whose
    (local port, remote port, state) are `wanted`; state as /proc/net/tcp gives it ("0A" LISTEN,
    "01" ESTABLISHED). Raises OSError without /proc."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
                if wanted(local, remote, fields[3]):
                    found.add(f"socket:[{fields[9]}]")
    return found


def _holds(pid: int, sockets: set[str]) -> bool:
    """Whether process `pid` has one of `sockets` open."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in sockets:
                return True
    return False


def _holds_listener(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on loopback `port` (True where /proc
    cannot tell). `dragoman serve` binds in its first process, with `--workers` too."""
    try:
        return _holds(pid, _tcp_sockets(lambda local, remote, state: local == port and state == "0A"))
    except OSError:
        return True


def worker_serving(supervisor: int, server_port: int, client_port: int) -> int:
    """The pid of the child of `supervisor` (a `dragoman serve --workers N`) holding the server
    side of the open connection from loopback `client_port` to `server_port`; Linux (/proc) only."""
    sockets = _tcp_sockets(lambda local, remote, state: (local, remote, state) == (server_port, client_port, "01"))
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == supervisor:  # the field after the state: ppid
                    children.append(int(entry))
    for child in children:
        with contextlib.suppress(OSError):
            if _holds(child, sockets):
                return child
    raise LookupError(f"no child of {supervisor} holds the connection from port {client_port} (children {children})")


def _kill_server(process: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(process.pid) == process.pid:  # started in a session of its own: take its workers along
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    process.wait(5)


def start_serving(start: Callable[[int], subprocess.Popen[Any]], output: Callable[[subprocess.Popen[Any]], str], *,
                  path: str = "/health", timeout: float = 20, attempts: int = 3) -> tuple[subprocess.Popen[Any], str]:  # fmt: skip
    """`start(port)` a server process (`dragoman serve --port PORT`) on a `free_port()`, until
    it answers 200 on `path`; its process and base URL. The port is free when picked, but a
    test in another pytest-xdist worker may bind it before this server does: a server that
    exits saying so ("already in use") is started again on another port, and an answer counts
    only once this process holds the port (not another test's server that took it).
    `output(process)`: what an exited server printed, for that check and for the failure."""
    for attempt in range(attempts):
        port = free_port()
        process = start(port)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while process.poll() is None:
            try:
                if httpx.get(url + path, timeout=1).status_code == 200 and _holds_listener(process.pid, port):
                    return process, url
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                _kill_server(process)
                raise AssertionError(f"the server did not answer within {timeout:.0f} s:\n{output(process)}")
            time.sleep(0.05)
        printed = output(process)
        if "already in use" not in printed or attempt == attempts - 1:
            raise AssertionError(f"the server exited with {process.returncode}:\n{printed}")
    raise AssertionError("unreachable")


class _Server(uvicorn.Server):
    """uvicorn checks `should_exit` every 100 ms; tests stop hundreds of servers."""

    async def main_loop(self) -> None:
        while not await self.on_tick(0):
            await asyncio.sleep(0.005)


class GatewayServer:
    def __init__(
        self, config: Config, *, http: Any = None, timeout_keep_alive: float = 5, timings: Timings | None = None
    ) -> None:
        """`http`: uvicorn's protocol; by default the one `dragoman serve` runs. `timeout_keep_alive`:
        uvicorn's, 5 s as `dragoman serve` leaves it (a float: uvicorn types it int, but tests want less than 1 s).
        `timings`: the gateway's discovery timings, set before it starts discovering."""
        self.config = config
        self.app = create_app(config, timings=timings)  # first: a config it refuses leaves no socket bound
        # Bound here and handed to uvicorn: a port picked now and bound only once the server
        # starts could be taken in between by a test in another pytest-xdist worker.
        self._socket = server_socket()
        self.port = self._socket.getsockname()[1]
        uv_config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False, lifespan="on",
                                   **{**server_options(config.server.max_connections), **({"http": http} if http else {})},
                                   timeout_keep_alive=timeout_keep_alive)  # type: ignore[arg-type]  # fmt: skip
        self.server = _Server(uv_config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(10)
        self._socket.close()  # uvicorn closes it on shutdown; not if it never started

    def wait_discovered(self, timeout: float = 5.0) -> None:
        """Wait until model discovery has a list for every upstream without configured models."""
        router = self.app.state.gateway.router
        eventually(lambda: all(router.discovered.get(name) for name in router.discovering), "model discovery", timeout)


def wait_tool_support(server: GatewayServer, upstream: str, timeout: float = 10.0) -> None:
    """Wait until discovery has found out, for each model `upstream` lists, whether its chat
    template shows it tools (checked after the list is in use: see Gateway.discover)."""
    router = server.app.state.gateway.router

    def checked() -> bool:
        entries = router.discovered.get(upstream)
        return bool(entries) and all(e.renders_tools is not None for e in entries)

    eventually(checked, f"the chat template check of upstream {upstream}", timeout)


def make_config(
    upstream_url: str,
    *,
    server: dict[str, Any] | None = None,
    upstream: dict[str, Any] | None = None,
    models: list[dict[str, Any]] | None = None,
) -> Config:
    """A config with one upstream named `default`; `upstream` adds keys to it (timeouts, flavor).
    Retries are off unless asked for, so one scripted failure is one failure."""
    data: dict[str, Any] = {
        "server": server or {},
        "upstreams": {"default": {"url": upstream_url, "max_retries": 0, **(upstream or {})}},
    }
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
