"""EventStreamResponse: the one loop every streamed chunk passes through. Whatever
the stream does, the client gets a well-formed end and the outcome is recorded once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from dragoman.assembly.observe import Metrics
from dragoman.calls.types import Outcome
from dragoman.core.errors import UpstreamError, UpstreamTimeout
from dragoman.protocol.sse import KEEPALIVE_COMMENT, PING
from dragoman.server.endpoints import EventStreamResponse

DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta"}\n\n'


class Recorder(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.recorded: list[Outcome] = []

    def record(self, outcome: Outcome) -> None:
        self.recorded.append(outcome)
        super().record(outcome)


def serve(chunks: AsyncIterator[bytes]) -> tuple[list[dict[str, Any]], Outcome, Recorder]:
    metrics = Recorder()
    outcome = metrics.outcome("req_1", "messages")
    outcome.upstream = "up"
    response = EventStreamResponse(chunks, headers={}, status_code=200, outcome=outcome, metrics=metrics)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(response({"type": "http"}, receive, send))  # type: ignore[arg-type]
    return sent, outcome, metrics


def bodies(sent: list[dict[str, Any]]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


def test_chunks_in_order_then_the_end_and_one_record() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield KEEPALIVE_COMMENT
        yield DELTA
        yield PING
        yield DELTA

    sent, outcome, metrics = serve(chunks())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert bodies(sent) == [KEEPALIVE_COMMENT, DELTA, PING, DELTA, b""]
    assert sent[-1]["more_body"] is False
    assert outcome.keepalives == 2 and outcome.first_byte is not None and not outcome.disconnected
    assert metrics.recorded == [outcome]


def test_a_gateway_error_mid_stream_becomes_an_error_event() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield DELTA
        raise UpstreamTimeout("upstream up sent nothing for longer than its idle timeout")

    sent, outcome, metrics = serve(chunks())
    first, error, end = bodies(sent)
    assert first == DELTA and end == b""
    name, data = error.decode().strip().split("\n")
    assert name == "event: error"
    assert (
        json.loads(data.removeprefix("data: "))["error"]["message"]
        == "upstream up sent nothing for longer than its idle timeout"
    )
    assert outcome.error_type == "timeout_error"
    assert outcome.upstream_failed and metrics.recorded == [outcome]


def test_a_bug_mid_stream_still_ends_the_stream_well_formed() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield DELTA
        raise RuntimeError("a bug")

    sent, outcome, metrics = serve(chunks())
    first, error, end = bodies(sent)
    assert error.startswith(b"event: error\n") and b"internal error" in error and end == b""
    assert outcome.error_type == "api_error" and metrics.recorded == [outcome]


def test_a_client_gone_stops_the_stream_and_closes_it() -> None:
    closed: list[bool] = []

    async def chunks() -> AsyncIterator[bytes]:
        try:
            while True:
                yield DELTA
                await asyncio.sleep(0.01)
        finally:
            closed.append(True)

    metrics = Recorder()
    outcome = metrics.outcome("req_1", "messages")
    response = EventStreamResponse(chunks(), headers={}, status_code=200, outcome=outcome, metrics=metrics)

    bodies_sent: list[dict[str, Any]] = []
    some_sent = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await some_sent.wait()  # the client hangs up after a few chunks
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            bodies_sent.append(message)
            if len(bodies_sent) == 3:
                some_sent.set()

    async def main() -> None:
        await asyncio.wait_for(response({"type": "http"}, receive, send), 5)  # type: ignore[arg-type]

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        pass  # the watch cancels the task serving the response, as the server's would be
    assert closed == [True] and outcome.disconnected and metrics.recorded == [outcome]


def test_on_close_runs_when_the_client_is_gone_before_the_head() -> None:
    """The head goes out with the first chunk, and the client is gone by then: the stream's
    own clean-up runs, and `on_close` closes the upstream response as well."""
    closed: list[str] = []

    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield DELTA
        finally:
            closed.append("generator")

    outcome = Outcome(request_id="req_1", endpoint="messages", upstream="up")
    response = EventStreamResponse(chunks(), headers={}, status_code=200, outcome=outcome, metrics=Recorder(),
                                   on_close=lambda: closed.append("on_close"))  # fmt: skip

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client is gone")

    asyncio.run(response({"type": "http"}, receive, send))  # type: ignore[arg-type]
    assert closed == ["generator", "on_close"]
    assert outcome.disconnected


def test_the_head_goes_out_with_the_first_chunk_and_the_reply_headers_as_they_are_then() -> None:
    headers = {"anthropic-ratelimit-requests-remaining": "9"}
    order: list[str] = []

    async def chunks() -> AsyncIterator[bytes]:
        order.append("first chunk made")
        headers["anthropic-ratelimit-requests-remaining"] = "8"  # the stream went to another instance
        yield DELTA

    outcome = Outcome(request_id="req_1", endpoint="messages", upstream="up")
    response = EventStreamResponse(chunks(), headers=headers, status_code=200, outcome=outcome, metrics=Recorder(),
                                   request_id="req_1")  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        order.append(message["type"])
        sent.append(message)

    asyncio.run(response({"type": "http"}, receive, send))  # type: ignore[arg-type]
    assert order[:3] == ["first chunk made", "http.response.start", "http.response.body"]
    head = dict(sent[0]["headers"])
    assert head[b"anthropic-ratelimit-requests-remaining"] == b"8"
    assert head[b"request-id"] == b"req_1" and head[b"content-type"].startswith(b"text/event-stream")
    assert bodies(sent) == [DELTA, b""]


def test_a_gateway_error_before_the_first_chunk_is_an_http_error_with_its_status() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        raise UpstreamError("upstream up failed: the upstream closed the connection mid-reply")
        yield DELTA  # an async generator

    sent, outcome, metrics = serve(chunks())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 502
    assert dict(sent[0]["headers"])[b"content-type"] == b"application/json"
    envelope = json.loads(sent[1]["body"])
    assert envelope["type"] == "error" and envelope["error"]["type"] == "api_error"
    assert "closed the connection mid-reply" in envelope["error"]["message"]
    assert outcome.status == 502 and outcome.error_type == "api_error" and not outcome.disconnected
    assert metrics.recorded == [outcome]


def test_a_bug_before_the_first_chunk_is_a_500_in_anthropics_envelope() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        raise RuntimeError("a bug")
        yield DELTA  # an async generator

    sent, outcome, metrics = serve(chunks())
    assert sent[0]["status"] == 500
    assert json.loads(sent[1]["body"])["error"]["type"] == "api_error"
    assert outcome.status == 500 and metrics.recorded == [outcome]
