"""[[routes]] through the official SDK: each condition sends the request to its model (which
fake got it, under which name, says so), the client's model name comes back whatever the
route, and the route is named in x-dragoman-route and the metrics."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_anthropic import FakeAnthropic, NativeReply, message, text_events
from tests.support.fakes import completion, text_stream
from tests.support.model_fleet import USER, fleet_config, sdk, served
from tests.support.servers import GatewayServer

FIXTURES = Path(__file__).parent.parent / "fixtures" / "claude_code"
PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")).decode()
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}


@pytest.fixture
def routed(fakes, gateway_from) -> Callable[..., GatewayServer]:
    def start(*routes: dict[str, Any], **options: Any) -> GatewayServer:
        return gateway_from(fleet_config(*fakes, routes=list(routes), **options))

    return start


def ask(server: GatewayServer, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    """A raw POST (for headers the SDK would not send), read by the SDK's own types in the asserts."""
    payload = {"model": "main", "max_tokens": 50, "messages": USER, **body}
    return httpx.post(server.url + "/v1/messages", json=payload, headers=headers or {}, timeout=30)


def test_a_model_glob_matches_the_name_asked_for_before_aliasing_and_the_name_comes_back(routed, fakes):
    a, b = fakes
    server = routed({"name": "side", "when": {"model": "claude-haiku-*"}, "model": "small"})
    client = sdk(server)
    raw = client.messages.with_raw_response.create(model="claude-haiku-4-5", max_tokens=20, messages=USER)
    message = raw.parse()
    assert served(b) == ["small-b"] and served(a) == []
    assert message.model == "claude-haiku-4-5"  # the client's name, not the model that served it
    assert raw.headers["x-dragoman-route"] == "side"
    b.stream_reply(text_stream("Hi", " there"))
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=20, messages=USER) as stream:
        events = list(stream)
    assert events[0].type == "message_start" and events[0].message.model == "claude-haiku-4-5"
    assert stream.response.headers["x-dragoman-route"] == "side"
    # Another claude-* name goes through the alias to `main`, with no route header.
    other = client.messages.with_raw_response.create(model="claude-opus-5-5", max_tokens=20, messages=USER)
    assert served(a) == ["main-a"] and "x-dragoman-route" not in other.headers
    assert other.parse().model == "claude-opus-5-5"
    metrics = httpx.get(server.url + "/metrics").text
    assert 'dragoman_route_requests_total{model="small-b",route="side"} 2.0' in metrics


def test_headers_by_glob_and_by_presence(routed, fakes):
    a, b = fakes
    server = routed(
        {"name": "red", "when": {"header": {"x-team": "red-*"}}, "model": "small"},
        {"name": "tagged", "when": {"header.x-tag": True}, "model": "backup"},
    )
    assert ask(server, {"x-team": "red-1"}).headers["x-dragoman-route"] == "red"
    assert ask(server, {"x-team": "blue"}).headers.get("x-dragoman-route") is None
    assert ask(server, {"x-tag": ""}).headers["x-dragoman-route"] == "tagged"
    assert served(b) == ["small-b", "backup-b"] and served(a) == ["main-a"]


def test_subagents_by_header_and_by_the_billing_blocks_flag_read_before_it_is_dropped(routed, fakes):
    a, b = fakes
    server = routed({"name": "sub", "when": {"subagent": True}, "model": "small"})
    billing = "x-anthropic-billing-header: cc_version=2.1.332.a7e; cc_entrypoint=sdk-cli; cc_is_subagent=true;"
    system = [{"type": "text", "text": billing}, {"type": "text", "text": "You are a helper."}]
    assert ask(server, system=system).headers["x-dragoman-route"] == "sub"
    assert ask(server, {"x-claude-code-agent-id": "agent-1"}).headers["x-dragoman-route"] == "sub"
    plain = [{"type": "text", "text": billing.replace(" cc_is_subagent=true;", "")}]
    assert "x-dragoman-route" not in ask(server, system=plain).headers
    assert served(b) == ["small-b", "small-b"] and served(a) == ["main-a"]
    # The flag was read, and the block still dropped before the upstream (keep_billing_header = false).
    assert "billing" not in json.dumps(b.requests[0]["messages"])


def test_input_tokens_use_the_count_that_count_tokens_gives(routed, fakes):
    a, b = fakes
    counted = sdk(routed()).messages.count_tokens(model="main", messages=USER).input_tokens
    server = routed({"name": "long", "when": {"input_tokens": {"gt": counted - 1}}, "model": "long"})
    assert ask(server).headers["x-dragoman-route"] == "long"
    exact = routed({"name": "long", "when": {"input_tokens": {"gt": counted}}, "model": "long"})
    assert "x-dragoman-route" not in ask(exact).headers
    assert served(b) == ["long-b"] and served(a) == ["main-a"]


THOUGHT = {"type": "thinking", "thinking": "They greet me twice: greet them back, warmly", "signature": "sig"}
COUNTED_PARTS = {  # a conversation with the part, the same without it, the model's settings, the request's options
    "image": (
        [{"role": "user", "content": [IMAGE, {"type": "text", "text": "Hello there"}]}],
        [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
        {},
        {},
    ),
    "thinking": (
        [*USER, {"role": "assistant", "content": [THOUGHT, {"type": "text", "text": "Hi"}]}, *USER],
        [*USER, {"role": "assistant", "content": [{"type": "text", "text": "Hi"}]}, *USER],
        {"reasoning": True, "reasoning_replay": True},  # the thinking goes back to the model, and is counted
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
    ),
}


@pytest.mark.parametrize("part", COUNTED_PARTS)
def test_input_tokens_count_images_and_thinking_as_count_tokens_does(part, routed, fakes):
    """The threshold lies between the prompt's count without the part and with it: the route's
    count is the one count_tokens gives for the same body, the image (the replayed thinking) in it."""
    a, b = fakes
    messages, without, model, options = COUNTED_PARTS[part]
    client = sdk(routed(main=model))
    counted = client.messages.count_tokens(model="main", messages=messages, **options).input_tokens
    bare = client.messages.count_tokens(model="main", messages=without, **options).input_tokens
    assert counted > bare
    server = routed({"name": "long", "when": {"input_tokens": {"gt": counted - 1}}, "model": "long"}, main=model)
    assert ask(server, messages=messages, max_tokens=2048, **options).headers["x-dragoman-route"] == "long"
    assert "x-dragoman-route" not in ask(server, messages=without, max_tokens=2048, **options).headers
    exact = routed({"name": "long", "when": {"input_tokens": {"gt": counted}}, "model": "long"}, main=model)
    assert "x-dragoman-route" not in ask(exact, messages=messages, max_tokens=2048, **options).headers
    assert served(b) == ["long-b"] and served(a) == ["main-a", "main-a"]


def test_fits_compares_input_and_max_tokens_with_the_window_it_would_otherwise_get(routed, fakes):
    a, b = fakes
    server = routed({"name": "roomy", "when": {"fits": False}, "model": "long"})
    assert "x-dragoman-route" not in ask(server, max_tokens=1000).headers
    assert ask(server, max_tokens=99_999).headers["x-dragoman-route"] == "roomy"
    assert served(b) == ["long-b"]


def test_images_anywhere_a_tool_result_included(routed, fakes):
    a, b = fakes
    server = routed({"name": "vision", "when": {"images": True}, "model": "vl"})
    direct = [{"role": "user", "content": [IMAGE, {"type": "text", "text": "what is it"}]}]
    in_result = [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [IMAGE]}]},
    ]
    text_saying_image = [{"role": "user", "content": 'a block {"type": "image"} in words'}]
    tools = [{"name": "shot", "input_schema": {"type": "object"}}]
    assert ask(server, messages=direct).headers["x-dragoman-route"] == "vision"
    assert ask(server, messages=in_result, tools=tools).headers["x-dragoman-route"] == "vision"
    assert "x-dragoman-route" not in ask(server, messages=text_saying_image).headers
    assert served(b) == ["vl-b", "vl-b"]


def test_server_tools_tools_counted_and_output_format(routed, fakes):
    a, b = fakes
    server = routed(
        {"name": "search", "when": {"server_tool": "web_search_*"}, "model": "main"},
        {"name": "title", "when": {"tools": 0, "output_format": "json_schema"}, "model": "small"},
        {"name": "many", "when": {"tools": {"ge": 2}}, "model": "long"},
        main={"server_tools": "drop"},
    )
    tool = {"name": "read", "input_schema": {"type": "object"}}
    search = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]
    schema = {"type": "json_schema", "schema": {"type": "object", "properties": {"title": {"type": "string"}}}}
    assert ask(server, tools=search).headers["x-dragoman-route"] == "search"
    assert ask(server, tools=[], output_config={"format": schema}).headers["x-dragoman-route"] == "title"
    assert "x-dragoman-route" not in ask(server, tools=[tool], output_config={"format": schema}).headers
    assert ask(server, tools=[tool, {**tool, "name": "write"}]).headers["x-dragoman-route"] == "many"


def test_thinking_keys_on_effort_or_budget_never_on_presence(routed, fakes):
    a, b = fakes
    server = routed(
        {"name": "deep", "when": {"thinking": {"effort": ["high", "max"]}}, "model": "long"},
        {"name": "budget", "when": {"thinking": {"budget": {"ge": 16000}}}, "model": "backup"},
    )
    adaptive = {"type": "adaptive"}
    assert "x-dragoman-route" not in ask(server, thinking=adaptive).headers
    assert (
        "x-dragoman-route" not in ask(server, thinking={"type": "disabled"}, output_config={"effort": "high"}).headers
    )
    assert ask(server, thinking=adaptive, output_config={"effort": "high"}).headers["x-dragoman-route"] == "deep"
    big = {"type": "enabled", "budget_tokens": 20000}
    assert ask(server, max_tokens=30000, thinking=big).headers["x-dragoman-route"] == "deep"  # 20000 is high effort
    assert served(b) == ["long-b", "long-b"]


def test_max_tokens_stream_and_body_paths(routed, fakes):
    a, b = fakes
    server = routed(
        {"name": "tiny", "when": {"max_tokens": {"le": 5}, "stream": False}, "model": "small"},
        {"name": "tagged", "when": {"body": {"metadata": {"user_id": {"glob": "ci-*"}}}}, "model": "backup"},
        {"name": "hot", "when": {"body.temperature": {"gt": 0.9}}, "model": "long"},
    )
    assert ask(server, max_tokens=5).headers["x-dragoman-route"] == "tiny"
    a.stream_reply(text_stream("Hi"))
    streamed = ask(server, max_tokens=5, stream=True)
    assert "x-dragoman-route" not in streamed.headers and "message_stop" in streamed.text
    assert ask(server, metadata={"user_id": "ci-7"}).headers["x-dragoman-route"] == "tagged"
    assert ask(server, temperature=1.0).headers["x-dragoman-route"] == "hot"
    assert "x-dragoman-route" not in ask(server, temperature=0.5).headers


def test_any_is_or_and_the_first_route_that_matches_decides(routed, fakes):
    a, b = fakes
    counted = sdk(routed()).messages.count_tokens(model="main", messages=USER).input_tokens
    server = routed(
        {"name": "long", "when": {"input_tokens": {"ge": counted}}, "model": "long"},
        {"name": "vision", "when": {"images": True}, "model": "vl"},
        {"name": "either", "when": {"any": [{"tools": 3}, {"max_tokens": 7}]}, "model": "small"},
    )
    # A long prompt with images: `long` is listed first, and a long prompt's route decides.
    with_image = [{"role": "user", "content": [IMAGE, {"type": "text", "text": "Hello there"}]}]
    assert ask(server, messages=with_image).headers["x-dragoman-route"] == "long"
    short = routed(
        {"name": "vision", "when": {"images": True}, "model": "vl"},
        {"name": "long", "when": {"input_tokens": {"ge": counted}}, "model": "long"},
        {"name": "either", "when": {"any": [{"max_tokens": 7}, {"max_tokens": 8}]}, "model": "small"},
    )
    assert ask(short, messages=with_image).headers["x-dragoman-route"] == "vision"
    # A subagent's long prompt: the same order decides.
    assert ask(short, {"x-claude-code-agent-id": "x"}).headers["x-dragoman-route"] == "long"
    assert (
        ask(server, max_tokens=7, messages=[{"role": "user", "content": "x"}]).headers["x-dragoman-route"] == "either"
    )


def test_a_sticky_route_holds_its_session_and_thresholds_only_move_up(routed, fakes):
    a, b = fakes
    client = sdk(routed())
    short = [{"role": "user", "content": "hi"}]
    small = client.messages.count_tokens(model="main", messages=short).input_tokens
    large = client.messages.count_tokens(model="main", messages=USER).input_tokens
    server = routed(
        {"name": "long", "when": {"input_tokens": {"gt": small}}, "model": "long", "sticky": "session"},
        {"name": "huge", "when": {"input_tokens": {"gt": 1_000}}, "model": "long", "sticky": "session"},
    )
    one = {"x-claude-code-session-id": "s-1"}
    assert ask(server, one, messages=short).headers.get("x-dragoman-route") is None
    assert ask(server, one).headers["x-dragoman-route"] == "long"  # larger than `small`
    assert ask(server, one, messages=short).headers["x-dragoman-route"] == "long"  # held, though short again
    assert ask(server, {"x-claude-code-session-id": "s-2"}, messages=short).headers.get("x-dragoman-route") is None
    # The session id also comes from metadata.user_id (Claude Code's JSON string).
    user = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-1"})
    assert ask(server, messages=short, metadata={"user_id": user}).headers["x-dragoman-route"] == "long"
    # A reply that reports a prompt above `huge`'s threshold moves the session up, for good.
    b.json_reply(completion("ok", prompt=5_000))
    assert ask(server, one).headers["x-dragoman-route"] == "long"
    assert ask(server, one, messages=short).headers["x-dragoman-route"] == "huge"
    assert ask(server, one, messages=short).headers["x-dragoman-route"] == "huge"  # never back down to `long`
    assert large > small


def test_the_session_s_last_reply_counts_cache_reads_for_the_threshold(routed, fakes):
    a, b = fakes
    server = routed({"name": "long", "when": {"input_tokens": {"gt": 10_000}}, "model": "long", "sticky": "session"})
    one = {"x-claude-code-session-id": "cached"}
    a.json_reply(completion("ok", prompt=12_000, cached=11_000))  # 1,000 uncached + 11,000 read from the cache
    assert "x-dragoman-route" not in ask(server, one).headers
    assert ask(server, one).headers["x-dragoman-route"] == "long"


@pytest.mark.parametrize("cache", ["cache_read_input_tokens", "cache_creation_input_tokens"])
def test_a_passed_through_reply_s_cache_reads_and_writes_count_for_the_session_s_threshold(
    cache, fakes, gateway_from, native
):
    """Anthropic's input_tokens leaves out what was read from or written to the prompt cache:
    only with them does the session's last prompt (500 + 10,000) pass the 10,000 threshold."""
    route = {"name": "long", "when": {"input_tokens": {"gt": 10_000}}, "model": "long", "sticky": "session"}
    server = gateway_from(fleet_config(*fakes, routes=[route], native=native))
    # The route's count of the first request (small), then its reply's usage (large with the cache).
    native.replies.append(NativeReply(body={"input_tokens": 9}))
    native.replies.append(NativeReply(body=message(input_tokens=500, **{cache: 10_000})))
    native.responder = lambda body: NativeReply(body={"input_tokens": 9})  # any later count: small
    one = {"x-claude-code-session-id": f"native-{cache}"}
    assert "x-dragoman-route" not in ask(server, one, model="native-main").headers
    assert ask(server, one, model="native-main").headers["x-dragoman-route"] == "long"
    assert served(fakes[1]) == ["long-b"] and len(native.requests) == 2


def test_a_count_probe_is_answered_here_with_the_true_count_and_no_upstream_call(routed, fakes):
    a, b = fakes
    # `le 1`: a count_tokens request (no max_tokens, read as 0) meets it too, and must still not take it.
    server = routed({"name": "probe", "when": {"max_tokens": {"le": 1}, "stream": False}, "respond": "count"})
    client = sdk(server)
    counted = client.messages.count_tokens(model="claude-haiku-4-5", messages=USER).input_tokens
    raw = client.messages.with_raw_response.create(model="claude-haiku-4-5", max_tokens=1, messages=USER)
    probe = raw.parse()
    assert probe.usage.input_tokens == counted and probe.usage.output_tokens == 0
    assert probe.model == "claude-haiku-4-5" and probe.stop_reason == "max_tokens"
    assert raw.headers["x-dragoman-route"] == "probe"
    assert a.requests == [] and b.requests == []  # counted by /tokenize, never asked to generate
    # The count_tokens endpoint itself is not answered by the route: the model's backend answers,
    # and says how it counted (the route's answer would carry the same number, but no method).
    own = client.messages.with_raw_response.count_tokens(model="claude-haiku-4-5", messages=USER)
    assert own.parse().input_tokens == counted and own.headers["x-token-count-method"] == "upstream"
    metrics = httpx.get(server.url + "/metrics").text
    assert 'dragoman_route_requests_total{model="claude-haiku-4-5",route="probe"} 1.0' in metrics


def test_claude_codes_main_loop_does_not_take_an_effort_keyed_thinking_route(routed, fakes):
    a, b = fakes
    server = routed(
        {"name": "deep", "when": {"thinking": {"effort": ["high", "max"]}}, "model": "long"},
        {"name": "title", "when": {"tools": 0, "output_format": "json_schema"}, "model": "small"},
    )
    for name in ("main_loop_turn1", "main_loop_turn2", "bare_turn2"):
        body = json.loads((FIXTURES / f"{name}.json").read_text())
        a.stream_reply(text_stream("ok"))
        reply = httpx.post(server.url + "/v1/messages", json=body, timeout=30)
        assert reply.status_code == 200 and "x-dragoman-route" not in reply.headers, name
    title = json.loads((FIXTURES / "session_title.json").read_text())
    b.stream_reply(text_stream('{"title": "A title"}'))
    assert httpx.post(server.url + "/v1/messages", json=title, timeout=30).headers["x-dragoman-route"] == "title"
    assert served(a) == ["main-a"] * 3 and served(b) == ["small-b"]


def test_an_error_names_the_route_taken_too(routed, fakes):
    """The upstream of the route's model refuses the request: its error still says which route sent it there."""
    a, b = fakes
    server = routed({"name": "side", "when": {"model": "claude-haiku-*"}, "model": "small"})
    b.json_reply({"object": "error", "message": "bad request", "type": "BadRequestError", "code": 400}, status=400)
    response = ask(server, model="claude-haiku-4-5")
    assert response.status_code == 400 and response.json()["type"] == "error"
    assert response.headers["x-dragoman-route"] == "side"
    assert served(b) == ["small-b"] and served(a) == []


def test_a_route_to_a_passthrough_model_answers_under_the_name_asked_for(fakes, gateway_from):
    """Passed through, the body read by the core's one read (a routed envelope): a `body.` path
    decides, and the reply, streamed or not, carries the client's name, not the upstream's."""
    native = FakeAnthropic().start()
    try:
        route = {"name": "ci", "when": {"body.metadata.user_id": {"glob": "ci-*"}}, "model": "native-main"}
        client = sdk(gateway_from(fleet_config(*fakes, routes=[route], native=native)))
        ci = {"user_id": "ci-7"}
        raw = client.messages.with_raw_response.create(model="main", max_tokens=20, messages=USER, metadata=ci)
        assert raw.headers["x-dragoman-route"] == "ci" and raw.parse().model == "main"
        native.replies.append(NativeReply(events=text_events("streamed")))
        with client.messages.stream(model="main", max_tokens=20, messages=USER, metadata=ci) as stream:
            assert "".join(stream.text_stream) == "streamed" and stream.get_final_message().model == "main"
        assert client.messages.create(model="main", max_tokens=20, messages=USER).model == "main"
        assert served(fakes[0]) == ["main-a"] and len(native.requests) == 2  # the last one took no route
    finally:
        native.stop()


def test_a_passed_through_count_behind_an_input_tokens_route_asks_the_upstream_once(fakes, gateway_from):
    """The route's count is the count_tokens answer itself: the upstream is asked once for it,
    by the route (its count for a Messages request, without max_tokens), not again by the endpoint."""
    native = FakeAnthropic().start()
    try:
        route = {"name": "long", "when": {"input_tokens": {"gt": 500_000}}, "model": "long"}
        client = sdk(gateway_from(fleet_config(*fakes, routes=[route], native=native)))
        native.replies.append(NativeReply(body={"input_tokens": 42}))
        assert client.messages.count_tokens(model="native-main", messages=USER).input_tokens == 42
        assert [path for path, _, _ in native.requests] == ["/v1/messages/count_tokens"]
        native.replies.append(NativeReply(body={"input_tokens": 43}))
        assert client.messages.create(model="native-main", max_tokens=20, messages=USER).model == "native-main"
        paths = [path for path, _, _ in native.requests]
        assert paths == ["/v1/messages/count_tokens", "/v1/messages/count_tokens", "/v1/messages"]
        assert "max_tokens" not in native.requests[1][1]  # the route's count of a Messages request
        assert served(fakes[1]) == []
    finally:
        native.stop()
