"""The passthrough path: an upstream that speaks /v1/messages gets the request unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from tests.support.fake_anthropic import ASK, FakeAnthropic, NativeReply, event, message, text_events
from tests.support.fake_anthropic import passthrough_config as _config
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually


@pytest.fixture
def passthrough(native: FakeAnthropic) -> Iterator[GatewayServer]:
    server = GatewayServer(_config(native, api_keys=["client-key"])).start()
    yield server
    server.stop()


@pytest.fixture
def sdk(passthrough: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=passthrough.url, api_key="client-key", max_retries=0)


def test_body_forwarded_with_only_the_model_renamed(sdk, native):
    reply = sdk.messages.create(
        model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "Hi"}],
        extra_body={"some_future_field": {"x": 1}},
    )  # fmt: skip
    path, body, headers = native.requests[0]
    assert path == "/v1/messages"
    assert body["model"] == "native-model"
    assert body["some_future_field"] == {"x": 1}  # never re-parsed into a closed set of fields
    assert headers["x-api-key"] == "upstream-secret"  # the client's key is replaced
    assert "client-key" not in str(headers)
    assert headers["anthropic-version"]  # the client's version header is forwarded
    assert reply.model == "claude-test"  # renamed back
    assert reply.content[0].text == "Hi"


def test_thinking_the_gateway_would_refuse_is_the_servers_to_judge(sdk, native):
    """The translating path checks `thinking.budget_tokens` as Anthropic does; passthrough
    forwards the request unchanged, and the server decides."""
    thinking = {"type": "enabled", "budget_tokens": 100}  # below 1024 and not below max_tokens
    sdk.messages.create(
        model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "Hi"}], thinking=thinking
    )
    _, body, _ = native.requests[0]
    assert body["thinking"] == thinking and body["max_tokens"] == 10


def test_stream_bytes_forwarded_with_model_renamed(passthrough, native):
    native.replies.append(
        NativeReply(events=text_events("Hello"), headers={"anthropic-ratelimit-requests-remaining": "41"})
    )
    with httpx.stream(
        "POST", passthrough.url + "/v1/messages", headers={"x-api-key": "client-key"},
        json={"model": "claude-test", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
    ) as response:  # fmt: skip
        data = b"".join(response.iter_bytes())
        assert response.headers["anthropic-ratelimit-requests-remaining"] == "41"
    expected = b"".join(text_events("Hello", model="claude-test"))
    assert data == expected


def test_sdk_stream_through_passthrough(sdk, native):
    native.replies.append(NativeReply(events=text_events("Streamed")))
    with sdk.messages.stream(
        model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Streamed"
    assert final.model == "claude-test"


# What llama-server's own /v1/messages sends: no stop_details, container or diagnostics.
_NULLS = ("stop_details", "container", "diagnostics")


def _bare(data: dict) -> dict:
    return {k: (_bare(v) if isinstance(v, dict) else v) for k, v in data.items() if k not in _NULLS}


def _bare_events(text: str) -> list[bytes]:
    return [event(name, _bare(data)) for name, data in (_parse(e) for e in text_events(text))]


def _parse(raw: bytes) -> tuple[str, dict]:
    name, data = raw.decode().strip().split("\n")
    return name.removeprefix("event: "), json.loads(data.removeprefix("data: "))


def test_a_stream_without_the_null_fields_the_sdks_type_gets_them(passthrough, native):
    """The TypeScript SDK's finalMessage().stop_details was undefined (not null, as typed)
    behind a server that leaves the field out."""
    native.replies.append(NativeReply(events=_bare_events("Hello")))
    assert b"stop_details" not in b"".join(native.replies[0].events)
    with httpx.stream(
        "POST", passthrough.url + "/v1/messages", headers={"x-api-key": "client-key"},
        json={"model": "claude-test", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
    ) as response:  # fmt: skip
        events = [_parse(raw + b"\n\n") for raw in b"".join(response.iter_bytes()).split(b"\n\n") if raw]
    start, delta = events[0][1]["message"], events[-2][1]["delta"]
    assert {name: start[name] for name in _NULLS} == dict.fromkeys(_NULLS)
    assert start["model"] == "claude-test"
    assert delta == {"stop_reason": "end_turn", "stop_sequence": None, "stop_details": None, "container": None}
    assert [e for e in events[1:-2]] == [_parse(e) for e in text_events("Hello")[1:-2]]  # content unchanged


def test_a_reply_without_the_null_fields_the_sdks_type_gets_them(sdk, native):
    native.replies.append(NativeReply(body=_bare(message("Hi"))))
    raw = sdk.messages.with_raw_response.create(
        model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
    )
    reply = json.loads(raw.http_response.text)
    assert {name: reply[name] for name in _NULLS} == dict.fromkeys(_NULLS)
    assert reply["model"] == "claude-test" and reply["content"] == [{"type": "text", "text": "Hi"}]
    assert raw.parse().stop_details is None


def test_sdk_stream_of_a_server_that_sent_no_message_start(sdk, native):
    # llama-server's own /v1/messages, when the reply's first token is part of an emoji.
    native.replies.append(NativeReply(events=text_events("\U0001f31f")[1:]))
    with sdk.messages.stream(
        model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "\U0001f31f"
    assert final.model == "claude-test" and final.stop_reason == "end_turn" and final.usage.output_tokens == 3


def test_upstream_errors_pass_through_unchanged(passthrough, native):
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    native.replies.append(NativeReply(status=429, body=body, headers={"retry-after": "7"}))
    response = httpx.post(
        passthrough.url + "/v1/messages", headers={"x-api-key": "client-key"},
        json={"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]},
    )  # fmt: skip
    assert response.status_code == 429
    assert response.json() == body
    assert response.headers["retry-after"] == "7"
    assert response.headers["request-id"].startswith("req_")


@pytest.mark.parametrize(
    ("reply", "status", "kind"),
    [
        (
            NativeReply(
                status=502, body=b"<html><body>502 Bad Gateway</body></html>", headers={"content-type": "text/html"}
            ),
            502,
            "api_error",
        ),
        (NativeReply(status=404, body=b"Not Found", headers={"content-type": "text/plain"}), 404, "not_found_error"),
        (NativeReply(status=503, body={"error": {"message": "busy"}}), 529, "overloaded_error"),
        (
            NativeReply(status=200, body=b"<html>login page</html>", headers={"content-type": "text/html"}),
            502,
            "api_error",
        ),
        (NativeReply(status=200, events=text_events("a stream")), 502, "api_error"),
    ],
    ids=["html-502", "text-404", "openai-shaped-503", "html-200", "stream-to-a-json-request"],
)
def test_replies_that_are_not_anthropic_shaped_become_dragomans_errors(sdk, native, reply, status, kind):
    native.replies.append(reply)
    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk.messages.create(**ASK)
    assert caught.value.status_code == status
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == kind
    assert caught.value.response.headers["request-id"].startswith("req_")


def test_a_json_reply_to_a_stream_request_is_a_502_the_sdk_raises(sdk, native):
    native.replies.append(NativeReply(body=message("not a stream")))
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk.messages.stream(**ASK) as stream:
            stream.get_final_message()
    assert caught.value.status_code == 502 and "without a stream" in caught.value.body["error"]["message"]


def test_the_server_refusing_the_gateways_key_is_a_502_not_the_clients_401(sdk, native):
    body = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key: upstream-secret"}}
    native.replies.append(NativeReply(status=401, body=body))
    with pytest.raises(anthropic.InternalServerError) as caught:
        sdk.messages.create(**ASK)
    assert caught.value.status_code == 502 and caught.value.response.headers["x-should-retry"] == "false"
    assert "upstream-secret" not in caught.value.response.text


def test_the_gateways_upstream_key_never_reaches_the_client(sdk, native):
    quoting = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "key upstream-secret is not allowed here"},
    }
    native.replies.append(NativeReply(status=400, body=quoting))
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.create(**ASK)
    assert caught.value.body["error"]["message"] == "key [redacted] is not allowed here"

    failing = event("error", {"type": "error", "error": {"type": "api_error", "message": "bad key upstream-secret"}})
    native.replies.append(NativeReply(events=[*text_events("Hi")[:3], failing]))
    with pytest.raises(anthropic.APIStatusError) as caught_stream:
        with sdk.messages.stream(**ASK) as stream:
            stream.get_final_message()
    assert "upstream-secret" not in str(caught_stream.value.body) and "[redacted]" in str(caught_stream.value.body)


def test_the_upstream_key_escaped_in_json_is_redacted_too(sdk, native):
    """A server may write the key with JSON escapes (`\\u002d` for `-`): the client decodes them."""
    escaped = b"upstream\\u002dsecret"
    body = b'{"type":"error","error":{"type":"invalid_request_error","message":"key ' + escaped + b' is bad"}}'
    native.replies.append(NativeReply(status=400, body=body, headers={"content-type": "application/json"}))
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.create(**ASK)
    assert caught.value.body["error"]["message"] == "key [redacted] is bad"

    data = b'{"type":"error","error":{"type":"api_error","message":"bad key ' + escaped + b'"}}'
    native.replies.append(NativeReply(events=[*text_events("Hi")[:3], b"event: error\ndata: " + data + b"\n\n"]))
    with pytest.raises(anthropic.APIStatusError) as caught_stream:
        with sdk.messages.stream(**ASK) as stream:
            stream.get_final_message()
    assert "upstream-secret" not in str(caught_stream.value.body) and "[redacted]" in str(caught_stream.value.body)


def test_several_anthropic_beta_headers_all_reach_the_server(passthrough, native):
    headers = [
        ("x-api-key", "client-key"),
        ("anthropic-beta", "files-api-2025-04-14"),
        ("anthropic-beta", "context-1m-2025-08-07"),
    ]
    response = httpx.post(passthrough.url + "/v1/messages", headers=headers, json=ASK)
    assert response.status_code == 200
    assert native.requests[-1][2]["anthropic-beta"] == "files-api-2025-04-14,context-1m-2025-08-07"


def test_count_tokens_forwarded(sdk, native):
    native.replies.append(NativeReply(body={"input_tokens": 42}))
    result = sdk.messages.with_raw_response.count_tokens(
        model="claude-test", messages=[{"role": "user", "content": "Hi"}]
    )
    assert result.parse().input_tokens == 42
    assert result.headers["x-token-count-method"] == "upstream"
    assert native.requests[0][0] == "/v1/messages/count_tokens"


def _streamed_with_a_silence(native, events: list) -> bytes:
    """The client's bytes of a stream whose upstream events hold a 0.7 s silence, through a
    gateway that fills silences every 0.2 s."""
    server = GatewayServer(_config(native, keepalive_interval=0.2)).start()
    try:
        native.replies.append(NativeReply(events=events))
        with httpx.stream(
            "POST", server.url + "/v1/messages",
            json={"model": "claude-test", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
        ) as response:  # fmt: skip
            return b"".join(response.iter_bytes())
    finally:
        server.stop()


def test_pings_fill_a_silent_stream_between_frames(native):
    events = text_events("late")
    data = _streamed_with_a_silence(native, [events[0], ("sleep", 0.7), *events[1:]])
    assert data.count(b"event: ping") >= 2
    assert data.startswith(b"event: message_start")
    assert data.endswith(event("message_stop", {"type": "message_stop"}))


def test_keepalives_fill_the_silence_before_message_start(native):
    """llama-server answers 200 at once and sends `message_start` only after the prefill:
    that silence gets comment lines, or Claude Code aborts a long prefill (180 s without
    a byte). Nothing of the stream has gone out yet, so a `ping` would come too early."""
    data = _streamed_with_a_silence(native, [("sleep", 0.7), *text_events("late")])
    head, _, rest = data.partition(b"event: message_start")
    assert head.count(b": keep-alive\n\n") >= 2 and head.replace(b": keep-alive\n\n", b"") == b"", data
    assert b"event: ping" not in head
    assert rest.endswith(event("message_stop", {"type": "message_stop"}))


def test_a_servers_own_comments_before_a_silent_prefill_are_no_message_start(native):
    """llama-server sends `:` lines of its own while it reads a long prompt: they go on, and
    the silence after them still gets comments, not pings (nothing of the stream has gone out)."""
    data = _streamed_with_a_silence(native, [b":\n\n", ("sleep", 0.7), *text_events("late")])
    head, found, rest = data.partition(b"event: message_start")
    assert found and head.startswith(b":\n\n") and all(line.startswith(b":") for line in head.splitlines() if line), (
        data
    )
    assert head.count(b": keep-alive\n\n") >= 2
    assert rest.endswith(event("message_stop", {"type": "message_stop"}))


def test_client_disconnect_closes_the_upstream_stream(passthrough, native):
    events = text_events("x")
    native.replies.append(NativeReply(events=[events[0], *[("sleep", 0.05)] * 100, *events[1:]]))
    with httpx.stream(
        "POST", passthrough.url + "/v1/messages", headers={"x-api-key": "client-key"},
        json={"model": "claude-test", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "Hi"}]},
    ) as response:  # fmt: skip
        next(response.iter_bytes())
    eventually(lambda: native.disconnects, "the upstream saw the disconnect")
    assert native.disconnects == 1


def test_non_stream_usage_in_metrics(sdk, native, passthrough):
    native.replies.append(NativeReply(body=message("ok", input_tokens=11, output_tokens=4)))
    sdk.messages.create(model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    metrics = httpx.get(passthrough.url + "/metrics").text
    assert 'dragoman_tokens_total{direction="output",model="native-model"} 4.0' in metrics  # by served model
    assert 'path="passthrough"' in metrics


def test_a_native_upstream_without_a_model_list_judges_the_names_no_other_upstream_lists(
    native, upstream, gateway_from
):
    """Beside a translating upstream that lists its models, a passthrough upstream whose
    `GET /v1/models` is a 404 gets every other name (as the one upstream without a list)."""
    native.no_model_list = True
    gateway = gateway_from({"upstreams": {"vllm": {"url": upstream.url},
                                          "hosted": {"url": native.url, "protocol": "anthropic"}}})  # fmt: skip
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    assert client.messages.create(
        model="test-model", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
    ).content
    assert [r["model"] for r in upstream.requests] == ["test-model"]
    client.messages.create(model="claude-hosted", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    assert [(path, body["model"]) for path, body, _ in native.requests] == [("/v1/messages", "claude-hosted")]
