"""Images, documents and server tools through the official SDK over a real socket."""

from __future__ import annotations

import base64

import anthropic
import pytest

from dragoman.translate import content
from tests.support.fakes import completion
from tests.support.samples import TINY_PNG, pdf_bytes

PNG = base64.b64encode(TINY_PNG).decode()
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}


def _models(vision: bool | None, server_tools: str | None = None) -> list[dict]:
    model: dict = {"name": "eyes", "upstream": "default", "upstream_model": "test-model"}
    if vision is not None:
        model["vision"] = vision
    if server_tools is not None:
        model["server_tools"] = server_tools
    return [model]


def _client(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)


def test_an_image_reaches_a_vision_model_as_a_data_url(make_gateway, upstream):
    gateway = make_gateway(models=_models(vision=True))
    upstream.json_reply(completion("a red dot"))
    content = [IMAGE, {"type": "text", "text": "What is this?"}]
    message = _client(gateway).messages.create(
        model="eyes", max_tokens=20, messages=[{"role": "user", "content": content}]
    )
    assert message.content[0].text == "a red dot"
    parts = upstream.requests[0]["messages"][0]["content"]
    assert parts[0] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    assert parts[1] == {"type": "text", "text": "What is this?"}


def test_the_image_of_a_content_document_reaches_a_vision_model(make_gateway, upstream):
    gateway = make_gateway(models=_models(vision=True))
    upstream.json_reply(completion("a scanned dot"))
    document = {
        "type": "document",
        "title": "Scan",
        "source": {"type": "content", "content": [{"type": "text", "text": "Page 1"}, IMAGE]},
    }
    message = _client(gateway).messages.create(
        model="eyes", max_tokens=20, messages=[{"role": "user", "content": [document]}]
    )
    assert message.content[0].text == "a scanned dot"
    parts = upstream.requests[0]["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "text", "image_url", "text"]
    assert parts[2]["image_url"]["url"] == f"data:image/png;base64,{PNG}"


def test_an_image_for_a_text_only_model_is_refused_before_inference(make_gateway, upstream):
    gateway = make_gateway(models=_models(vision=False))
    with pytest.raises(anthropic.BadRequestError) as caught:
        _client(gateway).messages.create(model="eyes", max_tokens=20, messages=[{"role": "user", "content": [IMAGE]}])
    assert "messages.0.content.0" in caught.value.body["error"]["message"]
    assert upstream.requests == []


def test_an_unsupported_media_type_names_the_field(make_gateway, upstream):
    gateway = make_gateway(models=_models(vision=True))
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": PNG}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        _client(gateway).messages.create(model="eyes", max_tokens=20, messages=[{"role": "user", "content": [bad]}])
    assert "messages.0.content.0.source.media_type" in caught.value.body["error"]["message"]


def test_image_data_that_is_no_image_is_refused_before_inference(make_gateway, upstream):
    gateway = make_gateway(models=_models(vision=True))
    text_as_image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(b"hello there").decode()},
    }
    with pytest.raises(anthropic.BadRequestError) as caught:
        _client(gateway).messages.create(
            model="eyes", max_tokens=20, messages=[{"role": "user", "content": [text_as_image]}]
        )
    assert caught.value.body["error"]["message"].startswith(
        "messages.0.content.0.source.data: not a JPEG, PNG, GIF or WebP image"
    )
    assert upstream.requests == []


def _png_of(chars: int) -> str:
    """Base64 of `chars` characters that starts as a PNG (the head is all the gateway sniffs)."""
    head = base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHD").decode()  # 15 bytes: no padding
    return head + "A" * (chars - len(head))


@pytest.mark.parametrize("stream", [False, True])
def test_image_data_that_is_not_base64_past_its_head_is_refused_before_inference(make_gateway, upstream, stream):
    gateway = make_gateway(models=_models(vision=True))
    data = _png_of(400_000)
    broken = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": data[:300_000] + "\n" + data[300_001:]},
    }
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            with _client(gateway).messages.stream(
                model="eyes", max_tokens=20, messages=[{"role": "user", "content": [broken]}]
            ) as events:
                events.get_final_message()
        else:
            _client(gateway).messages.create(
                model="eyes", max_tokens=20, messages=[{"role": "user", "content": [broken]}]
            )
    assert caught.value.status_code == 400
    assert caught.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "messages.0.content.0.source.data: invalid base64 data",
    }
    assert upstream.requests == []


def test_screenshots_past_what_is_checked_inline_are_checked_all_the_same(make_gateway, upstream, monkeypatch):
    """More than INLINE_IMAGE_CHARS of images: the request is translated in a thread, with the same checks."""
    monkeypatch.setattr(content, "INLINE_IMAGE_CHARS", 100_000)  # the fake upstream takes bodies up to 1 MiB
    gateway = make_gateway(models=_models(vision=True))
    data = _png_of(60_000)
    shot = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    broken = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": data[:-8] + "AA=A" + data[-4:]},
    }
    with pytest.raises(anthropic.BadRequestError) as caught:
        _client(gateway).messages.create(model="eyes", max_tokens=20, tools=TOOLS, messages=_tool_turns([shot, broken]))
    assert caught.value.body["error"]["message"] == "messages.2.content.0.content.1.source.data: invalid base64 data"
    assert upstream.requests == []

    upstream.json_reply(completion("two screenshots"))
    message = _client(gateway).messages.create(
        model="eyes", max_tokens=20, tools=TOOLS, messages=_tool_turns([shot, shot])
    )
    assert message.content[0].text == "two screenshots"
    assert len(upstream.requests) == 1


def test_a_png_labelled_jpeg_in_a_tool_result_reaches_the_model_as_png(make_gateway, upstream):
    gateway = make_gateway(models=_models(vision=True))
    upstream.json_reply(completion("a dot"))
    mislabelled = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": PNG}}
    _client(gateway).messages.create(model="eyes", max_tokens=20, tools=TOOLS, messages=_tool_turns([mislabelled]))
    urls = [part["image_url"]["url"] for message in upstream.requests[0]["messages"] if isinstance(message.get("content"), list)
            for part in message["content"] if part.get("type") == "image_url"]  # fmt: skip
    assert urls == [f"data:image/png;base64,{PNG}"]


def _tool_turns(result_content: list) -> list[dict]:
    return [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_shot", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_shot", "content": result_content}]},
    ]


TOOLS = [
    {"name": "screenshot", "description": "Take a screenshot.", "input_schema": {"type": "object", "properties": {}}}
]


def test_images_in_tool_results_follow_the_tool_messages_labelled(make_gateway, upstream):
    gateway = make_gateway(models=_models(vision=True))
    upstream.json_reply(completion("I see a dot"))
    turns = _tool_turns([{"type": "text", "text": "captured"}, IMAGE])
    _client(gateway).messages.create(model="eyes", max_tokens=20, tools=TOOLS, messages=turns)
    sent = upstream.requests[0]["messages"]
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_shot", "content": "captured"}
    follow = sent[3]
    assert follow["role"] == "user"
    assert any(p.get("text") == "[image from tool result toolu_shot]" for p in follow["content"])
    assert any(p["type"] == "image_url" for p in follow["content"])


def test_images_in_tool_results_for_a_text_only_model_become_a_placeholder(make_gateway, upstream):
    gateway = make_gateway(models=_models(vision=False))
    upstream.json_reply(completion("ok"))
    _client(gateway).messages.create(model="eyes", max_tokens=20, tools=TOOLS, messages=_tool_turns([IMAGE]))
    tool_message = upstream.requests[0]["messages"][2]
    assert tool_message["role"] == "tool" and "[Image omitted" in tool_message["content"]
    assert all(m["role"] != "user" or isinstance(m["content"], str) for m in upstream.requests[0]["messages"])


def test_a_pdf_document_reaches_the_model_as_text(client, upstream):
    upstream.json_reply(completion("It says hello."))
    document = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(pdf_bytes("Quarterly revenue rose")).decode()},
                "title": "Report", "context": "From finance"}  # fmt: skip
    client.messages.create(
        model="test-model",
        max_tokens=20,
        messages=[{"role": "user", "content": [document, {"type": "text", "text": "Summarise"}]}],
    )
    sent = upstream.requests[0]["messages"][0]["content"]
    assert "Quarterly revenue rose" in sent and 'title="Report"' in sent and "From finance" in sent


def test_server_tools_are_refused_by_default_and_dropped_per_model(make_gateway, upstream):
    strict = make_gateway()
    with pytest.raises(anthropic.BadRequestError) as caught:
        _client(strict).messages.create(
            model="test-model", max_tokens=20, tools=[WEB_SEARCH], messages=[{"role": "user", "content": "news?"}]
        )
    assert "web_search_20250305" in caught.value.body["error"]["message"]
    lenient = make_gateway(models=_models(vision=None, server_tools="drop"))
    upstream.json_reply(completion("no search here"))
    message = _client(lenient).messages.create(
        model="eyes", max_tokens=20, tools=[WEB_SEARCH], messages=[{"role": "user", "content": "news?"}]
    )
    assert message.content[0].text == "no search here"
    assert "tools" not in upstream.requests[-1]
