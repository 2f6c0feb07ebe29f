"""A stream's response until its body begins (backends.opening): the instance answers with
the first body bytes, not the head; none within first_byte_timeout of the request makes it
silent, and the request is sent again when the client (HttpClient.resends_silent) says so; one
that ends before a byte is sent again when HttpClient.resends_broken says so.
Responses and the client are stand-ins; waits are ended by events, never by the clock."""

from __future__ import annotations

import asyncio
import gc
import math
from typing import Any

import pytest

from dragoman.core.errors import UpstreamError, UpstreamTimeout
from dragoman.upstream.keepalive import ReadWatch, Silence
from dragoman.upstream.opening import Opening, Sending
from tests.support.peers import Peer, scripted_pool

A, B = "http://a:8000", "http://b:8000"
TIMEOUT = 0.1  # first_byte_timeout


class Head:
    """A stream response whose head came: its body begins when `begin` is set (or never)."""

    def __init__(self, *, content_type: str = "text/event-stream", has_bytes: bool = True) -> None:
        self.sent_at = asyncio.get_running_loop().time()
        self.content_type = content_type
        self.opening: object | None = object() if content_type == "text/event-stream" else None
        self.begin = asyncio.Event()
        self.has_bytes = has_bytes
        self.closed = False

    async def readable(self) -> bool:
        await self.begin.wait()
        return self.has_bytes

    def close(self) -> None:
        self.closed = True


class Verdicts:
    """What the opening told the replicas, in order."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []

    def answered(self, root: str) -> None:
        self.said.append(("answered", root))

    def failed(self, root: str, *, silent: bool) -> None:
        self.said.append(("silent" if silent else "failed", root))

    def abandoned(self, root: str) -> None:
        self.said.append(("abandoned", root))


class Client:
    """The HTTP client as an opening sees it: whether it sends again, and what that gives."""

    name = "up"

    def __init__(self, *, resends: bool = True) -> None:
        self.replicas = Verdicts()
        self.resends = resends
        self.next: asyncio.Future[Head] = asyncio.get_running_loop().create_future()
        self.resent = 0
        self.cancelled = False

    def resends_silent(self, request: Sending, root: str) -> bool:
        return self.resends

    def resends_broken(self, request: Sending, root: str) -> bool:
        return self.resends

    async def resend(self, request: Sending) -> Head:
        self.resent += 1
        request.root = B
        try:
            head = await asyncio.shield(self.next)
            head.sent_at = asyncio.get_running_loop().time()  # its request went out just now
            return head
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def opening_for(client: Client) -> Opening:
    request = Sending("/v1/chat/completions", b"", b"{}", None, True, math.inf, root=A)
    return Opening(client, request, A, TIMEOUT)  # type: ignore[arg-type]


def watch(interval: float = 60.0) -> ReadWatch:
    return ReadWatch(interval=interval, first_byte_timeout=600.0, idle_timeout=600.0, upstream="up")


async def begun(opening: Opening, first: Head, reads: ReadWatch) -> tuple[Any, int]:
    """The response `begun` settles on, and how many silences came before."""
    silences = 0
    while True:
        try:
            return await opening.begun(first, reads), silences  # type: ignore[arg-type]
        except Silence:
            silences += 1


def test_a_body_that_begins_is_an_answer_and_the_same_response_is_read() -> None:
    async def main() -> None:
        client, first = Client(), Head()
        asyncio.get_running_loop().call_soon(first.begin.set)
        response, _ = await begun(opening_for(client), first, watch())
        assert response is first and not first.closed
        assert client.replicas.said == [("answered", A)]

    asyncio.run(main())


def test_no_body_byte_within_the_timeout_of_the_request_sends_it_again_and_the_instance_is_silent() -> None:
    """The deadline is the request's first_byte_timeout, not the watch's (600 s here)."""

    async def main() -> None:
        client, first, second = Client(), Head(), Head()
        second.begin.set()
        client.next.set_result(second)
        opening = opening_for(client)
        response, _ = await begun(opening, first, watch())
        assert response is second and first.closed
        assert client.replicas.said == [("silent", A), ("answered", B)]
        opening.close()  # the stream is over: nothing of an opening that began is closed
        assert not second.closed

    asyncio.run(main())


def test_while_the_request_is_sent_again_the_caller_keeps_its_stream_alive() -> None:
    async def main() -> None:
        client, first, second = Client(), Head(), Head()
        second.begin.set()
        reads = watch(interval=0.02)
        opening = opening_for(client)
        silences = 0
        while client.resent == 0 or silences < 2:  # silences before the deadline, and while sent again
            with pytest.raises(Silence):
                await opening.begun(first, reads)  # type: ignore[arg-type]
            silences += 1
        client.next.set_result(second)
        response, _ = await begun(opening, first, reads)
        assert response is second and client.resent == 1

    asyncio.run(main())


def test_not_sent_again_the_stream_times_out_naming_the_wait() -> None:
    async def main() -> None:
        client, first = Client(resends=False), Head()
        with pytest.raises(UpstreamTimeout) as caught:
            await begun(opening_for(client), first, watch())
        assert f"no response within {TIMEOUT:g} s" in caught.value.message
        assert first.closed and client.resent == 0
        assert client.replicas.said == [("silent", A)]

    asyncio.run(main())


def test_a_stream_closed_while_sent_again_cancels_that_request_and_ends_the_trial() -> None:
    """The client left: the instance asked again stops working on it, and one on trial is free."""

    async def main() -> None:
        client, first = Client(), Head()
        reads = watch(interval=0.02)
        opening = opening_for(client)
        while client.resent == 0:
            with pytest.raises(Silence):
                await opening.begun(first, reads)  # type: ignore[arg-type]
        opening.close()
        await asyncio.sleep(0)
        assert client.cancelled  # (the real client's send ends that instance's trial as it is cancelled)
        assert client.replicas.said == [("silent", A)]  # not "abandoned": the silent instance's cool-down stands

    asyncio.run(main())


def test_a_stream_closed_before_the_body_began_ends_the_trial_of_the_instance_it_waits_on() -> None:
    async def main() -> None:
        client, first, second = Client(), Head(), Head()
        client.next.set_result(second)
        reads = watch(interval=0.02)
        opening = opening_for(client)
        while opening.root != B:  # sent again, and its head came; its body has not begun
            with pytest.raises(Silence):
                await opening.begun(first, reads)  # type: ignore[arg-type]
        opening.close()
        assert second.closed
        assert client.replicas.said == [("silent", A), ("abandoned", B)]

    asyncio.run(main())


def test_a_resend_answered_without_an_event_stream_is_an_upstream_error() -> None:
    async def main() -> None:
        client, first, json = Client(), Head(), Head(content_type="application/json")
        client.next.set_result(json)
        with pytest.raises(UpstreamError) as caught:
            await begun(opening_for(client), first, watch())
        assert "without a stream (application/json)" in caught.value.message
        assert json.closed

    asyncio.run(main())


def test_a_body_that_ends_or_breaks_before_a_byte_is_no_answer_and_the_request_is_sent_again() -> None:
    """The instance is passed over as unreachable (test_reopening: through the real client)."""

    async def main() -> None:
        client, first, second = Client(), Head(has_bytes=False), Head()
        first.begin.set()
        second.begin.set()
        client.next.set_result(second)
        response, _ = await begun(opening_for(client), first, watch())
        assert response is second and first.closed and client.resent == 1
        assert client.replicas.said == [("failed", A), ("answered", B)]

    asyncio.run(main())


def test_a_body_that_ends_or_breaks_before_a_byte_not_sent_again_is_read_as_it_ended() -> None:
    """The loop's read reports how it ended (an `error` event)."""

    async def main() -> None:
        client, first = Client(resends=False), Head(has_bytes=False)
        first.begin.set()
        opening = opening_for(client)
        response, _ = await begun(opening, first, watch())
        assert response is first and not first.closed and client.resent == 0
        opening.close()
        assert client.replicas.said == [("failed", A)]  # not "abandoned" as well

    asyncio.run(main())


def test_expect_by_moves_the_deadline_of_the_next_data_either_way() -> None:
    async def main() -> None:
        never = asyncio.get_running_loop().create_future()
        reads = watch()
        reads.expect_by(asyncio.get_running_loop().time() + 0.02)  # sooner than its first_byte_timeout
        with pytest.raises(UpstreamTimeout):
            await reads.read(asyncio.shield(never))
        reads.close()
        short = ReadWatch(interval=0.02, first_byte_timeout=0.01, idle_timeout=600.0, upstream="up")
        short.expect_by(math.inf)  # later: only silences
        for _ in range(3):
            with pytest.raises(Silence):
                await short.read(asyncio.shield(never))
        short.close()

    asyncio.run(main())


def test_readable_waits_for_the_first_body_bytes_and_leaves_them_for_readany() -> None:
    begin = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await begin.wait()
        await peer.send(b"5\r\nfirst\r\n")
        await begin.wait()
        peer.close()  # mid-body

    async def main() -> None:
        async with scripted_pool(handler) as (server, pool):
            response = await pool.request(server.root, b"POST", "/stream", b"", b"{}")
            waiting = asyncio.ensure_future(response.readable())
            await asyncio.sleep(0.01)  # pacing: a chance to finish, which it must not take
            assert not waiting.done()  # the head alone: nothing to read
            begin.set()
            assert await waiting is True
            assert await response.readany() == b"first"
            assert await response.readable() is False  # broken before more came
            response.close()

    asyncio.run(main())


def test_once_the_body_began_no_cycle_holds_the_request() -> None:
    """A Response holds its Opening, which holds the request's body (80 KB from Claude Code):
    a cycle back from the Opening would keep every stream's body until the garbage collector
    runs (RSS grew by 45 MB in the benchmark's Claude-Code-sized cells)."""

    async def main() -> None:
        client, first = Client(), Head()
        opening = opening_for(client)
        first.opening = opening  # as HttpClient.post sets it
        asyncio.get_running_loop().call_soon(first.begin.set)
        response, _ = await begun(opening, first, watch())
        assert response is first and first.opening is None
        assert not [r for r in gc.get_referents(opening) if isinstance(r, Head)]

    asyncio.run(main())
