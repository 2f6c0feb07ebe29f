"""The passthrough relay: bytes forwarded as they arrive, the model name put back in
the head, and token counts read for the metrics without decoding the stream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dragoman.backends.anthropic.backend import AnthropicBackend
from dragoman.backends.shared import Shared
from dragoman.calls.types import Call, Outcome
from dragoman.core.config_load import from_dict
from tests.support.passthrough_stream import BLOCK, DELTA, END, START, STOP, client_stream, events_of, relay
from tests.support.responses import ScriptedResponse as Response


def test_tokens_arriving_one_by_one_are_counted_from_message_start_and_message_delta() -> None:
    body, outcome, response = relay([START, BLOCK, DELTA, DELTA, STOP, END])
    assert (outcome.input_tokens, outcome.output_tokens, outcome.cache_read_tokens) == (31, 12, 7)
    assert body.count(b'"model":"client-name"') == 1 and b"served" not in body
    assert response.released


def test_a_whole_stream_in_one_read_is_counted_the_same() -> None:
    body, outcome, _ = relay([START + BLOCK + DELTA * 50 + STOP + END])
    assert (outcome.input_tokens, outcome.output_tokens, outcome.cache_read_tokens) == (31, 12, 7)
    assert body.startswith(START.replace(b'"served"', b'"client-name"'))


class FailingResponse(Response):
    """An upstream whose connection breaks after the given reads."""

    async def readany(self) -> bytes:
        await asyncio.sleep(0)
        if not self._reads:
            raise ConnectionResetError("connection reset by peer")
        return self._reads.pop(0)


def relay_failing(reads: list[bytes]) -> bytes:
    config = from_dict({"upstreams": {"native": {"url": "http://127.0.0.1:9", "protocol": "anthropic"}}})
    backend = AnthropicBackend("native", config.upstreams["native"], config, Shared())  # type: ignore[arg-type]
    call = Call(b"{}", "served", "served", {}, "req_1", True, Outcome(request_id="req_1", endpoint="messages"))

    async def run() -> bytes:
        return await client_stream(backend._relay(FailingResponse(reads), call))  # type: ignore[arg-type]

    return asyncio.run(run())


def test_an_upstream_failing_mid_event_ends_with_an_error_event_after_the_last_whole_one() -> None:
    half = DELTA[: len(DELTA) // 2]
    body = relay_failing([START, BLOCK, DELTA, half])
    names = [name for name, _ in events_of(body)]
    assert names == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert events_of(body)[-1][1]["error"]["type"] == "api_error"


def test_an_event_cut_across_reads_goes_out_whole_and_in_order() -> None:
    stream = START + BLOCK + DELTA + DELTA + STOP + END
    reads = [stream[i : i + 37] for i in range(0, len(stream), 37)]
    body, outcome, response = relay(reads)
    assert body == stream.replace(b'"served"', b'"client-name"')
    assert outcome.output_tokens == 12 and response.released


@pytest.mark.parametrize("last", [DELTA, STOP, DELTA[:20]], ids=["after-a-delta", "after-a-block", "mid-event"])
def test_a_stream_that_ends_without_message_stop_ends_with_an_error_event(last: bytes) -> None:
    body, _, response = relay([START, BLOCK, last])
    found = events_of(body)
    assert found[-1][0] == "error" and "before the reply was complete" in found[-1][1]["error"]["message"]
    assert [name for name, _ in found].count("message_stop") == 0
    assert response.closed and not response.released


def test_an_upstream_error_event_is_a_complete_end() -> None:
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    body, _, response = relay([START, BLOCK, DELTA, error])
    assert body.endswith(error) and body.count(b"event: error") == 1
    assert response.released


def test_text_that_mentions_message_stop_does_not_end_the_stream() -> None:
    sly = DELTA.replace(b'"text":"hi"', b'"text":"\\"message_stop\\" and \\"error\\""')
    body, _, _ = relay([START, BLOCK, sly])
    assert events_of(body)[-1][0] == "error"


def test_crlf_events_are_forwarded_whole() -> None:
    stream = (START + BLOCK + DELTA + STOP + END).replace(b"\n", b"\r\n")
    reads = [stream[i : i + 50] for i in range(0, len(stream), 50)]
    body, outcome, response = relay(reads)
    assert body == stream.replace(b'"served"', b'"client-name"') and response.released
    assert outcome.output_tokens == 12


def test_bytes_that_are_not_utf8_are_replaced_and_whole_characters_kept() -> None:
    invalid = DELTA.replace(b'"text":"hi"', b'"text":"h\xffi"')
    cut = DELTA.replace(b'"text":"hi"', '"text":"é"'.encode())
    at = cut.index("é".encode()) + 1  # a read ends inside the character
    body, _, _ = relay([START, BLOCK, invalid, cut[:at], cut[at:], STOP, END])
    texts = [data["delta"]["text"] for name, data in events_of(body) if name == "content_block_delta"]
    assert texts == ["h\ufffdi", "é"]


@pytest.mark.parametrize("text", [b"error", b"message_stop"])
def test_a_text_that_is_exactly_an_end_events_name_does_not_end_the_stream(text: bytes) -> None:
    sly = DELTA.replace(b'"text":"hi"', b'"text":"' + text + b'"')
    stop_named = END.replace(b'"stop_sequence":null', b'"stop_sequence":"' + text + b'"')
    body, outcome, response = relay([START, BLOCK, sly, DELTA, STOP, stop_named])
    names = [name for name, _ in events_of(body)]
    assert names[-2:] == ["message_delta", "message_stop"] and "error" not in names
    assert response.released and outcome.error_type is None


def test_bytes_after_message_stop_in_the_same_read_are_dropped_not_an_error() -> None:
    body, _, response = relay([START, BLOCK, DELTA, STOP, END + b"data: [DO", b"NE]\n\n"])
    assert body.endswith(b'data: {"type":"message_stop"}\n\n')
    assert [name for name, _ in events_of(body)][-1] == "message_stop"


def test_an_upstream_error_event_is_recorded_as_the_upstreams_error() -> None:
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    _, outcome, _ = relay([START, BLOCK, DELTA, error])
    assert outcome.error_type == "overloaded_error" and outcome.upstream_failed


@pytest.mark.parametrize(
    "reads", [[BLOCK, DELTA, STOP, END], [BLOCK + DELTA + STOP + END]], ids=["event-by-event", "one-read"]
)
def test_a_stream_without_message_start_gets_one_before_its_first_event(reads: list[bytes]) -> None:
    # llama-server sends none when the reply's first token is part of a character (an emoji).
    body, outcome, response = relay(reads)
    found = events_of(body)
    assert [name for name, _ in found] == ["message_start", "content_block_start", "content_block_delta",
                                           "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    message = found[0][1]["message"]
    assert message["model"] == "client-name" and message["id"].startswith("msg_") and message["content"] == []
    assert message["usage"]["input_tokens"] == 0 and message["stop_reason"] is None
    assert body.endswith(BLOCK + DELTA + STOP + END)  # the server's events unchanged
    assert outcome.output_tokens == 12 and response.released


def test_a_stream_that_starts_with_message_start_or_a_ping_gets_none_added() -> None:
    ping = b'event: ping\ndata: {"type":"ping"}\n\n'
    body, _, _ = relay([ping, START, BLOCK, DELTA, STOP, END])
    assert [name for name, _ in events_of(body)].count("message_start") == 1
    assert body.startswith(ping)


# -- the null fields the SDKs type, put in where a server (llama-server) leaves them out -------

BARE_START = START.replace(b'"stop_details":null,"container":null,"diagnostics":null,', b"")
BARE_END = END.replace(b',"stop_details":null,"container":null', b"")
MESSAGE_NULLS = {"stop_details": None, "container": None, "diagnostics": None}


def _split(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


@pytest.mark.parametrize(
    "reads",
    [
        [BARE_START, BLOCK, DELTA, STOP, BARE_END],
        [BARE_START + BLOCK + DELTA * 20 + STOP + BARE_END],  # all of it in the head
        _split(BARE_START + BLOCK + DELTA * 20 + STOP + BARE_END, 37),
        _split((BARE_START + BLOCK + DELTA + STOP + BARE_END).replace(b"\n", b"\r\n"), 50),
    ],
    ids=["event-by-event", "one-read", "cut-anywhere", "crlf"],
)
def test_a_server_leaving_out_the_null_fields_gets_them_put_in(reads: list[bytes]) -> None:
    body, outcome, response = relay(reads)
    found = events_of(body)
    start, delta = found[0][1], found[-2][1]
    assert {name: start["message"][name] for name in MESSAGE_NULLS} == MESSAGE_NULLS
    assert start["message"]["model"] == "client-name" and start["message"]["usage"]["input_tokens"] == 31
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None, "stop_details": None, "container": None}
    assert delta["usage"] == {"output_tokens": 12}
    assert [name for name, _ in found].count("content_block_delta") == body.count(b'"text_delta"')
    assert DELTA.replace(b"\n", b"\r\n") in body or DELTA in body  # content events unchanged
    assert (outcome.input_tokens, outcome.output_tokens, outcome.cache_read_tokens) == (31, 12, 7) and response.released


def test_only_the_missing_fields_are_put_in_and_a_servers_own_are_kept() -> None:
    refusal = b'"stop_details":{"type":"refusal","category":"cyber","explanation":null}'
    end = BARE_END.replace(b'"stop_reason":"end_turn"', b'"stop_reason":"refusal",' + refusal)
    body, _, _ = relay([START, BLOCK, DELTA, STOP, end])
    delta = events_of(body)[-2][1]["delta"]
    assert (
        delta["stop_details"] == {"type": "refusal", "category": "cyber", "explanation": None}
        and delta["container"] is None
    )


def test_a_text_that_names_the_events_is_not_rewritten() -> None:
    sly = DELTA.replace(b'"text":"hi"', b'"text":"\\"message_delta\\" and message_start"')
    stream = BARE_START.replace(b'"content":[]', b'"content":[],"note":"message_delta"') + BLOCK + sly + STOP + END
    body, _, _ = relay([stream[: len(BARE_START) + 20], stream[len(BARE_START) + 20 :]])
    assert sly in body and body.endswith(STOP + END)


def test_no_json_is_decoded_for_content_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path: of a stream's events, only message_start and message_delta may be
    decoded (and only when a field is missing), never a content_block_delta."""
    from dragoman.backends.anthropic import events as anthropic_events

    decoded: list[bytes] = []
    real = anthropic_events.msgspec.json.decode

    def counting(data: bytes, *args: Any, **kwargs: Any) -> Any:
        decoded.append(bytes(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(anthropic_events.msgspec.json, "decode", counting)
    relay([BARE_START, BLOCK, *[DELTA] * 100, STOP, BARE_END])
    assert [b'"message_start"' in data for data in decoded] == [True, False]
    assert b'"message_delta"' in decoded[1]
    decoded.clear()
    relay([START, BLOCK, *[DELTA] * 100, STOP, END])  # a server that sends them all: nothing decoded
    assert decoded == []


BARE_MESSAGE = b'{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}'


@pytest.mark.parametrize(
    ("body", "added"),
    [
        (BARE_MESSAGE, MESSAGE_NULLS),
        (BARE_MESSAGE.replace(b'"content":[]', b'"content":[],"container":{"id":"c","expires_at":"x"}'),
         {"stop_details": None, "diagnostics": None}),
        (BARE_MESSAGE.replace(b'"content":[]', b'"content":[],"stop_details":null,"container":null,"diagnostics":null'), {}),
        (b'{"type":"error","error":{"type":"api_error","message":"x"}}', {}),
        (b"[1, 2]", {}),
        (b"{not json", {}),
    ],
    ids=["bare", "has-container", "complete", "not-a-message", "not-an-object", "not-json"],
)  # fmt: skip
def test_a_non_streamed_reply_gets_the_missing_null_fields(body: bytes, added: dict) -> None:
    from dragoman.backends.anthropic.events import completed_message

    out = completed_message(body)
    if not added:
        assert out is body  # not even encoded again
        return
    reply = json.loads(out)
    assert {name: reply[name] for name in added} == added
    assert {k: v for k, v in reply.items() if k not in added} == json.loads(body)


@pytest.mark.parametrize("comments", [[b":\n\n"], [b":\n\n", b": still reading\r\n\r\n"], [b":", b"\n\n:\n\n"]],
                         ids=["one", "two-crlf", "cut"])  # fmt: skip
def test_a_servers_own_comments_before_message_start_go_on_and_the_head_is_still_the_head(
    comments: list[bytes],
) -> None:
    # llama-server sends `:` lines while it reads a long prompt; the head is the event after them.
    body, outcome, _ = relay([*comments, START, BLOCK, DELTA, STOP, END])
    sent = b"".join(comments)
    assert body.startswith(sent)
    found = events_of(body[len(sent) :])
    assert [name for name, _ in found][0] == "message_start"
    assert found[0][1]["message"]["model"] == "client-name"  # renamed, as a head is
    assert outcome.input_tokens == 31
