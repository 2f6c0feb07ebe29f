"""A replica that closes a stream's connection after its `200 text/event-stream` head and before
a byte of its body (it restarts, or crashes, as it takes the request) is no answer: the stream
goes once more, at once, to another free replica, and the client, through the official SDK,
gets a complete, normal message. Cool-downs are longer than any test, never waited for."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest

from dragoman.assembly.gateway import Timings
from dragoman.upstream.replicas import CoolDowns
from tests.support.fake_anthropic import FakeAnthropic, NativeReply, text_events
from tests.support.fakes import FakeUpstream, Reply, text_stream

VALID = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
NATIVE = {"model": "native-model", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
# Rotation sends each test's requests to the failing replica too (cache-aware routing would keep one
# conversation on one replica: docs/routing.md).
FLEET = {"max_retries": 2, "routing": "round_robin"}
STREAMS = 3  # round robin over two replicas: at least one goes to the one that closes


@pytest.fixture
def long_cool_down() -> Timings:
    """A replica that closed a connection stays passed over for longer than any test."""
    return Timings(cool_downs=CoolDowns(unreachable=3600.0))


@pytest.fixture
def closing() -> Iterator[FakeUpstream]:
    """A replica that sends every stream's head and then closes its connection."""
    fake = FakeUpstream().start()
    fake.responder = lambda body: Reply(chunks=[], cut=True, done=False) if body.get("stream") else None
    yield fake
    fake.stop()


def _client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=30)


def test_a_translated_stream_closed_after_its_head_is_answered_by_another_replica(
    make_gateway, upstream, closing, long_cool_down
):
    upstream.responder = lambda body: Reply(chunks=text_stream("Hi", "!")) if body.get("stream") else None
    gateway = make_gateway(
        url=closing.url,
        upstream={"replicas": [upstream.url], **FLEET},
        server={"default_model": "test-model"},
        timings=long_cool_down,
    )
    client = _client(gateway.url)
    for _ in range(STREAMS):
        with client.messages.stream(**VALID) as stream:
            assert stream.get_final_text() == "Hi!"
            assert stream.get_final_message().stop_reason == "end_turn"
    assert len(closing.requests) == 1  # the one that found it closing: then passed over
    assert len(upstream.requests) == STREAMS


def test_a_passthrough_stream_closed_after_its_head_is_answered_by_another_replica(
    gateway_from, native, long_cool_down
):
    """The client's response head goes out with the stream's first event: its `anthropic-*`
    headers are those of the replica that answered, not of the one that closed."""
    closes = FakeAnthropic().start()
    closes.replies.extend(
        NativeReply(events=["close"], headers={"anthropic-organization-id": "closed"}) for _ in range(STREAMS)
    )
    native.replies.extend(NativeReply(events=text_events("Hi"), headers={"anthropic-organization-id": "answered"})
                          for _ in range(STREAMS))  # fmt: skip
    try:
        gateway = gateway_from({"server": {"default_model": "native-model"},
                                "upstreams": {"n": {"url": closes.url, "replicas": [native.url], "protocol": "anthropic", **FLEET}}}, timings=long_cool_down)  # fmt: skip
        client = _client(gateway.url)
        heads = []
        for _ in range(STREAMS):
            with client.messages.stream(**NATIVE) as stream:
                assert stream.get_final_text() == "Hi"
                assert stream.get_final_message().stop_reason == "end_turn"
                heads.append(stream.response.headers["anthropic-organization-id"])
        assert len(closes.requests) == 1
        assert len(native.requests) == STREAMS
        assert heads == ["answered"] * STREAMS
    finally:
        closes.stop()


def test_with_no_other_replica_a_stream_closed_after_its_head_is_a_502(make_gateway, closing):
    """Nothing of the stream went out: the client gets a status it can retry, not an error event."""
    gateway = make_gateway(url=closing.url, upstream=FLEET, server={"default_model": "test-model"})
    response = httpx.post(gateway.url + "/v1/messages", json={**VALID, "stream": True}, timeout=30)
    assert response.status_code == 502 and response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "api_error" and "closed the connection" in error["message"]
    assert response.json()["request_id"] == response.headers["request-id"]
    assert len(closing.requests) == 1
