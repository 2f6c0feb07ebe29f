"""Replicas that hang (accept a request, never answer it) are passed over, not waited on by
every request: the request that found one silent is retried once on another instance when
nothing has reached the client, the requests after it go elsewhere for the cool-down, and
the instance is asked again once it is over. Timeouts are small; cool-downs are either
longer than any test or ended by moving the replicas' clock, never waited for."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from dragoman.assembly.gateway import Timings
from dragoman.core.redaction import Redactor
from dragoman.upstream.replicas import CoolDowns, Replicas
from tests.support.envelopes import error_of
from tests.support.fake_anthropic import FakeAnthropic, NativeReply, text_events
from tests.support.fakes import FakeUpstream, Reply, chunk, text_stream
from tests.support.servers import GatewayServer, sse_frames

VALID = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
FIRST_BYTE_TIMEOUT = 1.0  # small, yet far above what a healthy fake takes to answer on a loaded machine
# Rotation sends each test's requests to the failing replica too (cache-aware routing would keep one
# conversation on one replica: docs/routing.md).
FLEET = {"max_retries": 2, "first_byte_timeout": FIRST_BYTE_TIMEOUT, "routing": "round_robin"}


def _hangs(body: dict) -> Reply:
    return Reply(hang=60.0)  # accepts the request and never answers it (until the gateway leaves)


@pytest.fixture
def hung() -> Iterator[FakeUpstream]:
    """An instance that accepts every chat request and never answers it (its model list still
    answers, as a server whose engine hangs does)."""
    fake = FakeUpstream().start()
    fake.responder = _hangs
    yield fake
    fake.stop()


@pytest.fixture
def long_cool_down() -> Timings:
    """A silent instance stays passed over for longer than any test."""
    return Timings(cool_downs=CoolDowns(silent=3600.0))


def _answers_streams(upstream: FakeUpstream) -> None:
    upstream.responder = lambda body: Reply(chunks=text_stream("Hi", "!")) if body.get("stream") else None


def _client(gateway: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0, timeout=30)


def _replicas(gateway: GatewayServer, upstream: str = "default") -> Replicas:
    return gateway.app.state.gateway.backends[upstream]._http.replicas


def test_after_a_first_byte_timeout_requests_go_to_the_other_replica_without_waiting(
    make_gateway, upstream, hung, long_cool_down
):
    gateway = make_gateway(
        url=hung.url,
        upstream={"replicas": [upstream.url], **FLEET},
        server={"default_model": "test-model"},
        timings=long_cool_down,
    )
    client = _client(gateway)
    for _ in range(6):  # round robin would send every other one to the hung instance
        assert client.messages.create(**VALID).content[0].text == "Hello!"
    assert len(hung.requests) == 1  # the one that found it silent (and was retried): then passed over
    assert len(upstream.requests) == 6


@pytest.mark.parametrize("keepalive", [15.0, 0.2], ids=["before-commit", "after-keepalives"])
def test_a_stream_whose_replica_is_silent_is_retried_on_another(
    make_gateway, upstream, hung, long_cool_down, keepalive
):
    """Nothing of the answer has reached the client: with a keep-alive interval shorter than the
    timeout the stream is committed to 200 and has had comment lines, which are no part of it."""
    _answers_streams(upstream)
    gateway = make_gateway(url=hung.url, upstream={"replicas": [upstream.url], **FLEET},
                           server={"default_model": "test-model", "keepalive_interval": keepalive}, timings=long_cool_down)  # fmt: skip
    client = _client(gateway)
    for _ in range(4):
        with client.messages.stream(**VALID) as stream:
            assert stream.get_final_text() == "Hi!"
    assert len(hung.requests) == 1
    assert len(upstream.requests) == 4


def test_a_passthrough_stream_whose_replica_is_silent_is_retried_on_another(gateway_from, native, long_cool_down):
    silent = FakeAnthropic().start()
    silent.replies.extend(NativeReply(body={}, hang=60.0) for _ in range(4))
    native.replies.extend(NativeReply(events=text_events("Hi")) for _ in range(4))
    try:
        gateway = gateway_from({"server": {"default_model": "native-model", "keepalive_interval": 0.2},
                                "upstreams": {"n": {"url": silent.url, "replicas": [native.url], "protocol": "anthropic", **FLEET}}}, timings=long_cool_down)  # fmt: skip
        client = _client(gateway)
        for _ in range(4):
            with client.messages.stream(
                model="native-model", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                assert stream.get_final_text() == "Hi"
        assert len(silent.requests) == 1
        assert len(native.requests) == 4
    finally:
        silent.stop()


def test_a_stream_that_has_started_is_never_retried(make_gateway, upstream, long_cool_down):
    """Its first events reached the client: a replica that then falls silent ends it with an
    error event, and no other replica is sent the request."""

    def stalls(body: dict) -> Reply:  # the answer starts, then the replica falls silent
        return Reply(chunks=[chunk({"role": "assistant", "content": ""}), chunk({"content": "Hi"}), ("sleep", 30.0)])

    other = FakeUpstream().start()
    upstream.responder = other.responder = stalls
    try:
        gateway = make_gateway(
            upstream={"replicas": [other.url], **FLEET, "idle_timeout": 0.5},
            server={"default_model": "test-model"},
            timings=long_cool_down,
        )
        response = httpx.post(gateway.url + "/v1/messages", json={**VALID, "stream": True}, timeout=30)
        frames = sse_frames(response.text)
        assert ("content_block_delta", frames[2][1]) in frames and frames[2][1]["delta"]["text"] == "Hi"
        assert frames[-1][0] == "error" and frames[-1][1]["error"]["type"] == "timeout_error"
        assert len(upstream.requests) + len(other.requests) == 1
    finally:
        other.stop()


def test_with_every_replica_silent_the_gateway_still_tries_and_answers_a_timeout_error(make_gateway, hung):
    other = FakeUpstream().start()
    other.responder = _hangs
    try:
        gateway = make_gateway(
            url=hung.url, upstream={"replicas": [other.url], **FLEET}, server={"default_model": "test-model"}
        )
        client = _client(gateway)
        for tried in (2, 3):  # the first: both, once each; then both are passed over, and one is still asked
            with pytest.raises(anthropic.APIStatusError) as caught:
                client.messages.create(**VALID)
            assert "timed out" in error_of(caught, 504, "timeout_error")
            assert len(hung.requests) + len(other.requests) == tried
    finally:
        other.stop()


def test_a_replica_that_answers_again_is_used_again_after_its_cool_down(make_gateway, upstream, hung):
    gateway = make_gateway(
        url=hung.url, upstream={"replicas": [upstream.url], **FLEET}, server={"default_model": "test-model"}
    )
    gateway.wait_discovered()  # its model list is asked once, first: the rotation is the requests' alone from here
    client = _client(gateway)
    for _ in range(2):
        assert client.messages.create(**VALID).content[0].text == "Hello!"
    assert len(hung.requests) == 1  # found silent (the request went elsewhere): its cool-down runs
    now = [time.monotonic()]  # the replicas' clock from here: moved on, never waited for
    _replicas(gateway)._clock = lambda: now[0]
    hung.responder = None  # it answers again
    for _ in range(4):
        client.messages.create(**VALID)
    assert len(hung.requests) == 1  # still cooling down
    now[0] += CoolDowns().silent
    for _ in range(4):
        assert client.messages.create(**VALID).content[0].text == "Hello!"
    assert len(hung.requests) == 3  # its trial answered: back in the rotation, every other request


def test_a_connect_timeout_is_retried_on_another_replica_though_it_used_the_retry_budget(upstream):
    """A connect timeout as long as `retry_budget` (10 s each by default) left no budget for the
    retry the documentation promises; a retry sent at once to another instance waits for nothing."""
    import asyncio

    from dragoman.core.config import OpenAIUpstream
    from dragoman.upstream.client import HttpClient

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    filler = socket.create_connection(hole.getsockname())  # fills the accept queue: further SYNs go unanswered
    black_holed = f"http://127.0.0.1:{hole.getsockname()[1]}/v1"
    settings = OpenAIUpstream(
        url=black_holed, replicas=[upstream.url], connect_timeout=0.3, retry_budget=0.3, max_retries=1
    )

    async def main() -> None:
        client = HttpClient("up", settings, None, redactor=Redactor(), prefix="/v1")
        try:
            for _ in range(2):  # round robin starts at the black-holed instance
                response = await client.post("/chat/completions", b'{"model": "test-model", "messages": []}')
                response.release()
        finally:
            await client.close()

    try:
        asyncio.run(main())
    finally:
        filler.close()
        hole.close()
    assert len(upstream.requests) == 2
