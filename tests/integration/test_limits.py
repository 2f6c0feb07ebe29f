"""[limits] through the official SDK over a real socket: Anthropic's rate-limit headers on
every reply, a 429 before the backend is reached, settled token counts, concurrency queues."""

from __future__ import annotations

import threading
from typing import Any

import anthropic
import httpx2
import pytest

from dragoman.server.auth import key_id as _key_id
from tests.support.batches import wait_ended
from tests.support.fake_anthropic import NativeReply, message, text_events
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream
from tests.support.usage import wait_recorded
from tests.support.waiting import eventually

KEYS = {"api_keys": ["sk-solo"], "tenants": {"team-a": ["sk-a1", "sk-a2"]}}


def _config(upstream: FakeUpstream, limits: dict[str, Any], server: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"server": server or KEYS, "limits": limits,
            "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}}  # fmt: skip


def _client(gateway: Any, key: str = "sk-solo", retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=retries)


def _ask(client: anthropic.Anthropic, max_tokens: int = 100) -> Any:
    return client.messages.with_raw_response.create(
        model="test-model", max_tokens=max_tokens, messages=[{"role": "user", "content": "Hi"}]
    )


def test_every_reply_carries_anthropics_headers(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"requests_per_minute": 10, "input_tokens_per_minute": 1000,
                                              "output_tokens_per_minute": 500}))  # fmt: skip
    upstream.queue(Reply(body=completion(prompt=30, completion_tokens=5)))
    raw = _ask(_client(gateway))
    headers = raw.headers
    assert headers["anthropic-ratelimit-requests-limit"] == "10"
    assert headers["anthropic-ratelimit-requests-remaining"] == "9"
    assert headers["anthropic-ratelimit-output-tokens-limit"] == "500"
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "400"  # max_tokens reserved
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "1000"  # charged at the end
    assert headers["anthropic-ratelimit-tokens-limit"] == "500"  # the nearer to empty of input and output
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    # The next reply shows the first one settled: 30 input tokens taken, 95 of 100 output tokens refunded.
    with _client(gateway).messages.with_streaming_response.create(
        model="test-model", max_tokens=100, stream=True, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        assert stream.headers["anthropic-ratelimit-requests-remaining"] == "8"
        # (and what the buckets refilled meanwhile: 1000 and 500 a minute)
        assert 970 <= int(stream.headers["anthropic-ratelimit-input-tokens-remaining"]) < 990
        assert 500 - 5 - 100 <= int(stream.headers["anthropic-ratelimit-output-tokens-remaining"]) < 500 - 5 - 100 + 10
        assert stream.headers["content-type"].startswith("text/event-stream")
        b"".join(stream.iter_bytes())


def test_over_the_limit_is_a_429_that_never_reaches_the_backend(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"requests_per_minute": 2}))
    client = _client(gateway)
    for _ in range(2):
        _ask(client)
    with pytest.raises(anthropic.RateLimitError) as caught:
        _ask(client)
    error = caught.value
    assert error.status_code == 429
    assert error.body["error"]["type"] == "rate_limit_error"
    assert "limits.requests_per_minute" in error.body["error"]["message"]
    assert int(error.response.headers["retry-after"]) == 30  # one request of 2 per minute
    assert error.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert len(upstream.requests) == 2
    # Another key has buckets of its own.
    _ask(_client(gateway, "sk-a1"))
    assert len(upstream.requests) == 3


def test_a_tenants_keys_share_its_limits(upstream, gateway_from):
    gateway = gateway_from(
        _config(upstream, {"requests_per_minute": 100, "tenants": {"team-a": {"requests_per_minute": 2}}})
    )
    _ask(_client(gateway, "sk-a1"))
    _ask(_client(gateway, "sk-a2"))
    with pytest.raises(anthropic.RateLimitError) as caught:
        _ask(_client(gateway, "sk-a1"))
    assert "limits.tenants.team-a.requests_per_minute" in caught.value.body["error"]["message"]
    assert "tenant team-a" in caught.value.body["error"]["message"]
    _ask(_client(gateway, "sk-solo"))  # [limits] for a key of no tenant


def test_per_model_limits(upstream, gateway_from):
    config = _config(upstream, {"models": {"test-model": {"requests_per_minute": 1}}})
    config["models"] = [{"name": "test-model", "upstream": "default"}, {"name": "other", "upstream": "default"}]
    gateway = gateway_from(config)
    client = _client(gateway)
    _ask(client)
    with pytest.raises(anthropic.RateLimitError) as caught:
        _ask(client)
    assert "limits.models.test-model.requests_per_minute" in caught.value.body["error"]["message"]
    client.messages.create(model="other", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])


def test_the_sdk_retries_a_429_by_its_retry_after(upstream, gateway_from):
    gateway = gateway_from(
        _config(upstream, {"requests_per_minute": 12})
    )  # one more every 5 s: a slow machine still meets the 429
    client = _client(gateway)
    served = 0
    for _ in range(200):  # until the bucket is empty: 60 at once, more if the machine is slow to send them
        try:
            _ask(client)
        except anthropic.RateLimitError:
            break
        served += 1
    refusals: list[str] = []
    hooks = {"response": [lambda r: refusals.append(r.headers.get("retry-after")) if r.status_code == 429 else None]}
    retrying = anthropic.Anthropic(base_url=gateway.url, api_key="sk-solo", max_retries=2,
                                   http_client=httpx2.Client(event_hooks=hooks))  # fmt: skip
    message = retrying.messages.create(model="test-model", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert message.content[0].text == "Hello!"
    assert refusals and 1 <= int(refusals[0]) <= 5  # refused once, retried after the seconds it named
    assert len(upstream.requests) == served + 1


def test_output_tokens_are_reserved_from_max_tokens(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"output_tokens_per_minute": 1000}))
    client = _client(gateway)
    with pytest.raises(anthropic.RateLimitError) as caught:  # 1000 are there; the request needs its max_tokens
        blocker = threading.Event()
        upstream.queue(Reply(body=completion(completion_tokens=900), hold=blocker))
        first = threading.Thread(target=_ask, args=(client, 1000))
        first.start()
        try:
            while not upstream.requests:
                threading.Event().wait(0.01)
            _ask(client, 10)  # the first holds all 1000 until it ends
        finally:
            blocker.set()
            first.join()
    assert "limits.output_tokens_per_minute" in caught.value.body["error"]["message"]
    raw = _ask(client, 10)  # settled at 900: 100 back, and a little refill
    assert 90 <= int(raw.headers["anthropic-ratelimit-output-tokens-remaining"]) <= 110


def test_count_tokens_counts_as_a_request_without_tokens(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"requests_per_minute": 2, "output_tokens_per_minute": 50}))
    client = _client(gateway)
    raw = client.messages.with_raw_response.count_tokens(
        model="test-model", messages=[{"role": "user", "content": "Hi"}]
    )
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "1"
    assert raw.headers["anthropic-ratelimit-output-tokens-remaining"] == "50"
    _ask(client, 10)
    with pytest.raises(anthropic.RateLimitError):
        client.messages.count_tokens(model="test-model", messages=[{"role": "user", "content": "Hi"}])


def test_a_stream_cut_by_the_client_is_settled(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"output_tokens_per_minute": 1000, "max_concurrent": 1}))
    upstream.queue(Reply(chunks=[*text_stream("a", "b"), ("sleep", 30)], done=False))
    client = _client(gateway)
    with client.messages.stream(model="test-model", max_tokens=300, messages=[{"role": "user", "content": "Hi"}]) as s:
        next(iter(s.text_stream))
    # The slot is free again (else this would queue and time out), and the reservation came back but for
    # the two tokens the upstream reported.
    raw = _ask(client, 10)
    assert int(raw.headers["anthropic-ratelimit-output-tokens-remaining"]) >= 1000 - 2 - 10


def _held(upstream: FakeUpstream) -> threading.Event:
    """The next upstream request is held until the returned event is set."""
    release = threading.Event()
    upstream.queue(Reply(body=completion(), hold=release))
    return release


def test_max_concurrent_queues_then_serves(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"max_concurrent": 1, "queue_timeout": 30}))
    release = _held(upstream)
    first = threading.Thread(target=_ask, args=(_client(gateway),))
    first.start()
    eventually(lambda: len(upstream.requests) == 1, "the first request reached the upstream")
    answers: list[Any] = []
    second = threading.Thread(target=lambda: answers.append(_ask(_client(gateway))))
    second.start()
    slots = gateway.app.gateway.limits.concurrency
    eventually(lambda: slots.in_use("{k:" + _key_id("sk-solo") + "}:*:slots") == 2, "the second request queued")
    assert len(upstream.requests) == 1  # queued, not sent
    release.set()
    first.join()
    second.join()
    assert answers[0].http_response.status_code == 200
    assert len(upstream.requests) == 2


def test_max_concurrent_answers_429_after_the_queue_timeout(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"max_concurrent": 1, "queue_timeout": 0.2}))
    release = _held(upstream)
    first = threading.Thread(target=_ask, args=(_client(gateway),))
    first.start()
    try:
        eventually(lambda: len(upstream.requests) == 1, "the first request reached the upstream")
        with pytest.raises(anthropic.RateLimitError) as caught:
            _ask(_client(gateway))
        assert "limits.max_concurrent" in caught.value.body["error"]["message"]
        _ask(_client(gateway, "sk-a1"))  # another key's slots
    finally:
        release.set()
        first.join()


def test_a_client_that_leaves_the_queue_is_not_served(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"max_concurrent": 1, "queue_timeout": 30}))
    release = _held(upstream)
    first = threading.Thread(target=_ask, args=(_client(gateway),))
    first.start()
    slots = gateway.app.gateway.limits.concurrency
    key = "{k:" + _key_id("sk-solo") + "}:*:slots"
    try:
        eventually(lambda: len(upstream.requests) == 1, "the first request reached the upstream")
        impatient = anthropic.Anthropic(base_url=gateway.url, api_key="sk-solo", max_retries=0, timeout=0.5)
        with pytest.raises(anthropic.APITimeoutError):
            _ask(impatient)  # queued, then gone
        eventually(lambda: slots.in_use(key) == 1, "the client that left is out of the queue")
    finally:
        release.set()
        first.join()
    _ask(_client(gateway))
    assert len(upstream.requests) == 2  # the one that left never reached the upstream


def test_a_daily_budget_is_a_429_naming_it_that_is_not_retried(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"tenants": {"team-a": {"tokens_per_day": 50}}}))
    upstream.queue(Reply(body=completion(prompt=30, completion_tokens=25)))
    client = _client(gateway, "sk-a1", retries=2)
    _ask(client)  # 55 of 50: past the budget only now
    with pytest.raises(anthropic.RateLimitError) as caught:
        _ask(client)
    message = caught.value.body["error"]["message"]
    assert "limits.tenants.team-a.tokens_per_day" in message and "resets at" in message and "T00:00:00Z" in message
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(upstream.requests) == 1  # neither retried nor sent
    _ask(_client(gateway, "sk-solo"))  # no budget for a key of no tenant


def test_batch_requests_draw_on_their_keys_limits(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"requests_per_minute": 60}))
    client = _client(gateway)
    params = {"model": "test-model", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}
    batch = client.messages.batches.create(requests=[{"custom_id": f"r{i}", "params": params} for i in range(61)])
    ended = wait_ended(client, batch.id, timeout=30)
    assert ended.request_counts.succeeded == 61  # the one past the limit waited its turn, not failed
    with pytest.raises(anthropic.RateLimitError):
        _ask(client)  # the key's bucket is empty
    _ask(_client(gateway, "sk-a1"))


def test_fail_closed_answers_503_while_redis_is_unreachable(upstream, gateway_from, dead_port):
    gateway = gateway_from(_config(upstream, {"requests_per_minute": 10, "on_redis_error": "fail_closed",
                                              "redis_url": f"redis://127.0.0.1:{dead_port}/0"}))  # fmt: skip
    with pytest.raises(anthropic.InternalServerError) as caught:
        _ask(_client(gateway))
    assert caught.value.status_code == 503 and "Redis" in caught.value.body["error"]["message"]
    assert not upstream.requests


def test_a_passthrough_stream_cut_by_the_client_is_settled_with_what_it_relayed(native, gateway_from):
    gateway = gateway_from({"server": KEYS, "limits": {"output_tokens_per_minute": 1000},
                            "upstreams": {"native": {"url": native.url, "protocol": "anthropic", "max_retries": 0}},
                            "models": [{"name": "native-model", "upstream": "native"}]})  # fmt: skip
    native.replies.append(NativeReply(events=[*text_events("Hello " * 10)[:3], ("sleep", 30)]))
    client = _client(gateway)
    with client.messages.stream(
        model="native-model", max_tokens=300, messages=[{"role": "user", "content": "Hi"}]
    ) as s:
        assert next(iter(s.text_stream)) == "Hello " * 10
    wait_recorded(gateway, 1)  # the gateway has seen the client leave: the stream is settled
    native.replies.append(NativeReply(body=message("ok")))
    raw = client.messages.with_raw_response.create(model="native-model", max_tokens=10,
                                                   messages=[{"role": "user", "content": "Hi"}])  # fmt: skip
    # The reservation came back but for the 15 tokens relayed (60 bytes of text), not kept whole.
    assert int(raw.headers["anthropic-ratelimit-output-tokens-remaining"]) >= 1000 - 15 - 10


def test_an_upstream_failure_carries_the_limits_headers_too(upstream, gateway_from):
    gateway = gateway_from(_config(upstream, {"requests_per_minute": 10}))
    upstream.queue(Reply(status=500, body={"error": {"message": "boom", "type": "server_error"}}))
    with pytest.raises(anthropic.APIStatusError) as caught:
        _ask(_client(gateway))
    assert caught.value.status_code >= 500
    assert caught.value.response.headers["anthropic-ratelimit-requests-remaining"] == "9"


@pytest.mark.parametrize("store", ["in-process", "redis"])
def test_a_request_that_never_reached_an_upstream_gives_its_request_back(upstream, gateway_from, dead_port, store,
                                                                         request):  # fmt: skip
    limits: dict[str, Any] = {"requests_per_minute": 2, "output_tokens_per_minute": 300}
    if store == "redis":
        limits |= {
            "redis_url": request.getfixturevalue("redis_url"),
            "redis_prefix": request.getfixturevalue("redis_prefix"),
        }
    gateway = gateway_from({"server": KEYS, "limits": limits, "upstreams": {
        "default": {"url": upstream.url, "max_retries": 0},
        "down": {"url": f"http://127.0.0.1:{dead_port}/v1", "max_retries": 0}},
        "models": [{"name": "down-model", "upstream": "down"}]})  # fmt: skip
    client = _client(gateway)
    for stream in (False, True, False, True):  # more than the limit: each unreachable, none counted
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(model="down-model", max_tokens=100, stream=stream,
                                   messages=[{"role": "user", "content": "Hi"}])  # fmt: skip
        assert caught.value.status_code == 502 and "unreachable" in caught.value.message
    raw = _ask(client, max_tokens=100)
    assert raw.headers["anthropic-ratelimit-requests-remaining"] == "1"  # the 502s gave theirs back
    assert int(raw.headers["anthropic-ratelimit-output-tokens-remaining"]) >= 200 - 10  # their reservations too
    _ask(client)
    with pytest.raises(anthropic.RateLimitError):  # the limit itself holds
        _ask(client)
