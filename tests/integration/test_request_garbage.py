"""A finished request is freed as it ends, over real sockets: nothing of it is left in a
reference cycle for the garbage collector, whose young collections would otherwise free a
batch of requests at once (milliseconds of pause, in the latency's tail: docs/performance.md)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from collections.abc import Set as AbstractSet

import httpx
import pytest

from dragoman.calls.types import Outcome
from dragoman.server.serving import DirectBody
from dragoman.upstream.transport.response import Response
from tests.support.fakes import FakeUpstream, Reply, text_stream
from tests.support.servers import GatewayServer, make_config
from tests.support.waiting import eventually

HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
REQUEST = {"model": "test-model", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}
KINDS = (Outcome, Response, DirectBody)


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def alive(before: AbstractSet[int] = frozenset()) -> list[object]:
    """The requests' objects alive, but for those `before` names (another test's, in this worker)."""
    return [o for o in gc.get_objects() if isinstance(o, KINDS) and id(o) not in before]


def test_whole_and_streamed_requests_leave_nothing_to_collect(upstream: FakeUpstream, collector_off: None) -> None:
    upstream.responder = lambda body: Reply(chunks=text_stream("Hello", " there")) if body.get("stream") else None
    server = GatewayServer(make_config(upstream.url)).start()
    before = {id(o) for o in alive()}
    try:
        with httpx.Client(base_url=server.url, headers=HEADERS, timeout=10) as client:
            for stream in (False, True) * 5:
                assert client.post("/v1/messages", json={**REQUEST, "stream": stream}).status_code == 200
        # (closed: the server's connection no longer holds its last request)
        eventually(lambda: not alive(before), "every request freed without a collection")
    finally:
        server.stop()
