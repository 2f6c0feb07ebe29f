"""A stream whose instance closes or resets its connection after the `200 text/event-stream`
head, before a byte of the body (a replica restarting as it takes the request), through the
real HTTP client and scripted replicas on loopback sockets: the request goes once more, at
once, to another free instance (`HttpClient.resends_broken`), and the one that broke is
passed over as unreachable. Each failure is scripted to happen after the client has read the
head: no test depends on timing."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import pytest

from dragoman.calls.types import Outcome
from dragoman.core.config import OpenAIUpstream
from dragoman.core.redaction import Redactor
from dragoman.upstream.client import HttpClient
from dragoman.upstream.keepalive import ReadWatch, Silence
from dragoman.upstream.transport.failures import Disconnected
from dragoman.upstream.transport.response import Response
from tests.support.peers import Peer, Script

STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
CLOSE_DELIMITED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"  # the body runs to the close
ANSWER = b"data: ok\n\n"


def breaks(how: str, head_read: asyncio.Event) -> Any:
    """A replica that sends a stream's head, then, once the client has read it, ends the connection
    `how`: "close" (a FIN mid-body), "reset" (an RST) or "close-delimited" (a body that runs to the
    close, closed before a byte)."""

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(CLOSE_DELIMITED_HEAD if how == "close-delimited" else STREAM_HEAD)
        await head_read.wait()
        if how == "reset":
            peer.writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
        peer.close()

    return handler


async def hangs_after_head(peer: Peer) -> None:
    """A replica that sends a stream's head and then nothing (a hung engine)."""
    await peer.request()
    await peer.send(STREAM_HEAD)
    await peer.until_eof(timeout=30.0)


async def answers(peer: Peer) -> None:
    while await peer.request() is not None:
        await peer.send(STREAM_HEAD, b"%x\r\n%b\r\n0\r\n\r\n" % (len(ANSWER), ANSWER))


def client_for(*roots: str, **settings: Any) -> HttpClient:
    upstream = OpenAIUpstream(  # no load_metrics: a GET /metrics would take one of a script's connections
        url=roots[0] + "/v1", replicas=[root + "/v1" for root in roots[1:]],
        **{"max_retries": 2, "load_metrics": False, **settings},
    )  # fmt: skip
    return HttpClient("up", upstream, None, redactor=Redactor(), prefix="/v1")


async def stream(client: HttpClient, outcome: Any, head_read: asyncio.Event) -> Response:
    """POST a stream request; once its head came, the replica may break; the response whose body
    began (or the broken one, not sent again), as a stream loop gets it from `Opening.begun`."""
    response = await client.post("/chat/completions", b"{}", outcome=outcome, stream=True)
    head_read.set()
    opening = response.opening
    assert opening is not None
    reads = ReadWatch(interval=60.0, first_byte_timeout=600.0, idle_timeout=600.0, upstream="up")
    try:
        while True:
            try:
                return await opening.begun(response, reads)
            except Silence:
                continue
    finally:
        reads.close()
        opening.close()


def run(main: Any) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(20):
            await main()

    asyncio.run(bounded())


@pytest.mark.parametrize("how", ["close", "reset", "close-delimited"])
def test_a_stream_broken_after_its_head_goes_to_another_replica(how: str) -> None:
    async def main() -> None:
        head_read = asyncio.Event()
        async with Script(breaks(how, head_read)) as broken, Script(answers) as other:
            client = client_for(broken.root, other.root)
            outcome = Outcome(request_id="req", endpoint="messages")
            try:
                response = await stream(client, outcome, head_read)
                assert await response.read() == ANSWER
                response.release()
                assert len(broken.peers) == 1 and len(other.peers) == 1
                assert outcome.retries == 1  # counted as any retry (within max_retries)
                assert not client.replicas.others_free(other.root)  # the one that broke is passed over
            finally:
                await client.close()

    run(main)


def test_a_second_stream_broken_after_its_head_is_not_sent_again() -> None:
    """Once per request: the request itself may be what brings a server down."""

    async def main() -> None:
        head_read = asyncio.Event()
        async with (
            Script(breaks("close", head_read)) as first,
            Script(breaks("close", head_read)) as second,
            Script(answers) as third,
        ):
            client = client_for(first.root, second.root, third.root)
            outcome = Outcome(request_id="req", endpoint="messages")
            try:
                response = await stream(client, outcome, head_read)
                with pytest.raises(Disconnected):  # the stream loop's read: an `error` event for the client
                    await response.readany()
                response.close()
                assert (len(first.peers), len(second.peers), len(third.peers)) == (1, 1, 0)
                assert outcome.retries == 1
            finally:
                await client.close()

    run(main)


def test_after_a_silent_replica_a_stream_broken_after_its_head_is_still_sent_again() -> None:
    """A silence and a broken stream each allow one retry of their own (within max_retries)."""

    async def main() -> None:
        head_read = asyncio.Event()
        async with (Script(hangs_after_head) as silent, Script(breaks("close", head_read)) as broken,
                    Script(answers) as other):  # fmt: skip
            client = client_for(silent.root, broken.root, other.root, first_byte_timeout=0.3)
            outcome = Outcome(request_id="req", endpoint="messages")
            try:
                response = await stream(client, outcome, head_read)
                assert await response.read() == ANSWER
                response.release()
                assert (len(silent.peers), len(broken.peers), len(other.peers)) == (1, 1, 1)
                assert outcome.retries == 2
            finally:
                await client.close()

    run(main)


@pytest.mark.parametrize("case", ["single instance", "other passed over", "no retries left"])
def test_with_no_retry_allowed_the_broken_stream_is_read_as_before(case: str) -> None:
    async def main() -> None:
        head_read = asyncio.Event()
        async with Script(breaks("close", head_read)) as broken, Script(answers) as other:
            roots = [broken.root] if case == "single instance" else [broken.root, other.root]
            client = client_for(*roots, max_retries=0 if case == "no retries left" else 2)
            if case == "other passed over":
                client.replicas.failed(other.root, silent=False)
            outcome = Outcome(request_id="req", endpoint="messages")
            try:
                response = await stream(client, outcome, head_read)
                with pytest.raises(Disconnected):
                    await response.readany()
                response.close()
                assert len(broken.peers) == 1 and len(other.peers) == 0
                assert outcome.retries == 0
                if case != "single instance":
                    assert not client.replicas.others_free(other.root)  # the one that broke is passed over
            finally:
                await client.close()

    run(main)
