"""Fallbacks between models through the official SDK: each trigger moves the request to the
next model before anything reached the client, each non-trigger does not, a stream that
failed after its first content ends with an `error` event (never another model's
continuation), and a model that keeps failing is passed over for a while. Both paths."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.fake_anthropic import FakeAnthropic, NativeReply, event, text_events
from tests.support.fakes import Reply, chunk, completion, text_stream
from tests.support.model_fleet import USER, fleet_config, sdk, served, upstream_error
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually

MAIN = {"fallbacks": ["backup"], "context_fallbacks": ["long"]}
VLLM_TOO_LONG = {"object": "error", "message": "This model's maximum context length is 100000 tokens. However, your "
                 "messages resulted in 120000 tokens. Please reduce the length of the messages.",
                 "type": "BadRequestError", "param": None, "code": 400}  # fmt: skip


@pytest.fixture
def start(fakes, gateway_from) -> Callable[..., GatewayServer]:
    def started(*, main: dict[str, Any] | None = None, **options: Any) -> GatewayServer:
        return gateway_from(fleet_config(*fakes, main={**MAIN, **(main or {})}, **options))

    return started


@pytest.mark.parametrize("status", [500, 502, 503, 529, 429])
def test_a_failing_status_moves_the_request_to_the_next_model(start, fakes, status, caplog):
    a, b = fakes
    a.queue(upstream_error(status))
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        message = sdk(start()).messages.create(model="main", max_tokens=20, messages=USER)
    assert served(a) == ["main-a"] and served(b) == ["backup-b"]
    assert message.model == "main" and message.content[0].text == "Hello!"  # the client's name, the backup's answer
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"]
    assert logged[-1]["served_model"] == "backup-b" and logged[-1]["upstream"] == "b"


def test_a_refused_connection_moves_the_request_on(fakes, gateway_from, dead_port):
    a, b = fakes
    config = fleet_config(a, b, main=MAIN)
    config["upstreams"]["a"]["url"] = f"http://127.0.0.1:{dead_port}/v1"
    assert sdk(gateway_from(config)).messages.create(model="main", max_tokens=20, messages=USER).model == "main"
    assert served(b) == ["backup-b"]


def test_a_first_byte_timeout_moves_the_request_on(fakes, gateway_from):
    a, b = fakes
    config = fleet_config(a, b, main=MAIN)
    config["upstreams"]["a"].update(first_byte_timeout=0.2, retry_budget=0.1)  # a fallback waits for no budget
    held = Reply(body=completion("late"), hold=threading.Event())
    a.queue(held)
    try:
        message = sdk(gateway_from(config)).messages.create(model="main", max_tokens=20, messages=USER)
    finally:
        held.hold.set()  # type: ignore[union-attr]
    assert message.content[0].text == "Hello!" and served(b) == ["backup-b"]


@pytest.mark.parametrize("status", [400, 422])
def test_the_requests_own_fault_is_not_sent_elsewhere(start, fakes, status):
    a, b = fakes
    a.queue(upstream_error(status, "bad field"))
    with pytest.raises(anthropic.BadRequestError):
        sdk(start()).messages.create(model="main", max_tokens=20, messages=USER)
    assert served(b) == []


def test_prompt_too_long_goes_to_a_context_fallback_only(start, fakes):
    a, b = fakes
    a.queue(Reply(status=400, body=VLLM_TOO_LONG))
    message = sdk(start()).messages.create(model="main", max_tokens=20, messages=USER)
    assert served(b) == ["long-b"] and message.model == "main"  # not `backup`, a fallback for other failures


@pytest.mark.parametrize(("context", "served_by"), [(["small", "vl", "long"], ["long-b"]), (["small", "vl"], [])])
def test_a_context_fallback_must_have_a_larger_window(start, fakes, context, served_by):
    a, b = fakes
    a.queue(Reply(status=400, body=VLLM_TOO_LONG))
    client = sdk(start(main={"context_fallbacks": context}))
    if served_by:
        client.messages.create(model="main", max_tokens=20, messages=USER)
    else:
        with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
            client.messages.create(model="main", max_tokens=20, messages=USER)
    assert served(b) == served_by  # `small` (8,000) and `vl` (100,000, as `main`) hold no more than `main`


def test_an_upstream_refusing_the_key_moves_on_and_cools_the_model_down(start, fakes):
    a, b = fakes
    a.queue(Reply(status=401, body={"error": {"message": "invalid api key", "type": "auth"}}))
    client = sdk(start())
    client.messages.create(model="main", max_tokens=20, messages=USER)
    client.messages.create(model="main", max_tokens=20, messages=USER)
    assert served(a) == ["main-a"] and served(b) == ["backup-b", "backup-b"]  # the second passed `main` over


def test_a_model_failing_n_times_in_the_window_is_passed_over(start, fakes):
    a, b = fakes
    a.queue(upstream_error(500), upstream_error(500))
    client = sdk(start(fallbacks={"cooldown_failures": 2, "cooldown_window": 600, "cooldown": 600}))
    for _ in range(3):
        assert client.messages.create(model="main", max_tokens=20, messages=USER).content[0].text == "Hello!"
    assert served(a) == ["main-a", "main-a"] and served(b) == ["backup-b"] * 3


def test_attempts_are_capped(start, fakes):
    a, b = fakes
    a.queue(upstream_error(500))
    with pytest.raises(anthropic.InternalServerError):
        sdk(start(fallbacks={"max_attempts": 1})).messages.create(model="main", max_tokens=20, messages=USER)
    assert served(b) == []


@pytest.mark.parametrize(("budget", "answered"), [(0.3, False), (5.0, True)])
def test_a_fallbacks_retries_wait_only_within_the_requests_one_budget(fakes, gateway_from, budget, answered):
    a, b = fakes
    config = fleet_config(a, b, main=MAIN)
    config["upstreams"]["a"]["retry_budget"] = budget  # the request's, from its first model's upstream
    config["upstreams"]["b"].update(max_retries=2, retry_budget=60)  # its own would wait
    a.queue(upstream_error(503))
    b.queue(upstream_error(503, retry_after="1"))
    client = sdk(gateway_from(config))
    if answered:
        assert client.messages.create(model="main", max_tokens=20, messages=USER).content[0].text == "Hello!"
    else:
        with pytest.raises(anthropic.InternalServerError):
            client.messages.create(model="main", max_tokens=20, messages=USER)
    assert served(b) == ["backup-b"] * (2 if answered else 1)  # waited a second only when the budget had one


@pytest.mark.parametrize(("budget", "answered"), [(0.3, False), (5.0, True)])
def test_a_passed_through_fallbacks_retries_share_that_budget_too(fakes, gateway_from, native, budget, answered):
    a, b = fakes
    config = fleet_config(a, b, native=native, main={"fallbacks": ["native-main"]})
    config["upstreams"]["a"]["retry_budget"] = budget
    config["upstreams"]["native"].update(max_retries=2, retry_budget=60)
    a.queue(upstream_error(503))
    native.replies.append(NativeReply(status=503, body=overloaded().body, headers={"retry-after": "1"}))
    client = sdk(gateway_from(config))
    if answered:
        assert client.messages.create(model="main", max_tokens=20, messages=USER).model == "main"
    else:
        with pytest.raises(anthropic.APIStatusError):
            client.messages.create(model="main", max_tokens=20, messages=USER)
    assert len([r for r in native.requests if r[0] == "/v1/messages"]) == (2 if answered else 1)


def test_a_target_lacking_vision_is_skipped(fakes, gateway_from):
    a, b = fakes
    config = fleet_config(a, b, main={"fallbacks": ["backup", "vl"], "vision": True})
    next(m for m in config["models"] if m["name"] == "backup")["vision"] = False
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    a.queue(upstream_error(500))
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "what"}]}]
    sdk(gateway_from(config)).messages.create(model="main", max_tokens=20, messages=messages)
    assert served(b) == ["vl-b"]


# -- streams --------------------------------------------------------------------------


def test_a_stream_refused_before_it_began_comes_from_the_next_model(start, fakes):
    a, b = fakes
    a.queue(upstream_error(503))
    b.stream_reply(text_stream("from", " backup"))
    with sdk(start()).messages.stream(model="main", max_tokens=20, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "from backup" and final.model == "main" and served(b) == ["backup-b"]


@pytest.mark.parametrize("code", [500, 503])
def test_an_error_inside_a_200_stream_before_content_is_treated_as_its_status(start, fakes, code):
    a, b = fakes
    a.stream_reply([{"error": {"message": "engine died", "type": "InternalServerError", "code": code}}], done=False)
    b.stream_reply(text_stream("saved"))
    with sdk(start()).messages.stream(model="main", max_tokens=20, messages=USER) as stream:
        assert "".join(stream.text_stream) == "saved"
    assert served(b) == ["backup-b"]


def test_after_keep_alives_the_next_models_stream_continues_the_one_message_the_client_has(fakes, gateway_from):
    a, b = fakes
    config = fleet_config(a, b, main=MAIN)
    config["server"] = {"keepalive_interval": 0.05}
    for _ in range(2):
        a.stream_reply(
            [b": starting\n\n", ("sleep", 0.3), {"error": {"message": "engine died", "code": 500}}], done=False
        )
        b.stream_reply(text_stream("saved"))
    server = gateway_from(config)
    raw = httpx.post(server.url + "/v1/messages", json={"model": "main", "max_tokens": 20, "messages": USER,
                                                        "stream": True}, timeout=30).text  # fmt: skip
    assert raw.count("event: message_start") == 1 and raw.index("event: ping") < raw.index("content_block_start")
    with sdk(server).messages.stream(model="main", max_tokens=20, messages=USER) as stream:
        final = stream.get_final_message()  # the same again, read by the SDK
    assert final.content[0].text == "saved" and final.model == "main" and served(b) == ["backup-b"] * 2


def test_an_in_band_4xx_is_the_requests_fault_and_not_sent_elsewhere(start, fakes):
    a, b = fakes
    a.stream_reply([{"error": {"message": "bad grammar", "type": "BadRequestError", "code": 400}}], done=False)
    with pytest.raises(anthropic.BadRequestError):
        with sdk(start()).messages.stream(model="main", max_tokens=20, messages=USER) as stream:
            stream.get_final_message()
    assert served(b) == []


def test_a_stream_that_fails_after_its_first_content_ends_with_an_error_event_not_another_model(start, fakes):
    a, b = fakes
    a.stream_reply([chunk({"role": "assistant", "content": ""}), chunk({"content": "half"})], done=False, drop=True)
    events = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk(start()).messages.stream(model="main", max_tokens=20, messages=USER) as stream:
            for item in stream:
                events.append(item.type)
    assert "content_block_delta" in events and caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert served(b) == []  # no continuation from another model


# -- the passthrough path ---------------------------------------------------------------


@pytest.fixture
def with_native(fakes, gateway_from) -> Iterator[tuple[FakeAnthropic, GatewayServer]]:
    native = FakeAnthropic().start()
    yield native, gateway_from(fleet_config(*fakes, native=native))
    native.stop()


def overloaded(status: int = 529) -> NativeReply:
    return NativeReply(status=status, body={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})


def test_passthrough_an_overloaded_answer_falls_back(with_native, fakes):
    native, server = with_native
    native.replies.append(overloaded())
    message = sdk(server).messages.create(model="native-main", max_tokens=20, messages=USER)
    assert message.model == "native-main" and served(fakes[1]) == ["backup-b"]


def test_passthrough_a_stream_opening_with_an_error_event_falls_back(with_native, fakes):
    native, server = with_native
    failure = event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    native.replies.append(NativeReply(events=[failure]))
    fakes[1].stream_reply(text_stream("other"))
    with sdk(server).messages.stream(model="native-main", max_tokens=20, messages=USER) as stream:
        assert "".join(stream.text_stream) == "other"
        assert stream.get_final_message().model == "native-main"
    assert served(fakes[1]) == ["backup-b"]


def test_passthrough_invalid_request_is_not_sent_elsewhere(with_native, fakes):
    native, server = with_native
    bad = {"type": "error", "error": {"type": "invalid_request_error", "message": "messages: required"}}
    native.replies.append(NativeReply(status=400, body=bad))
    with pytest.raises(anthropic.BadRequestError):
        sdk(server).messages.create(model="native-main", max_tokens=20, messages=USER)
    assert served(fakes[1]) == []


def test_passthrough_a_stream_cut_after_content_does_not_fall_back(with_native, fakes):
    native, server = with_native
    native.replies.append(NativeReply(events=[*text_events("part")[:3], "drop"]))
    with pytest.raises(anthropic.APIStatusError):
        with sdk(server).messages.stream(model="native-main", max_tokens=20, messages=USER) as stream:
            list(stream)
    assert served(fakes[1]) == []


def test_thinking_signed_elsewhere_is_taken_out_before_an_upstream_that_checks_signatures(fakes, gateway_from):
    a, b = fakes
    native = FakeAnthropic().start()
    try:
        config = fleet_config(a, b, native=native, main={"fallbacks": ["native-main"]})
        next(m for m in config["models"] if m["name"] == "native-main")["checks_signatures"] = True
        a.queue(upstream_error(500))
        history = [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "from-a"},
                                              {"type": "text", "text": "Hi"}]},
            {"role": "user", "content": "Again"},
        ]  # fmt: skip
        message = sdk(gateway_from(config)).messages.create(model="main", max_tokens=20, messages=history)
        assert message.model == "main"
        sent = native.requests[0][1]["messages"]
        assert sent[1]["content"] == [{"type": "text", "text": "Hi"}]  # the thinking block signed by `a` is out
        assert served(a) == ["main-a"]
    finally:
        native.stop()


def test_an_upstream_that_does_not_check_signatures_keeps_the_thinking(fakes, gateway_from, caplog):
    a, b = fakes
    native = FakeAnthropic().start()
    try:
        config = fleet_config(a, b, native=native, main={"fallbacks": ["native-main"]})
        a.queue(upstream_error(500))
        thinking = {"type": "thinking", "thinking": "hmm", "signature": "from-a"}
        history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": [thinking]},
                   {"role": "user", "content": "Again"}]  # fmt: skip
        with caplog.at_level(logging.INFO, logger="dragoman.access"):
            sdk(gateway_from(config)).messages.create(model="main", max_tokens=20, messages=history)
        assert native.requests[0][1]["messages"][1]["content"] == [thinking]
        logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"][-1]
        assert (logged["upstream"], logged["path"]) == ("native", "passthrough")  # the path that served
    finally:
        native.stop()


def test_a_long_stream_behind_the_gate_reaches_the_client_whole(start, fakes):
    a, b = fakes
    pieces = [f"w{i} " for i in range(400)]
    a.queue(upstream_error(500))
    b.stream_reply(text_stream(*pieces))
    with sdk(start()).messages.stream(model="main", max_tokens=2000, messages=USER) as stream:
        assert "".join(stream.text_stream) == "".join(pieces)
        assert stream.get_final_message().usage.output_tokens == 400


def test_a_fallback_to_another_upstream_takes_one_of_its_slots(fakes, gateway_from):
    """The backup's upstream has one slot and no queue. While another request holds it, a
    fallback there is turned away (529), not sent past the operator's max_concurrent; once it
    is free, the fallback is served, and a stream holds the slot to its end."""
    a, b = fakes
    config = fleet_config(a, b, main=MAIN)
    config["upstreams"]["b"].update(max_concurrent=1, max_queue=0)
    client = sdk(gateway_from(config))
    release = threading.Event()
    b.queue(Reply(body=completion("busy"), hold=release))
    busy = threading.Thread(target=lambda: client.messages.create(model="small", max_tokens=5, messages=USER))
    busy.start()
    try:
        eventually(lambda: b.requests, "the only slot of b is taken")
        a.queue(upstream_error(503))
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(model="main", max_tokens=20, messages=USER)
        assert caught.value.status_code in (503, 529) and served(b) == ["small-b"]  # the fallback never reached b
    finally:
        release.set()
        busy.join(10)
    a.queue(upstream_error(503))
    assert client.messages.create(model="main", max_tokens=20, messages=USER).content[0].text == "Hello!"
    assert served(b) == ["small-b", "backup-b"]
    # The slot came back when that request ended: a request of b's own is served.
    assert client.messages.create(model="small", max_tokens=5, messages=USER).content[0].text == "Hello!"


def test_a_cool_down_holds_in_every_gateway_sharing_redis(fakes, gateway_from, redis_url, redis_prefix):
    """Two gateways with one limits store: the first finds `main` refused (401) and cools it
    down; the second, which never saw the failure, passes `main` over too."""
    a, b = fakes
    config = fleet_config(a, b, main=MAIN)
    config["limits"] = {"redis_url": redis_url, "redis_prefix": redis_prefix}
    one, two = sdk(gateway_from(config)), sdk(gateway_from(config))
    two.messages.create(model="main", max_tokens=20, messages=USER)  # served by main; its poll has started
    a.queue(Reply(status=401, body={"error": {"message": "invalid api key", "type": "auth"}}))
    one.messages.create(model="main", max_tokens=20, messages=USER)
    assert served(a) == ["main-a", "main-a"] and served(b) == ["backup-b"]

    def passed_over() -> bool:  # the cool-downs are polled every second: until then, main serves
        two.messages.create(model="main", max_tokens=20, messages=USER)
        return served(b)[-1:] == ["backup-b"] and len(served(b)) == 2

    eventually(passed_over, "the second gateway passes main over", timeout=10, every=0.2)
