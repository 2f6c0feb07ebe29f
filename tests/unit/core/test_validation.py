"""Decoding client bodies: a malformed request is a 400 naming the field the way
Anthropic does (`messages.0.content.1.source.type: ...`); unknown fields pass."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dragoman.core.errors import InvalidRequest
from dragoman.core.validation import decode_request
from dragoman.protocol import anthropic as a
from tests.support.helpers import translate


def body(**fields: Any) -> bytes:
    return json.dumps(
        {"model": "claude-test", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **fields}
    ).encode()


def with_content(*blocks: Any) -> bytes:
    return body(messages=[{"role": "user", "content": list(blocks)}])


def rejected(raw: bytes, decoder: Any = a.MESSAGES_REQUEST) -> str:
    with pytest.raises(InvalidRequest) as caught:
        decode_request(raw, decoder)
    assert caught.value.status == 400 and caught.value.type == "invalid_request_error"
    return caught.value.message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"model": "m", ', "the request body is not valid JSON"),
        (b"", "the request body is not valid JSON"),
        (b"[]", "Expected `object`, got `array`"),
        (json.dumps({"model": "m", "max_tokens": 1}).encode(), "messages: Field required"),
        (json.dumps({"messages": [], "max_tokens": 1}).encode(), "model: Field required"),
        (body(max_tokens="many"), "max_tokens: Expected `int`, got `str`"),
        (body(temperature="hot"), "temperature: Expected `float | null`, got `str`"),
        (body(messages=[{"content": "hi"}]), "messages.0.role: Field required"),
        (body(messages=[{"role": "user"}]), "messages.0.content: Field required"),
        (body(messages=[{"role": "user", "content": 5}]), "messages.0.content: Expected `str | array`, got `int`"),
        (
            with_content({"type": "text", "text": "a"}, {"type": "video", "url": "x"}),
            "messages.0.content.1.type: unsupported type 'video'",
        ),
        (with_content({"type": "text"}), "messages.0.content.0.text: Field required"),
        (with_content({"text": "no type"}), "messages.0.content.0.type: Field required"),
        (
            with_content({"type": "image", "source": {"type": "blob", "data": "x"}}),
            "messages.0.content.0.source.type: unsupported type 'blob'",
        ),
        (
            with_content({"type": "image", "source": {"type": "base64", "data": "x"}}),
            "messages.0.content.0.source.media_type: Field required",
        ),
        (
            with_content({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "audio"}]}),
            "messages.0.content.0.content.0.type: unsupported type 'audio'",
        ),  # fmt: skip
        (body(tools=[{"input_schema": {}}]), "tools.0.name: Field required"),
        (body(tool_choice={"type": "sometimes"}), "tool_choice.type: Invalid enum value 'sometimes'"),
        (
            body(thinking={"type": "enabled", "budget_tokens": "lots"}),
            "thinking.budget_tokens: Expected `int | null`, got `str`",
        ),
        (body(stop_sequences="END"), "stop_sequences: Expected `array | null`, got `str`"),
    ],
)
def test_errors_name_the_field(raw: bytes, expected: str) -> None:
    assert rejected(raw).startswith(expected)


def test_unknown_fields_are_ignored() -> None:
    raw = body(
        messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "1h", "scope": "global"}, "citations": None},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}, "cache_control": {"type": "ephemeral"}},
            ]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}, "caller": {"type": "direct"}}]},
        ],
        tools=[{"name": "f", "input_schema": {"type": "object"}, "defer_loading": True, "input_examples": [{}], "eager_input_streaming": True}],
        diagnostics={"cache": True},
        context_management={"edits": []},
        container="c1",
        inference_geo="us",
        service_tier="auto",
        anthropic_beta_field=True,
    )  # fmt: skip
    request = decode_request(raw, a.MESSAGES_REQUEST)
    assert isinstance(request.messages[0].content, list) and len(request.messages[0].content) == 2
    assert request.tools and request.tools[0].name == "f"


def test_echoed_response_blocks_are_accepted() -> None:
    """Clients send the assistant's previous content back verbatim."""
    raw = body(messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "dragoman-unsigned"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "answer", "citations": None},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "ok"}], "is_error": False}]},
    ])  # fmt: skip
    request = decode_request(raw, a.MESSAGES_REQUEST)
    assert [type(b).__name__ for b in request.messages[1].content] == [
        "ThinkingBlock",
        "RedactedThinkingBlock",
        "TextBlock",
        "ToolUseBlock",
    ]


def test_count_tokens_request() -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "s"}).encode()
    assert decode_request(raw, a.COUNT_TOKENS_REQUEST).system == "s"
    assert rejected(json.dumps({"model": "m"}).encode(), a.COUNT_TOKENS_REQUEST) == "messages: Field required"


def test_a_passed_through_envelope_names_a_bad_field_and_keeps_the_rest_undecoded() -> None:
    """The envelope is all the core reads of a passed-through body: the fields it reads are
    checked there (named in the 400), the prompt's parts are kept as they came."""
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "system": "s"}
    envelope = decode_request(json.dumps(body).encode(), a.ENVELOPE)
    assert envelope.max_tokens == 64
    assert [bytes(m) for m in envelope.messages] == [b'{"role": "user", "content": "hi"}']
    assert bytes(envelope.system) == b'"s"'
    assert "max_tokens" in rejected(json.dumps({**body, "max_tokens": "64"}).encode(), a.ENVELOPE)
    assert "messages" in rejected(json.dumps({**body, "messages": "hi"}).encode(), a.ENVELOPE)


def test_hostile_nesting_is_a_400_not_a_crash():
    import pytest

    from dragoman.core.errors import InvalidRequest
    from dragoman.core.validation import decode_request
    from dragoman.protocol import anthropic

    deep = b'{"model":"m","max_tokens":1,"messages":[],"x":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    for decoder in (anthropic.ENVELOPE, anthropic.MESSAGES_REQUEST):
        with pytest.raises(InvalidRequest, match="nested too deeply"):
            decode_request(deep, decoder)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ("not an object", 'tools.0.input_schema: Expected `object`, got `"not an object"`'),
        ([1], "tools.0.input_schema: Expected `object`, got `[1]`"),
        (None, "tools.0.input_schema: Field required"),
    ],
)
def test_a_tool_schema_that_is_not_an_object_is_refused_when_translated(schema: Any, expected: str) -> None:
    # Schemas stay raw JSON through decoding (they are forwarded as sent), so the
    # translator is where a schema that is not an object is refused.
    with pytest.raises(InvalidRequest) as caught:
        translate(messages=[{"role": "user", "content": "hi"}], tools=[{"name": "f", "input_schema": schema}])
    assert caught.value.message == expected


def test_a_tool_without_a_schema_is_refused_when_translated() -> None:
    with pytest.raises(InvalidRequest) as caught:
        translate(messages=[{"role": "user", "content": "hi"}], tools=[{"name": "f"}])
    assert caught.value.message == "tools.0.input_schema: Field required"


@pytest.mark.parametrize(
    ("text", "named"),
    [(rb"\ud800", rb"\ud800"), (rb"\ud83d\ude00 then \udbff!", rb"\udbff")],
    ids=["alone", "after-a-pair"],
)
def test_half_a_surrogate_pair_is_named_not_called_truncated(text: bytes, named: bytes) -> None:
    from dragoman.core.errors import InvalidRequest
    from dragoman.core.validation import decode_request
    from dragoman.protocol import anthropic

    body = b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"' + text + b'"}]}'
    with pytest.raises(InvalidRequest) as caught:
        decode_request(body, anthropic.MESSAGES_REQUEST)
    assert named.decode() in caught.value.message and "half a surrogate pair" in caught.value.message
