"""Runs of text tokens in one read (`TokenTemplate.run`), their strings copied as the upstream
wrote them into one text delta: what a client reads (the events, a block's text deltas in a row
joined; the message the SDK folds) is what decoding every chunk whole gives, however the
stream is cut into reads and whatever its strings hold."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dragoman.backends.openai import tokens
from dragoman.backends.openai.tokens import TokenTemplate
from dragoman.protocol import openai
from dragoman.protocol.sse import text_delta, text_delta_written
from tests.support.translated import client_bytes, client_events, sdk_message, text_joined
from tests.unit.backends.test_stream_tokens import VLLM

# JSON strings as servers write them: the encoder's own escapes (copied as they are) and
# others (`\u` escapes, `\/`: decoded and written again), raw UTF-8 of every width.
WRITTEN = [
    b'"Hello"', b'" world"', b'"tab\\there"', b'"\\"quoted\\""', b'"back\\\\slash"', b'"\\\\"',
    b'"\\b\\f\\r\\n"', b'"\\u00e9t\\u00e9"', b'"a\\/b"', b'"\\u0001"', b'"\\ud83d\\ude00"',
    '"é ü 漢 😀"'.encode(), b'"\xe2\x80\xa8"', b'"\x7f"', b'"\\\\n"', b'"}}\\n\\ndata: x"',
]  # fmt: skip
# Strings no chunk may hold (the stream fails as it would without runs), and an empty text.
BROKEN = [b'"raw\x01control"', b'"\xff\xfe"', b'"\xe2\x82"', b'"\\x"', b'"\\u12"', b'"a"b"', b'"new\nline"']
EMPTY = b'""'
ROLE = b'{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
REASONING = b'{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}'
TOOL = (
    b'{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function",'
    b'"function":{"name":"f","arguments":"{}"}}]}}]}'
)
FINISH = b'{"id":"chatcmpl-1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
USAGE = b'{"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}'


def event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def token(written: bytes) -> bytes:
    return event(VLLM % written)


def stream(*middle: bytes, end: tuple[bytes, ...] = (FINISH, USAGE)) -> list[bytes]:
    """A stream's events: a role chunk and a first token, `middle`, and its end."""
    return [event(ROLE), token(b'"First"'), *middle, *(event(p) for p in end), b"data: [DONE]\n\n"]


TEXTS = [token(w) for w in WRITTEN]
STREAMS = {
    "texts": stream(*TEXTS * 3),
    "texts then reasoning and a tool call": stream(*TEXTS, event(REASONING), *TEXTS[:4], event(TOOL), *TEXTS[:3]),
    "an empty text among them": stream(*TEXTS[:3], token(EMPTY), *TEXTS[3:6]),
    "usage in every chunk": stream(*(event(VLLM.replace(b"]}", b'],"usage":null}') % w) for w in WRITTEN)),
    "a chunk of another shape among them": stream(
        *TEXTS[:5], event((VLLM % b'"x"').replace(b'"created":1', b'"created":2')), *TEXTS[5:]
    ),  # fmt: skip
    "a comment line among them": stream(*TEXTS[:5], b": keep-alive\n\n", *TEXTS[5:]),
    "CRLF line ends": [e.replace(b"\n", b"\r\n") for e in stream(*TEXTS)],
    **{f"broken {b!r}": stream(*TEXTS[:4], token(b), *TEXTS[4:]) for b in BROKEN},
}


def reads_of(events: list[bytes], framing: str) -> list[bytes]:
    data = b"".join(events)
    if framing == "one read":
        return [data]
    if framing.startswith("every"):  # cut anywhere: inside events, lines and strings
        size = int(framing.split()[1])
        return [data[i : i + size] for i in range(0, len(data), size)]
    per = int(framing.split()[0])
    return [b"".join(events[i : i + per]) for i in range(0, len(events), per)]


@pytest.mark.parametrize("framing", ["one read", "2 events", "3 events", "7 events", "every 61", "every 500"])
@pytest.mark.parametrize("direct", [False, True], ids=["yielded", "direct"])
@pytest.mark.parametrize("options", [{}, {"stop_sequences": ["zzz"]}], ids=["plain", "stop-sequences"])
def test_a_stream_read_in_runs_reaches_the_client_as_it_does_decoded_chunk_by_chunk(monkeypatch, framing, direct,
                                                                                     options):  # fmt: skip
    copied = 0
    run = TokenTemplate.run

    def counted(self: TokenTemplate, data: bytes) -> Any:
        nonlocal copied
        found = run(self, data)
        copied += 0 if found is None else found[1]
        return found

    monkeypatch.setattr(TokenTemplate, "run", counted)
    fewer = 0
    for name, events in STREAMS.items():
        reads = reads_of(events, framing)
        with_runs, rest = client_events(client_bytes(reads, options, direct))
        monkeypatch.setattr(tokens, "LEARN_TRIES", 0)
        without, rest_without = client_events(client_bytes(reads, options, direct))
        monkeypatch.setattr(tokens, "LEARN_TRIES", 16)
        assert (text_joined(with_runs), rest) == (text_joined(without), rest_without), name
        assert sdk_message(with_runs) == sdk_message(without), name
        deltas = [e["delta"] for e in with_runs if e["type"] == "content_block_delta"]
        assert all(d["text"] for d in deltas if d["type"] == "text_delta"), name  # no empty delta
        fewer += len(without) - len(with_runs)
    if options:
        assert copied == fewer == 0  # a stop sequence is watched over the text: tokens go one by one
    elif framing != "every 61":  # (reads of 61 bytes hold no whole token)
        assert copied > 50
        assert fewer > 0  # a run's tokens go in one delta


def learnt() -> TokenTemplate:
    template = TokenTemplate()
    payload = VLLM % b'"Hello"'
    template.learn(payload, openai.CHAT_CHUNK.decode(payload))
    return template


def test_a_run_is_its_texts_joined_as_written_up_to_the_last_whole_token():
    copied = [w for w in WRITTEN if b"\\u" not in w and b"\\/" not in w]  # the encoder's own escapes only
    joined = b'"' + b"".join(w[1:-1] for w in copied) + b'"'
    whole = b"".join(token(w) for w in copied)
    assert learnt().run(whole + token(b'"cut"')[:-3]) == (joined, len(copied), len(whole))
    assert learnt().run(whole + event(FINISH)) == (joined, len(copied), len(whole))
    rest = token(b'"\\u00e9"') + token(EMPTY)  # written otherwise: decoded and written again; no text: no token
    assert learnt().run(whole + rest) == (joined[:-1] + 'é"'.encode(), len(copied) + 1, len(whole + rest))
    text = "".join(openai.CHAT_CHUNK.decode(VLLM % w).choices[0].delta.content or "" for w in WRITTEN)
    found = learnt().run(b"".join(token(w) for w in WRITTEN))
    assert found is not None and msgspec.json.decode(found[0]) == text and found[1] == len(WRITTEN)


@pytest.mark.parametrize(
    "data",
    [
        token(EMPTY),
        event(ROLE) + token(b'"a"'),  # it must begin with a token
        token(b'"a"') + event(FINISH) + token(b'"b"'),  # another event between
        token(b'"a"').replace(b"data: ", b"data:"),
        token(b'"a"')[:-1],  # no whole token
        token(b'"a"') + b"\n" + token(b'"b"'),
        *(token(b'"a"') + token(b) for b in BROKEN),
    ],
)
def test_a_read_that_is_no_run_of_tokens_written_as_the_encoder_does_is_none(data):
    assert learnt().run(data) is None


def test_nothing_is_a_run_before_a_template_is_learnt():
    assert TokenTemplate().run(token(b'"a"')) is None


def test_a_frame_made_from_a_string_is_the_text_delta():
    for index, text in ((0, "a"), (2, 'ab"\n é'), (40, "x" * 5)):
        assert text_delta_written(index, openai.ENCODER.encode(text)) == text_delta(index, text)


def test_a_raw_nul_between_strings_is_no_run():
    """NULs join the strings while they are checked: one the upstream wrote is no JSON."""
    for string in (b'"a"\x00"b"', b'"a\\n"\x00"b"'):
        assert learnt().run(token(b'"x"') + token(string)) is None
