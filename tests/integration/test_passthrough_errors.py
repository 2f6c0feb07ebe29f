"""A passthrough server's error reaches the SDK in Anthropic's envelope: llama-server's
OpenAI-shaped error bodies become it. An error event that begins a stream, before anything
reached the client, is the HTTP error the server would have answered: the SDKs (and Claude
Code) retry a 529 or a 500, not an `error` event after a 200. An error after the stream
began is still an `error` event, in Anthropic's envelope whatever shape the server wrote it in."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from tests.support.fake_anthropic import ASK, FakeAnthropic, NativeReply, event, text_events
from tests.support.fake_anthropic import passthrough_config as _config
from tests.support.servers import GatewayServer


@pytest.fixture
def passthrough(native: FakeAnthropic) -> Iterator[GatewayServer]:
    server = GatewayServer(_config(native, api_keys=["client-key"])).start()
    yield server
    server.stop()


def sdk(server: GatewayServer, retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="client-key", max_retries=retries)


def error_event(kind: str, message: str) -> bytes:
    return event("error", {"type": "error", "error": {"type": kind, "message": message}})


# llama-server's own words for a prompt longer than its context (observed, -c 512).
LLAMA_OVERFLOW = {
    "code": 400, "message": "request (1031 tokens) exceeds the available context size (512 tokens), try increasing it",
    "type": "exceed_context_size_error", "n_prompt_tokens": 1031, "n_ctx": 512,
}  # fmt: skip


def test_a_stream_that_begins_with_overloaded_error_is_a_529_with_the_servers_retry_after(passthrough, native):
    native.replies.append(
        NativeReply(events=[error_event("overloaded_error", "Overloaded")], headers={"retry-after": "4"})
    )
    with pytest.raises(anthropic.InternalServerError) as caught:
        with sdk(passthrough).messages.stream(**ASK) as stream:
            stream.get_final_message()
    assert caught.value.status_code == 529
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"},
                                 "request_id": caught.value.response.headers["request-id"]}  # fmt: skip
    assert caught.value.response.headers["retry-after"] == "4"
    assert caught.value.response.headers["content-type"].startswith("application/json")
    metrics = httpx.get(
        passthrough.url + "/metrics"
    ).text.splitlines()  # recorded as the upstream's failure, with its status
    assert 'dragoman_upstream_errors_total{type="overloaded_error",upstream="native"} 1.0' in metrics
    assert any(row.startswith("dragoman_requests_total{") and 'status="529"' in row for row in metrics)


def test_a_stream_that_begins_with_invalid_request_error_is_a_400(passthrough, native):
    too_long = "prompt is too long: 208656 tokens > 200000 maximum"
    native.replies.append(NativeReply(events=[error_event("invalid_request_error", too_long)]))
    with pytest.raises(anthropic.BadRequestError) as caught:
        with sdk(passthrough).messages.stream(**ASK) as stream:
            stream.get_final_message()
    assert caught.value.body["error"] == {
        "type": "invalid_request_error",
        "message": too_long,
    }  # Claude Code compacts on these words


def test_the_sdks_own_retry_gets_the_message_after_an_opening_overloaded_error(passthrough, native):
    native.replies.append(NativeReply(events=[error_event("overloaded_error", "Overloaded")]))
    native.replies.append(NativeReply(events=text_events("Second time")))
    with sdk(passthrough, retries=1).messages.stream(**ASK) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Second time"
    assert len(native.requests) == 2


def test_an_error_event_after_message_start_is_still_an_error_event(passthrough, native):
    failing = error_event("overloaded_error", "Overloaded")
    native.replies.append(NativeReply(events=[*text_events("Hi")[:3], failing]))
    with httpx.stream(
        "POST", passthrough.url + "/v1/messages", headers={"x-api-key": "client-key"}, json={**ASK, "stream": True}
    ) as response:
        body = b"".join(response.iter_bytes())
    assert response.status_code == 200
    assert body.startswith(b"event: message_start") and body.endswith(failing)

    native.replies.append(NativeReply(events=[*text_events("Hi")[:3], failing]))
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk(passthrough).messages.stream(**ASK) as stream:
            stream.get_final_message()
    assert caught.value.body["error"]["type"] == "overloaded_error"  # raised from the event, after the 200


LLAMA_MIDSTREAM = {"code": 500, "message": "failed to decode the batch", "type": "server_error"}


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (LLAMA_MIDSTREAM, {"type": "api_error", "message": "upstream native answered 500: server_error: failed to decode the batch"}),
        (LLAMA_OVERFLOW, {"type": "invalid_request_error",
                          "message": "prompt is too long: 1031 tokens > 512 maximum (capability_rejected: prompt_too_long)"}),
    ],
    ids=["server-error", "overflow"],
)  # fmt: skip
def test_llama_servers_bare_error_event_mid_stream_reaches_the_sdk_in_anthropics_envelope(
    passthrough, native, error, expected
):
    # llama-server writes an error after message_start as `event: error` with its bare object.
    native.replies.append(
        NativeReply(events=[*text_events("Partial")[:3], f"event: error\ndata: {json.dumps(error)}\n\n".encode()])
    )
    said = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk(passthrough).messages.stream(**ASK) as stream:
            for text in stream.text_stream:
                said.append(text)
    assert said == ["Partial"]  # what came before the error reached the client
    assert caught.value.status_code == 200  # raised from the event, after the 200
    assert caught.value.body == {"type": "error", "error": expected}
    metrics = httpx.get(passthrough.url + "/metrics").text.splitlines()
    assert f'dragoman_upstream_errors_total{{type="{expected["type"]}",upstream="native"}} 1.0' in metrics


def test_an_error_event_after_the_servers_own_comment_line_is_an_error_event(passthrough, native):
    # llama-server's `:` lines during a prefill go on at once: the 200 is out with the first.
    failing = error_event("overloaded_error", "Overloaded")
    native.replies.append(NativeReply(events=[b":\n\n", failing]))
    with httpx.stream(
        "POST", passthrough.url + "/v1/messages", headers={"x-api-key": "client-key"}, json={**ASK, "stream": True}
    ) as response:
        body = b"".join(response.iter_bytes())
    assert response.status_code == 200 and body == b":\n\n" + failing


def test_llama_servers_error_as_the_first_event_is_anthropics_400(passthrough, native):
    # llama-server's /v1/messages writes a stream's error as `event: error` with its bare error object.
    native.replies.append(NativeReply(events=[f"event: error\ndata: {json.dumps(LLAMA_OVERFLOW)}\n\n".encode()]))
    with pytest.raises(anthropic.BadRequestError) as caught:
        with sdk(passthrough).messages.stream(**ASK) as stream:
            stream.get_final_message()
    assert caught.value.body["error"]["message"].startswith("prompt is too long: 1031 tokens > 512 maximum")


LLAMA_NO_VISION = {"code": 500, "message": "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj",
                   "type": "server_error"}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["message", "stream"])
@pytest.mark.parametrize(
    ("status", "error", "said"),
    [(400, LLAMA_OVERFLOW, "prompt is too long: 1031 tokens > 512 maximum"), (500, LLAMA_NO_VISION, "the model behind upstream native does not accept images")],
    ids=["overflow", "no-vision"],
)  # fmt: skip
def test_llama_servers_openai_shaped_error_body_is_anthropics_envelope(
    passthrough, native, stream, status, error, said
):
    # What llama-server answers, streamed or not: a JSON error in OpenAI's shape, which was
    # relayed as it was (it has `error.type` and `error.message`, not Anthropic's `"type": "error"`).
    native.replies.append(NativeReply(status=status, body={"error": error}))
    with pytest.raises(anthropic.BadRequestError) as caught:  # neither is retried: a 400
        if stream:
            with sdk(passthrough).messages.stream(**ASK) as s:
                s.get_final_message()
        else:
            sdk(passthrough).messages.create(**ASK)
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert caught.value.body["error"]["message"].startswith(said)


@pytest.mark.parametrize(
    ("last", "expected"),
    [
        # A server that writes its error event and closes without the blank line that ends it.
        (error_event("overloaded_error", "Overloaded")[:-2], {"type": "overloaded_error", "message": "Overloaded"}),
        (f"event: error\ndata: {json.dumps(LLAMA_MIDSTREAM)}\n".encode(),
         {"type": "api_error", "message": "upstream native answered 500: server_error: failed to decode the batch"}),
        # OpenAI's shape as an unnamed event (no `event: error` line): the stream's end all the same.
        (b'data: {"error": {"message": "failed to decode the batch", "type": "server_error"}}\n\n',
         {"type": "api_error", "message": "upstream native answered 502: server_error: failed to decode the batch"}),
    ],
    ids=["anthropic-no-blank-line", "llama-no-blank-line", "unnamed-openai"],
)  # fmt: skip
def test_an_error_event_cut_off_or_unnamed_mid_stream_reaches_the_sdk_as_the_servers_error(
    passthrough, native, last, expected
):
    native.replies.append(NativeReply(events=[*text_events("Partial")[:3], last]))
    said = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk(passthrough).messages.stream(**ASK) as stream:
            for text in stream.text_stream:
                said.append(text)
    assert said == ["Partial"]
    assert caught.value.body == {
        "type": "error",
        "error": expected,
    }  # the server's error, not "closed the stream before ..."
    metrics = httpx.get(passthrough.url + "/metrics").text.splitlines()
    assert f'dragoman_upstream_errors_total{{type="{expected["type"]}",upstream="native"}} 1.0' in metrics
