"""A zero-work byte pump: the floor of per-chunk CPU for any gateway written in Python.

Every client connection accepted on 127.0.0.1:--port gets one TCP connection of its
own to the upstream (127.0.0.1:--upstream-port); bytes go both ways unchanged. No
HTTP parsing, no JSON, no translation: a client speaks HTTP/1.1 (keep-alive and
all) straight through to the fake upstream. What a streamed chunk costs here is
what it costs any Python relay on this machine — one event-loop wake-up, one recv
and one send — so bench/run.py measures it (target `relay-floor`) beside the
gateway's figures: the part of "CPU per streamed chunk" no gateway code can remove.

It is an asyncio Protocol pair on uvloop (plain asyncio if uvloop is missing):
client bytes that arrive before the upstream connection is made are buffered;
when one side closes, the other is closed; a side whose peer's write buffer is
full stops reading until it drains (pause_reading / resume_reading).

Usage: python bench/relay.py --port 9001 --upstream-port 9000
Prints `ready <port>` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

HOST = "127.0.0.1"


class _Side(asyncio.Protocol):
    """One end of the pump; `peer` is the other end's transport (None while the
    upstream connection is being made)."""

    transport: asyncio.Transport | None = None
    peer: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None
        self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()  # sends what is buffered, then closes

    # Flow control: our transport's write buffer is full, so the peer stops reading.
    def pause_writing(self) -> None:
        if self.peer is not None and not self.peer.is_closing():
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and not self.peer.is_closing():
            self.peer.resume_reading()


class Upstream(_Side):
    def __init__(self, client: asyncio.Transport) -> None:
        self.peer = client


class Client(_Side):
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        client = self.transport
        try:
            upstream, _ = await loop.create_connection(lambda: Upstream(client), HOST, self.upstream_port)
        except OSError:
            client.close()
            return
        if client.is_closing():  # the client left while we connected
            upstream.close()
            return
        self.peer = upstream
        for data in self.pending:
            upstream.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.pending.append(data)
        else:
            self.peer.write(data)


async def serve(port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(upstream_port), HOST, port)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ready {port}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A zero-work TCP byte pump on 127.0.0.1 (the per-chunk CPU floor).")
    parser.add_argument("--port", type=int, required=True, help="where clients connect")
    parser.add_argument("--upstream-port", type=int, required=True, help="where each client connection is relayed to")
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        print("uvloop not installed: plain asyncio (a higher floor)", file=sys.stderr)
        asyncio.run(serve(args.port, args.upstream_port))
    else:
        uvloop.run(serve(args.port, args.upstream_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
