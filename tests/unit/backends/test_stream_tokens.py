"""Text tokens read through a learnt template (`backends.openai.tokens`): what a client reads
(the events, a block's text deltas in a row joined; the message the SDK folds) is what
decoding every chunk whole gives, in every stream case; tokens read one at a time leave
byte for byte as they did."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from dragoman.backends.openai import tokens
from dragoman.backends.openai.tokens import TokenTemplate
from dragoman.protocol import anthropic as a
from dragoman.protocol import openai
from dragoman.protocol.sse import encode, text_delta
from tests.support.openai_shapes import chunk, usage_chunk
from tests.support.translated import client_bytes, client_events, sdk_message, text_joined
from tests.unit.translate.test_stream_cases import CASES
from tests.unit.translate.test_stream_cases_parallel import CASES as PARALLEL

VLLM = (
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":%s},"logprobs":null,"finish_reason":null}]}'
)


def payload(text: str) -> bytes:
    return VLLM % json.dumps(text).encode()


def learnt() -> TokenTemplate:
    template = TokenTemplate()
    template.learn(payload("Hello"), openai.CHAT_CHUNK.decode(payload("Hello")))
    return template


def test_a_token_of_the_same_shape_is_read_from_its_string_alone():
    template = learnt()
    for text in (" world", 'quote " and \\ backslash', "é ü 漢", "\n", "m"):
        assert template.text(payload(text)) == text
        assert template.read(b"data: " + payload(text) + b"\n\n") == text
    escaped = VLLM % b'"\\u00e9t\\u00e9"'  # a server that escapes what it need not
    assert template.text(escaped) == "été"


def test_anything_else_is_left_to_the_whole_decoding():
    template = learnt()
    assert template.text(payload("")) is None  # no text: not a token
    assert template.text(payload("a").replace(b'"created":1', b'"created":2')) is None
    assert template.text(VLLM % b'"a","role":"assistant"') is None  # not one string between
    assert template.text(VLLM % b"null") is None
    assert template.text(b"[DONE]") is None
    assert template.read(b"data: " + payload("a") + b"\n\ndata: " + payload("b") + b"\n\n") is None


@pytest.mark.parametrize(
    "body",
    [
        VLLM % b'"m"',  # the text is also the model's name: two places, no template
        VLLM.replace(b'"finish_reason":null', b'"finish_reason":"stop"') % b'"a"',
        b'{"choices":[{"delta":{"content":"a","tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}',
        b'{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}',
    ],
)
def test_no_template_is_learnt_from_a_chunk_that_is_not_a_plain_token(body):
    template = TokenTemplate()
    template.learn(body, openai.CHAT_CHUNK.decode(body))
    assert template.text(body) is None


def test_a_template_is_learnt_again_when_the_chunks_change_now_and_then():
    template, served = TokenTemplate(), 0
    for second in range(3 * tokens.LEARN_TRIES):  # a server that writes the time of each second
        for text in ("a", "b", "c"):
            body = payload(text).replace(b'"created":1', b'"created":%d' % second)
            if template.text(body) is None:
                template.learn(body, openai.CHAT_CHUNK.decode(body))
            else:
                served += 1
    assert served == 2 * 3 * tokens.LEARN_TRIES


def test_a_server_whose_chunks_all_differ_stops_being_learnt_from():
    template, learnt = TokenTemplate(), 0
    for n in range(4 * tokens.LEARN_TRIES):
        body = payload("a").replace(b'"created":1', b'"created":%d' % n)
        assert template.text(body) is None
        before = template._head
        template.learn(body, openai.CHAT_CHUNK.decode(body))
        learnt += template._head != before  # each chunk's head differs: a new one means it learnt
    assert learnt == tokens.LEARN_TRIES


def test_a_text_delta_made_directly_is_the_encoded_event():
    for index, text in ((0, "a"), (3, 'x"\n\u2028y'), (12, "")):
        assert text_delta(index, text) == encode(a.ContentBlockDelta(index=index, delta=a.TextDelta(text=text)))


WORDS = ["Hello", ",", " wor", "ld", " STOP", "é", ' "q"', "\n", " end"]
LONG = [
    (
        "text",
        [
            chunk({"role": "assistant", "content": ""}),
            *(chunk({"content": w}) for w in WORDS * 4),
            chunk(finish="stop"),
            usage_chunk(),
        ],
        {},
    ),  # fmt: skip
    (
        "a stop sequence",
        [chunk({"content": w}) for w in WORDS * 2] + [chunk(finish="stop")],
        {"stop_sequences": ["STOP"]},
    ),  # fmt: skip
    (
        "a prefill echoed",
        [chunk({"content": w}) for w in ["Sure", ":", *WORDS]] + [chunk(finish="stop")],
        {"prefill": "Sure:"},
    ),  # fmt: skip
    (
        "reasoning, text, a tool call",
        [
            chunk({"reasoning_content": "hm"}),
            *(chunk({"content": w}) for w in WORDS),
            chunk(
                {
                    "tool_calls": [
                        {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ]
                }
            ),
            chunk({"content": " after"}),
            chunk(finish="tool_calls"),
        ],
        {"surface_thinking": True},
    ),  # fmt: skip
]


def reads_of(chunks: list[dict[str, Any]], framing: str) -> list[bytes]:
    frames = [b"data: " + msgspec.json.encode(body) + b"\n\n" for body in chunks] + [b"data: [DONE]\n\n"]
    if framing == "burst":
        return [b"".join(frames)]
    if framing == "tight":
        return [frame.replace(b"data: ", b"data:", 1) for frame in frames]
    return frames


@pytest.mark.parametrize("framing", ["per-token", "burst", "tight"])
@pytest.mark.parametrize("direct", [False, True], ids=["yielded", "direct"])
def test_every_stream_case_reaches_the_client_as_it_did_without_the_template(monkeypatch, framing, direct):
    fast = 0
    text, read, run = TokenTemplate.text, TokenTemplate.read, TokenTemplate.run

    def counted(method: Any) -> Any:
        def call(self: TokenTemplate, data: bytes) -> Any:
            nonlocal fast
            found = method(self, data)
            fast += 0 if found is None else found[1] if isinstance(found, tuple) else 1
            return found

        return call

    monkeypatch.setattr(TokenTemplate, "text", counted(text))
    monkeypatch.setattr(TokenTemplate, "read", counted(read))
    monkeypatch.setattr(TokenTemplate, "run", counted(run))
    for name, chunks, options in [(c.id, c.chunks, c.options) for c in CASES + PARALLEL] + LONG:
        with_template = client_bytes(reads_of(chunks, framing), options, direct)
        monkeypatch.setattr(tokens, "LEARN_TRIES", 0)
        without = client_bytes(reads_of(chunks, framing), options, direct)
        monkeypatch.setattr(tokens, "LEARN_TRIES", 16)
        if framing == "burst":  # a run of tokens in one read goes in one text delta
            events, rest = client_events(with_template)
            events_without, rest_without = client_events(without)
            assert (text_joined(events), rest) == (text_joined(events_without), rest_without), name
            assert sdk_message(events) == sdk_message(events_without), name
        else:
            assert with_template == without, name
    assert fast > 40  # the template was used, not merely learnt (a run counts its tokens)
