"""Fallbacks, the parts of docs/routing.md (Fallbacks) test_fallbacks.py leaves out: targets
cooled down are passed over; a model's own retries and replicas are spent before its
fallbacks (a 429 included); and the triggers of the passthrough path (a refused connection,
a first-byte timeout, a refused key, a prompt too long), each streamed and not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from tests.support.fake_anthropic import NativeReply, message, text_events
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream
from tests.support.model_fleet import USER, fleet_config, model_in, sdk, served, upstream_error
from tests.support.servers import GatewayServer

MAIN = {"fallbacks": ["backup", "long"]}
REFUSED_KEY = {"error": {"message": "invalid api key", "type": "auth"}}
NATIVE_REFUSED_KEY = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
NATIVE_TOO_LONG = {"type": "error", "error": {"type": "invalid_request_error",
                                              "message": "prompt is too long: 120000 tokens > 100000 maximum"}}  # fmt: skip


def ask(client: anthropic.Anthropic, model: str, *, stream: bool = False) -> tuple[str, str]:
    """The text and model name the client got for one request, streamed or not."""
    if not stream:
        reply = client.messages.create(model=model, max_tokens=20, messages=USER)
        return reply.content[0].text, reply.model  # type: ignore[union-attr]
    with client.messages.stream(model=model, max_tokens=20, messages=USER) as events:
        text = "".join(events.text_stream)
        return text, events.get_final_message().model


def answers(fake: FakeUpstream, text: str, *, stream: bool) -> None:
    """`fake`'s next answer: `text`, as a stream or a whole reply."""
    if stream:
        fake.stream_reply(text_stream(text))
    else:
        fake.json_reply(completion(text))


# -- targets cooled down ------------------------------------------------------------------


def test_a_target_refused_by_its_upstream_is_passed_over_as_a_fallback(fakes, gateway_from):
    """`backup` refused (401) cools down at once: the next request needing a fallback skips it for `long`."""
    a, b = fakes
    a.queue(upstream_error(503), upstream_error(503))
    b.queue(Reply(status=401, body=REFUSED_KEY))  # backup's answer; long's is the default
    client = sdk(gateway_from(fleet_config(a, b, main=MAIN)))
    assert ask(client, "main") == ("Hello!", "main")
    assert ask(client, "main") == ("Hello!", "main")
    assert served(a) == ["main-a", "main-a"]
    assert served(b) == ["backup-b", "long-b", "long-b"]  # the second request never asked `backup`


def test_a_target_failing_n_times_is_passed_over_as_a_fallback(fakes, gateway_from):
    """`main` and `backup` both fail twice (cooldown_failures = 2): the third request skips both for `long`."""
    a, b = fakes
    a.queue(upstream_error(503), upstream_error(503))
    b.queue(upstream_error(500), Reply(body=completion("long")), upstream_error(500))  # backup fails twice
    config = fleet_config(a, b, main=MAIN, fallbacks={"cooldown_failures": 2, "cooldown_window": 600, "cooldown": 600})
    client = sdk(gateway_from(config))
    assert [ask(client, "main")[0] for _ in range(3)] == ["long", "Hello!", "Hello!"]
    assert served(a) == ["main-a", "main-a"]
    assert served(b) == ["backup-b", "long-b", "backup-b", "long-b", "long-b"]  # the third never asked `backup`


# -- this model's retries and replicas first ----------------------------------------------


@pytest.fixture
def replica() -> Iterator[FakeUpstream]:
    """A second instance of upstream `a` (its `replicas`)."""
    fake = FakeUpstream().start()
    yield fake
    fake.stop()


def failing(count: int | None, *instances: FakeUpstream) -> None:
    """The first `count` requests to any of `instances` (every one when None) answer 503, retry at once."""
    left = [count]

    def respond(body: dict) -> Reply | None:
        if left[0] is not None:
            if left[0] <= 0:
                return None
            left[0] -= 1
        return upstream_error(503, retry_after="0")

    for fake in instances:
        fake.responder = respond


def replicated(a: FakeUpstream, b: FakeUpstream, replica: FakeUpstream, max_retries: int) -> dict[str, Any]:
    config = fleet_config(a, b, main=MAIN)
    config["upstreams"]["a"].update(replicas=[replica.url], max_retries=max_retries, retry_budget=5)
    return config


def test_a_failed_replica_is_retried_on_the_other_not_sent_to_a_fallback(fakes, gateway_from, replica):
    a, b = fakes
    failing(1, a, replica)
    assert ask(sdk(gateway_from(replicated(a, b, replica, max_retries=1))), "main") == ("Hello!", "main")
    assert served(a) == ["main-a"] and served(replica) == ["main-a"]  # one failed, the other answered
    assert served(b) == []


def test_the_fallback_serves_once_every_replica_and_retry_failed(fakes, gateway_from, replica):
    a, b = fakes
    failing(None, a, replica)
    assert ask(sdk(gateway_from(replicated(a, b, replica, max_retries=2))), "main") == ("Hello!", "main")
    assert len(served(a)) + len(served(replica)) == 3  # the first try and both retries
    assert served(a) and served(replica) and served(b) == ["backup-b"]


def test_a_429_retried_within_its_budget_is_served_by_the_same_model(fakes, gateway_from):
    a, b = fakes
    config = fleet_config(a, b, main=MAIN)
    config["upstreams"]["a"]["max_retries"] = 2
    a.queue(upstream_error(429, "slow down", retry_after="0"))
    assert ask(sdk(gateway_from(config)), "main") == ("Hello!", "main")
    assert served(a) == ["main-a", "main-a"] and served(b) == []


def test_a_429_past_its_retry_budget_falls_back(fakes, gateway_from):
    a, b = fakes
    config = fleet_config(a, b, main=MAIN)
    config["upstreams"]["a"]["max_retries"] = 2
    a.queue(*[upstream_error(429, "slow down", retry_after="0")] * 3)
    assert ask(sdk(gateway_from(config)), "main") == ("Hello!", "main")
    assert served(a) == ["main-a"] * 3 and served(b) == ["backup-b"]


# -- the passthrough path -----------------------------------------------------------------


@pytest.fixture
def native_fleet(fakes, gateway_from, native) -> Callable[..., GatewayServer]:
    """A gateway with `native-main` on the native fake (fallbacks ["backup"]), changed by
    `upstream` (its upstream's settings) and `model` (its own)."""

    def started(*, upstream: dict[str, Any] | None = None, model: dict[str, Any] | None = None) -> GatewayServer:
        config = fleet_config(*fakes, native=native)
        config["upstreams"]["native"].update(upstream or {})
        model_in(config, "native-main").update(model or {})
        return gateway_from(config)

    return started


STREAMED = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])


@STREAMED
def test_passthrough_a_refused_connection_falls_back(native_fleet, fakes, dead_port, stream):
    server = native_fleet(upstream={"url": f"http://127.0.0.1:{dead_port}/v1"})
    answers(fakes[1], "from backup", stream=stream)
    assert ask(sdk(server), "native-main", stream=stream) == ("from backup", "native-main")
    assert served(fakes[1]) == ["backup-b"]


@STREAMED
def test_passthrough_a_first_byte_timeout_falls_back(native_fleet, native, fakes, stream):
    if stream:  # the head may come, but no byte of the body in time
        native.replies.append(NativeReply(events=[("sleep", 10), *text_events("late")]))
    else:
        native.replies.append(NativeReply(body=message("late"), hang=10))
    answers(fakes[1], "from backup", stream=stream)
    server = native_fleet(upstream={"first_byte_timeout": 0.3})
    assert ask(sdk(server), "native-main", stream=stream) == ("from backup", "native-main")
    assert len(native.requests) == 1 and served(fakes[1]) == ["backup-b"]


@STREAMED
def test_passthrough_a_refused_key_falls_back_and_cools_the_model_down(native_fleet, native, fakes, stream):
    native.replies.append(NativeReply(status=401, body=NATIVE_REFUSED_KEY))
    client = sdk(native_fleet())
    for _ in range(2):
        answers(fakes[1], "from backup", stream=stream)
        assert ask(client, "native-main", stream=stream) == ("from backup", "native-main")
    assert len(native.requests) == 1  # the second request went straight to `backup`
    assert served(fakes[1]) == ["backup-b", "backup-b"]


@STREAMED
def test_passthrough_prompt_too_long_goes_to_a_context_fallback_that_fits(native_fleet, native, fakes, stream):
    """Not to `backup` (a fallback, not a context one), nor to `small` (a window no larger)."""
    native.replies.append(NativeReply(status=400, body=NATIVE_TOO_LONG))
    answers(fakes[1], "from long", stream=stream)
    server = native_fleet(model={"context_fallbacks": ["small", "long"]})
    assert ask(sdk(server), "native-main", stream=stream) == ("from long", "native-main")
    assert served(fakes[1]) == ["long-b"]


def test_passthrough_prompt_too_long_without_a_context_fallback_is_the_clients_error(native_fleet, native, fakes):
    native.replies.append(NativeReply(status=400, body=NATIVE_TOO_LONG))
    with pytest.raises(anthropic.BadRequestError) as caught:
        ask(sdk(native_fleet()), "native-main")
    assert "prompt is too long" in str(caught.value) and served(fakes[1]) == []  # `backup` is no context fallback
