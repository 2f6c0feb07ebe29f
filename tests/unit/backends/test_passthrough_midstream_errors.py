"""A passthrough stream's `error` event after `message_start`: it goes out in Anthropic's
envelope whatever shape the server wrote it in (llama-server writes its bare
`{"code", "message", "type"}`), mapped as the same error opening the stream is
(error_mapping.from_error_event), and the metrics record the mapped type. Anthropic's own
envelope goes out as it came (the gateway's key redacted)."""

from __future__ import annotations

import json

import pytest

from dragoman.backends.shared import Shared
from dragoman.core.redaction import Redactor
from tests.support.passthrough_stream import BLOCK, DELTA, START, events_of, relay


def error_event(data: bytes) -> bytes:
    return b"event: error\ndata: " + data + b"\n\n"


def envelope(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


LLAMA_500 = b'{"code":500,"message":"boom","type":"server_error"}'
LLAMA_503 = b'{"code":503,"message":"Loading model","type":"unavailable_error"}'
LLAMA_OVERFLOW = (
    b'{"code":400,"message":"request (1031 tokens) exceeds the available context size (512 tokens), try increasing it",'
    b'"type":"exceed_context_size_error","n_prompt_tokens":1031,"n_ctx":512}'
)
OPENAI_SERVER = b'{"error":{"message":"boom","type":"server_error"}}'
OPENAI_INVALID = b'{"error":{"message":"bad field","type":"invalid_request_error","code":null}}'
BEFORE = [START, BLOCK, DELTA]  # message_start and a text: the client's 200 and its first words are out


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (LLAMA_500, envelope("api_error", "upstream native answered 500: server_error: boom")),
        (LLAMA_503, envelope("overloaded_error", "upstream native answered 503: unavailable_error: Loading model")),
        (LLAMA_OVERFLOW, envelope("invalid_request_error",
                                  "prompt is too long: 1031 tokens > 512 maximum (capability_rejected: prompt_too_long)")),
        (OPENAI_SERVER, envelope("api_error", "upstream native answered 502: server_error: boom")),
        (OPENAI_INVALID, envelope("invalid_request_error", "upstream native answered 400: invalid_request_error: bad field")),
        (b"something broke", envelope("api_error", "upstream native answered 500: something broke")),
    ],
    ids=["llama-500", "llama-503", "llama-overflow", "openai-server", "openai-invalid", "text"],
)  # fmt: skip
def test_an_error_event_in_another_shape_goes_out_in_anthropics_envelope(data: bytes, expected: dict) -> None:
    body, outcome, response = relay([*BEFORE, error_event(data)])
    found = events_of(body)
    assert [name for name, _ in found] == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert found[-1][1] == expected
    assert outcome.error_type == expected["error"]["type"] and outcome.upstream_failed
    assert response.released  # a complete end: no "closed before the reply was complete" after it


def test_anthropics_envelope_goes_out_as_it_came() -> None:
    # Spaces, its key order, and a field dragoman does not know: the server's bytes, not dragoman's encoding of them.
    sent = error_event(
        b'{"type": "error", "error": {"message": "Overloaded", "type": "overloaded_error"}, "request_id": "req_up"}'
    )
    body, outcome, _ = relay([*BEFORE, sent])
    assert body.endswith(sent) and body.count(b"event: error") == 1
    assert outcome.error_type == "overloaded_error" and outcome.upstream_failed


def test_the_gateways_key_is_redacted_in_either_shape() -> None:
    shared = Shared(redactor=Redactor("midstream-secret-key"))
    anthropic_shape = error_event(json.dumps(envelope("api_error", "key midstream-secret-key")).encode())
    body, _, _ = relay([*BEFORE, anthropic_shape], shared)
    assert body.endswith(anthropic_shape.replace(b"midstream-secret-key", b"[redacted]"))
    body, _, _ = relay(
        [*BEFORE, error_event(b'{"code":500,"message":"key midstream-secret-key","type":"server_error"}')], shared
    )
    assert b"midstream-secret-key" not in body and events_of(body)[-1][1]["error"]["message"].endswith("key [redacted]")


LLAMA = error_event(LLAMA_500)
REWRITTEN = error_event(
    json.dumps(
        envelope("api_error", "upstream native answered 500: server_error: boom"), separators=(",", ":")
    ).encode()
)


@pytest.mark.parametrize(
    "reads",
    [
        [*BEFORE, LLAMA[:9], LLAMA[9:]],  # inside `event: error`
        [*BEFORE, LLAMA[:30], LLAMA[30:]],  # inside its data
        [*BEFORE, LLAMA[:-1], LLAMA[-1:]],  # before the blank line
        [*BEFORE, *(LLAMA[i : i + 1] for i in range(len(LLAMA)))],  # a byte at a time
        [b"".join(BEFORE) + LLAMA],  # one read: message_start and the error in the stream's head
        [*BEFORE, LLAMA + b"data: [DONE]\n\n"],  # what a proxy adds after the end is dropped, as after message_stop
    ],
    ids=["cut-in-name", "cut-in-data", "cut-before-blank-line", "byte-by-byte", "one-read", "junk-after"],
)
def test_an_error_event_cut_across_reads_or_sharing_one_is_put_in_the_envelope_whole(reads: list[bytes]) -> None:
    body, outcome, response = relay(reads)
    assert body.endswith(b'"text":"hi"}}\n\n' + REWRITTEN)
    assert outcome.error_type == "api_error" and response.released


def test_crlf_line_ends_are_kept_in_the_rewritten_event() -> None:
    reads = [event.replace(b"\n", b"\r\n") for event in [*BEFORE, LLAMA]]
    body, outcome, _ = relay([*reads[:-1], reads[-1][:12], reads[-1][12:]])  # cut after `event: error\r`
    assert body.endswith(b'"text":"hi"}}\r\n\r\n' + REWRITTEN.replace(b"\n", b"\r\n"))
    assert events_of(body)[-1][1]["error"]["type"] == "api_error" and outcome.error_type == "api_error"


def test_a_text_saying_error_is_not_an_error_event() -> None:
    # The word alone now sends a read to the closer look: it finds no end there.
    said = [DELTA.replace(b'"hi"', text) for text in (b'" error"', b'"event: error"', b'"server_error"')]
    body, outcome, _ = relay([START, BLOCK, *said, LLAMA])
    assert [name for name, _ in events_of(body)].count("error") == 1 and body.endswith(REWRITTEN)
    assert outcome.error_type == "api_error"


def crlf(reads: list[bytes]) -> list[bytes]:
    return [read.replace(b"\n", b"\r\n") for read in reads]


# An error event the server closed its stream on without the blank line that ends an event:
# completed and taken as the stream's end, not dragoman's "closed the stream before the reply
# was complete".
GENERIC = b"closed the stream before the reply was complete"
ANTHROPIC_OVERLOADED = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'


@pytest.mark.parametrize("line_ends", [lambda reads: reads, crlf], ids=["lf", "crlf"])
@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (b"event: error\ndata: " + LLAMA_500, envelope("api_error", "upstream native answered 500: server_error: boom")),
        (b"event: error\ndata: " + LLAMA_500 + b"\n", envelope("api_error", "upstream native answered 500: server_error: boom")),
        (b"event: error\ndata: " + ANTHROPIC_OVERLOADED, envelope("overloaded_error", "Overloaded")),
        (b"data: " + OPENAI_SERVER, envelope("api_error", "upstream native answered 502: server_error: boom")),
        (b"event: error\ndata: something broke\n", envelope("api_error", "upstream native answered 500: something broke")),
    ],
    ids=["llama-no-line-end", "llama-no-blank-line", "anthropic", "unnamed-openai", "text-line-ended"],
)  # fmt: skip
@pytest.mark.parametrize("cut", [None, 9, 25], ids=["one-read", "cut-in-name", "cut-in-data"])
def test_an_error_event_cut_off_by_the_streams_end_is_its_end(
    line_ends, tail: bytes, expected: dict, cut: int | None
) -> None:
    reads = line_ends([*BEFORE, tail])
    if cut is not None:
        reads[-1:] = [reads[-1][:cut], reads[-1][cut:]]
    body, outcome, response = relay(reads)
    found = events_of(body)
    assert [name for name, _ in found] == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert found[-1][1] == expected and GENERIC not in body
    # The server's line ends (an event cut in its only line, unnamed OpenAI's, has none to go by: \n).
    assert body.endswith(b"\r\n\r\n" if b"\r" in line_ends([tail])[0] else b"}\n\n")
    assert outcome.error_type == expected["error"]["type"] and outcome.upstream_failed
    assert response.released  # a complete end


def test_anthropics_envelope_cut_off_by_the_streams_end_goes_out_as_it_came_but_for_its_blank_line() -> None:
    body, _, _ = relay([*BEFORE, b"event: error\ndata: " + ANTHROPIC_OVERLOADED])
    assert body.endswith(b'"hi"}}\n\nevent: error\ndata: ' + ANTHROPIC_OVERLOADED + b"\n\n")


@pytest.mark.parametrize(
    "tail",
    [b"event: error\ndata: " + LLAMA_500[:20], b"data: " + OPENAI_SERVER[:-1], b"event: error", b"event: error\n",
     DELTA.replace(b'"hi"', b'"an error"').rstrip()],
    ids=["cut-in-data", "unnamed-cut-in-data", "no-data", "no-data-line-ended", "not-an-error"],
)  # fmt: skip
def test_an_event_cut_off_that_is_no_whole_error_leaves_the_stream_incomplete(tail: bytes) -> None:
    body, _, _ = relay([*BEFORE, tail])
    found = events_of(body)
    assert [name for name, _ in found] == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert found[-1][1]["error"]["type"] == "api_error" and body.endswith(GENERIC + b'"}}\n\n')


# OpenAI's shape unnamed, `data: {"error": {...}}` with no `event:` line, mid-stream: the
# stream's end, as `{"type": "error", ...}` unnamed is, and rewritten into Anthropic's envelope.
OPENAI_UNNAMED = b"data: " + OPENAI_SERVER + b"\n\n"
OPENAI_REWRITTEN = error_event(
    json.dumps(
        envelope("api_error", "upstream native answered 502: server_error: boom"), separators=(",", ":")
    ).encode()
)


@pytest.mark.parametrize("line_ends", [lambda reads: reads, crlf], ids=["lf", "crlf"])
@pytest.mark.parametrize(
    "tail",
    [
        [OPENAI_UNNAMED],
        [OPENAI_UNNAMED[:8], OPENAI_UNNAMED[8:]],  # inside `"error"`
        [OPENAI_UNNAMED[:30], OPENAI_UNNAMED[30:]],  # inside its object
        [OPENAI_UNNAMED + b"data: [DONE]\n\n"],  # what a proxy adds after the end is dropped
        [OPENAI_UNNAMED.replace(b'{"error":{', b'{"error": {')],  # a space after the colon
    ],
    ids=["whole", "cut-in-name", "cut-in-object", "done-after", "spaced"],
)
def test_an_unnamed_openai_error_mid_stream_is_the_streams_end_in_anthropics_envelope(
    line_ends, tail: list[bytes]
) -> None:
    body, outcome, response = relay(line_ends([*BEFORE, *tail]))
    assert body.endswith(line_ends([b'"text":"hi"}}\n\n' + OPENAI_REWRITTEN])[0])
    assert body.count(b"error") == OPENAI_REWRITTEN.count(b"error") and b"[DONE]" not in body
    assert outcome.error_type == "api_error" and outcome.upstream_failed and response.released


def test_a_data_line_saying_error_later_in_its_object_is_no_end() -> None:
    # Only the data's first key: a content event with an "error" field further in is content.
    odd = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"},"error":{}}\n\n'
    body, _, _ = relay([START, BLOCK, odd, LLAMA])
    assert body.count(b"event: error") == 1 and body.endswith(REWRITTEN)
