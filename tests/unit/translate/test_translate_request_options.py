"""Anthropic MessagesRequest -> OpenAI ChatRequest, checked on the JSON body the
backend receives: tool definitions and tool_choice, sampling and other options, validation,
and image and document content."""

from __future__ import annotations

import base64
import time
from dataclasses import replace
from typing import Any

import pytest

from dragoman.core.capabilities import ModelCaps
from dragoman.core.errors import NotFound
from dragoman.core.profiles import PROFILES
from dragoman.translate.request import Options
from dragoman.translate.tool_defs import MAX_TOOL_NAME
from tests.support.helpers import assistant, image, text, tool_result, tool_use, translate, user, wire
from tests.support.samples import pdf_bytes
from tests.support.translate_request_scaffold import TOOL, body, error, messages


@pytest.mark.parametrize(
    ("choice", "expected_choice", "expected_parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, None),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        (
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            {"type": "function", "function": {"name": "get_weather"}},
            False,
        ),
        ({"type": "auto", "disable_parallel_tool_use": False}, "auto", None),
    ],
)
def test_tool_choice(choice: dict, expected_choice: Any, expected_parallel: bool | None) -> None:
    sent = body(tools=[TOOL], tool_choice=choice, messages=[user("q")])
    assert sent["tool_choice"] == expected_choice
    assert sent.get("parallel_tool_calls") == expected_parallel


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "unknown_tool"}, {"type": "tool"}])
def test_tool_choice_must_name_an_offered_tool(choice: dict) -> None:
    assert error(tools=[TOOL], tool_choice=choice, messages=[user("q")]).startswith("tool_choice.name")


def test_custom_tool_is_sent_as_a_function() -> None:
    sent = body(tools=[{**TOOL, "strict": True}], messages=[user("q")])
    assert sent["tools"][0]["function"] == {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": TOOL["input_schema"],
        "strict": True,
    }


def test_custom_tool_needs_an_input_schema() -> None:
    assert error(tools=[{"name": "f"}], messages=[user("q")]) == "tools.0.input_schema: Field required"


def test_long_tool_names_are_shortened_reversibly() -> None:
    long_a = "mcp__github__" + "create_or_update_pull_request_review_comment_" * 2
    long_b = long_a + "_v2"
    translated = translate(
        tools=[{**TOOL, "name": long_a}, {**TOOL, "name": long_b}, TOOL],
        tool_choice={"type": "tool", "name": long_b},
        messages=[user("q"), assistant([tool_use("toolu_1", long_a)]), user([tool_result("toolu_1")])],
    )
    sent = wire(translated.chat)
    names = [t["function"]["name"] for t in sent["tools"]]
    assert all(len(n) <= MAX_TOOL_NAME for n in names)
    assert len(set(names)) == 3 and names[2] == "get_weather"
    # the history and the choice use the same short names, and the table maps them back
    assert sent["messages"][1]["tool_calls"][0]["function"]["name"] == names[0]
    assert sent["tool_choice"]["function"]["name"] == names[1]
    assert translated.tool_names == {names[0]: long_a, names[1]: long_b}
    # deterministic: the same long name always gets the same short one (prompt caching)
    again = translate(tools=[{**TOOL, "name": long_a}], messages=[user("q")])
    assert wire(again.chat)["tools"][0]["function"]["name"] == names[0]


def test_short_names_are_untouched_and_unmapped() -> None:
    name = "a" * MAX_TOOL_NAME
    translated = translate(tools=[{**TOOL, "name": name}], messages=[user("q")])
    assert wire(translated.chat)["tools"][0]["function"]["name"] == name
    assert translated.tool_names == {}


@pytest.mark.parametrize(
    ("tool", "required_property", "enum_check"),
    [
        ({"type": "bash_20250124", "name": "bash"}, "command", None),
        (
            {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
            "command",
            ("command", {"view", "create", "str_replace", "insert"}),
        ),
        (
            {"type": "text_editor_20250124", "name": "str_replace_editor"},
            "command",
            ("command", {"view", "create", "str_replace", "insert", "undo_edit"}),
        ),
        (
            {"type": "computer_20250124", "name": "computer", "display_width_px": 1280, "display_height_px": 800},
            "action",
            None,
        ),
        (
            {"type": "memory_20250818", "name": "memory"},
            "command",
            ("command", {"view", "create", "str_replace", "insert", "delete", "rename"}),
        ),
    ],
    ids=["bash", "editor-20250728", "editor-20250124", "computer", "memory"],
)
def test_anthropic_defined_tools_get_schemas(tool: dict, required_property: str, enum_check: Any) -> None:
    function = body(tools=[tool], messages=[user("q")])["tools"][0]["function"]
    assert function["name"] == tool["name"] and function.get("description")
    schema = function["parameters"]
    assert schema["type"] == "object" and required_property in schema["properties"]
    if enum_check:
        key, values = enum_check
        assert set(schema["properties"][key]["enum"]) == values


def test_computer_tool_schema_mentions_the_screen_size() -> None:
    tool = {"type": "computer_20250124", "name": "computer", "display_width_px": 1280, "display_height_px": 800}
    schema = body(tools=[tool], messages=[user("q")])["tools"][0]["function"]["parameters"]
    assert "1280x800" in schema["properties"]["action"]["description"]
    assert {"triple_click", "scroll", "wait"} <= set(schema["properties"]["action"]["enum"])


def test_memory_tool_insert_uses_insert_text() -> None:
    schema = body(tools=[{"type": "memory_20250818", "name": "memory"}], messages=[user("q")])["tools"][0]["function"][
        "parameters"
    ]
    assert {"insert_text", "old_path", "new_path"} <= set(schema["properties"])


@pytest.mark.parametrize("kind", ["bash_20990101", "text_editor_20990101", "computer_20990101"])
def test_unknown_version_of_a_defined_tool_is_named(kind: str) -> None:
    message = error(tools=[{"type": kind, "name": "x"}], messages=[user("q")])
    assert message.startswith("tools.0.type:") and kind in message
    assert "Known versions:" in message


@pytest.mark.parametrize("kind", ["web_search_20250305", "web_fetch_20250910", "code_execution_20250825"])
def test_server_tools_are_rejected_by_name(kind: str) -> None:
    message = error(tools=[TOOL, {"type": kind, "name": kind.rsplit("_", 1)[0]}], messages=[user("q")])
    assert message.startswith("tools.1") and kind in message


def test_server_tools_are_dropped_with_the_option() -> None:
    sent = body(
        options=Options(clock=time.monotonic, drop_server_tools=True),
        tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}, TOOL],
        messages=[user("q")],
    )
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather"]


SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "url": {"type": "string", "format": "uri"},
        "tags": {"type": "array", "items": {"type": "string", "format": "email"}},
    },
    "additionalProperties": False,
}


def test_schema_keys_are_kept_by_default() -> None:
    for profile in ("vllm", "llamacpp", "ollama", "openai"):
        sent = body(profile=profile, tools=[{"name": "f", "input_schema": SCHEMA}], messages=[user("q")])
        assert sent["tools"][0]["function"]["parameters"] == SCHEMA


def test_schema_keys_are_stripped_when_the_profile_says_so() -> None:
    profile = replace(PROFILES["llamacpp"], strip_schema_keys=("$schema", "format"))
    sent = body(profile=profile, tools=[{"name": "f", "input_schema": SCHEMA}], messages=[user("q")])
    assert sent["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"url": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "additionalProperties": False,
    }


@pytest.mark.parametrize("where", ["output_config", "output_format"])
def test_structured_output_becomes_response_format(where: str) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "schema": schema}
    fields = {"output_config": {"format": fmt}} if where == "output_config" else {"output_format": fmt}
    sent = body(messages=[user("q")], **fields)
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


@pytest.mark.parametrize(
    ("profile", "flags"),
    [
        ("vllm", {"continue_final_message": True, "add_generation_prompt": False}),
        ("sglang", {"continue_final_message": True, "add_generation_prompt": False}),
        ("llamacpp", {}),
        ("ollama", {}),
    ],
)
def test_prefill_continues_the_final_assistant_turn(profile: str, flags: dict) -> None:
    translated = translate(profile=profile, messages=[user("Give me JSON"), assistant('{"answer":')])
    sent = wire(translated.chat)
    assert sent["messages"][-1] == {"role": "assistant", "content": '{"answer":'}
    assert {k: sent[k] for k in ("continue_final_message", "add_generation_prompt") if k in sent} == flags
    assert translated.prefill == '{"answer":'


def test_no_prefill_flags_without_a_trailing_assistant_turn() -> None:
    sent = body(profile="vllm", messages=[user("q"), assistant("a"), user("b")])
    assert "continue_final_message" not in sent and "add_generation_prompt" not in sent


def test_final_assistant_turn_cannot_end_with_tool_use() -> None:
    assert error(messages=[user("q"), assistant([tool_use("toolu_1")])]).startswith("messages.1")


@pytest.mark.parametrize(
    ("profile", "top_k", "user_field"),
    [("openai", None, "user-123"), ("vllm", 40, None), ("llamacpp", 40, None), ("ollama", 40, None)],
)
def test_sampling_fields_per_profile(profile: str, top_k: int | None, user_field: str | None) -> None:
    sent = body(
        profile=profile, messages=[user("q")], temperature=0.2, top_p=0.9, top_k=40, metadata={"user_id": "user-123"}
    )
    assert sent["temperature"] == 0.2 and sent["top_p"] == 0.9
    assert sent.get("top_k") == top_k
    assert sent.get("user") == user_field


def test_max_tokens_and_model_are_sent() -> None:
    sent = body(messages=[user("q")], max_tokens=1234)
    assert sent["model"] == "served-model"
    assert sent.get("max_tokens", sent.get("max_completion_tokens")) == 1234


def test_stop_sequences_are_kept_for_the_gateway_to_match() -> None:
    translated = translate(messages=[user("q")], stop_sequences=["\n\nHuman:", "END"])
    assert translated.stop_sequences == ["\n\nHuman:", "END"]


def test_unknown_request_fields_are_ignored() -> None:
    sent = body(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            }
        ],
        cache_control={"type": "ephemeral"},
        context_management={"edits": []},
        service_tier="auto",
    )
    assert sent["messages"] == [{"role": "user", "content": "q"}]


@pytest.mark.parametrize(
    ("fields", "prefix"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [user("q")], "max_tokens": -5}, "max_tokens"),
        ({"messages": [user("q")], "temperature": 1.5}, "temperature"),
        ({"messages": [user("q")], "temperature": -0.1}, "temperature"),
        ({"messages": [user("q")], "top_p": 1.2}, "top_p"),
        ({"messages": [user("q")], "top_k": -1}, "top_k"),
        ({"messages": [user("q")], "stop_sequences": ["ok", ""]}, "stop_sequences.1"),
        ({"messages": [{"role": "system", "content": "only a system prompt"}]}, "messages"),
    ],
)
def test_invalid_requests_name_the_field(fields: dict, prefix: str) -> None:
    assert error(**fields).startswith(prefix)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_temperature_bounds_are_inclusive(temperature: float) -> None:
    assert body(messages=[user("q")], temperature=temperature)["temperature"] == temperature


IMAGE_HEADS = {  # the first bytes of each supported format, base64
    "image/jpeg": base64.b64encode(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00").decode(),
    "image/png": base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR").decode(),
    "image/gif": base64.b64encode(b"GIF89a\x01\x00\x01\x00\x80\x00").decode(),
    "image/webp": base64.b64encode(b"RIFF\x24\x00\x00\x00WEBPVP8 ").decode(),
}


@pytest.mark.parametrize("media_type", ["image/jpeg", "image/png", "image/gif", "image/webp"])
def test_supported_image_media_types(media_type: str) -> None:
    data = IMAGE_HEADS[media_type]
    sent = messages(messages=[user([image(media_type, data), text("describe")])])
    assert sent[0]["content"][0] == {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}
    assert sent[0]["content"][1] == {"type": "text", "text": "describe"}


@pytest.mark.parametrize(
    ("declared", "actual"), [("image/png", "image/jpeg"), ("image/jpeg", "image/png"), ("image/gif", "image/webp")]
)
def test_a_mislabelled_image_is_sent_with_the_type_its_bytes_show(declared: str, actual: str) -> None:
    data = IMAGE_HEADS[actual]
    sent = messages(messages=[user([image(declared, data)])])
    assert sent[0]["content"][0]["image_url"]["url"] == f"data:{actual};base64,{data}"


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        ("%%% not base64 at all %%%", "invalid base64 data"),
        (IMAGE_HEADS["image/png"] + "AAAA" * 50_000 + "AA%A" + "AAAA", "invalid base64 data"),  # the head is fine
        (IMAGE_HEADS["image/png"] + "AAAA\nAAAA", "invalid base64 data"),
        (IMAGE_HEADS["image/png"][:-1], "invalid base64 data"),  # padding cut off
        (base64.b64encode(b"just some text, not an image").decode(), "not a JPEG, PNG, GIF or WebP image"),
        ("", "not a JPEG, PNG, GIF or WebP image"),
        ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==", "without a 'data:' URL prefix"),
    ],
    ids=["bad-base64", "bad-past-the-head", "line-break", "unpadded", "not-an-image", "empty", "data-url"],
)
def test_image_data_that_is_no_image_is_rejected_naming_the_field(data: str, complaint: str) -> None:
    message = error(messages=[user([text("look"), image("image/png", data)])])
    assert message.startswith("messages.0.content.1.source.data") and complaint in message


def test_a_tool_results_image_with_bad_base64_is_rejected_naming_it() -> None:
    screenshot = image("image/png", IMAGE_HEADS["image/png"] + "AAAA" * 1000 + "AAA=" + "AAAA")  # padding inside
    message = error(messages=[user("q"), assistant([tool_use("toolu_shot", "computer", {})]),
                              user([tool_result("toolu_shot", [text("Screenshot taken."), screenshot])])])  # fmt: skip
    assert message == "messages.2.content.0.content.1.source.data: invalid base64 data"


def test_a_pdf_with_bad_base64_is_rejected_naming_it() -> None:
    data = base64.b64encode(pdf_bytes("hello")).decode()
    document = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": data[:-8] + "!!!!" + data[-4:]},
    }
    assert error(messages=[user([document])]) == "messages.0.content.0.source.data: invalid base64 data"


@pytest.mark.parametrize("media_type", ["image/bmp", "image/svg+xml", "application/pdf", "text/plain"])
def test_unsupported_image_media_types_are_rejected(media_type: str) -> None:
    message = error(messages=[user([text("look"), image(media_type)])])
    assert message.startswith("messages.0.content.1.source.media_type") and media_type in message


def test_url_image_is_passed_as_url() -> None:
    block = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    assert messages(messages=[user([block])])[0]["content"] == [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    ]


@pytest.mark.parametrize(
    ("source", "expected_body"),
    [
        ({"type": "text", "media_type": "text/plain", "data": "The quick brown fox."}, "The quick brown fox."),
        ({"type": "content", "content": "Plain content."}, "Plain content."),
        ({"type": "content", "content": [text("Part one."), text("Part two.")]}, "Part one.\nPart two."),
        (
            {
                "type": "base64",
                "media_type": "application/pdf",
                "data": base64.b64encode(pdf_bytes("Quarterly revenue rose", "Costs fell")).decode(),
            },
            "[page 1]\nQuarterly revenue rose\n\n[page 2]\nCosts fell",
        ),
    ],
    ids=["text", "content-string", "content-blocks", "pdf"],
)
def test_documents_become_text_with_title_and_context(source: dict, expected_body: str) -> None:
    document = {"type": "document", "source": source, "title": "Report", "context": "Q3 figures"}
    sent = messages(messages=[user([document, text("Summarise it.")])])
    content = sent[0]["content"]
    assert isinstance(content, str) and content.endswith("\n\nSummarise it.")
    document_part = content[: -len("Summarise it.")]
    assert 'title="Report"' in document_part and "Q3 figures" in document_part
    assert expected_body in document_part


def content_document(*items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "document", "title": "Scan", "source": {"type": "content", "content": list(items)}}


def test_the_images_of_a_content_document_reach_the_model_in_their_places() -> None:
    sent = messages(
        messages=[user([content_document(text("Page one:"), image(), text("The end.")), text("Describe it.")])]
    )
    parts = sent[0]["content"]
    assert [p["type"] for p in parts] == ["text", "text", "image_url", "text", "text", "text"]
    assert 'title="Scan"' in parts[0]["text"] and parts[1]["text"] == "Page one:"
    assert parts[2]["image_url"]["url"] == "data:image/png;base64,iVBORw0KGgo="
    assert [p["text"] for p in parts[3:]] == ["The end.", "</document>", "Describe it."]


def test_a_content_document_with_an_image_for_a_model_without_vision_is_a_400_naming_it() -> None:
    message = error(caps=ModelCaps(vision=False), messages=[user([text("read"), content_document(image())])])
    assert message.startswith("messages.0.content.1.source.content") and "vision" in message


def test_a_bad_image_inside_a_content_document_is_a_400_naming_it() -> None:
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AAAA"}}
    message = error(messages=[user([content_document(text("x"), bad)])])
    assert message.startswith("messages.0.content.0.source.content.1.source.media_type")


def test_a_bad_document_in_a_tool_result_is_named_by_its_own_place() -> None:
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%% not base64"}}
    message = error(messages=[
        user("Scan it"),
        assistant([tool_use("toolu_scan", "scan", {})]),
        user([tool_result("toolu_scan", [text("one"), text("two"), content_document(text("x"), bad)])]),
    ])  # fmt: skip
    assert message.startswith("messages.2.content.0.content.2.source.content.1.source.data")


@pytest.mark.parametrize("vision", [None, False])
def test_the_images_of_a_content_document_a_tool_returned_follow_its_tool_message(vision: bool | None) -> None:
    sent = messages(
        caps=ModelCaps(vision=vision),
        messages=[
            user("Scan it"),
            assistant([tool_use("toolu_scan", "scan", {})]),
            user([tool_result("toolu_scan", [content_document(text("Scanned:"), image())])]),
        ],
    )
    tool_text = sent[2]["content"]
    assert sent[2]["role"] == "tool" and "Scanned:" in tool_text and 'title="Scan"' in tool_text
    if vision is False:
        assert "[Image omitted" in tool_text and len(sent) == 3
    else:
        images = [p for p in sent[3]["content"] if p["type"] == "image_url"]
        assert sent[3]["role"] == "user" and [p["image_url"]["url"] for p in images] == [
            "data:image/png;base64,iVBORw0KGgo="
        ]


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ({"type": "base64", "media_type": "application/pdf", "data": "%%% not base64 %%%"}, "source.data"),
        (
            {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(b"not a pdf at all").decode()},
            "source.data",
        ),
        ({"type": "base64", "media_type": "application/msword", "data": "AAAA"}, "source.media_type"),
        ({"type": "url", "url": "https://example.com/a.pdf"}, "source"),
    ],
    ids=["bad-base64", "not-a-pdf", "wrong-media-type", "url"],
)
def test_unreadable_documents_are_400s_naming_the_block(source: dict, fragment: str) -> None:
    message = error(messages=[user([text("read this"), {"type": "document", "source": source}])])
    assert message.startswith(f"messages.0.content.1.{fragment}")


@pytest.mark.parametrize("kind", ["document", "image"])
def test_a_file_source_left_for_the_translator_names_no_known_file(kind: str) -> None:
    """The gateway fills in every file it has before translating (dragoman.files.store): one
    still here names no file it has, a 404 naming the field."""
    with pytest.raises(NotFound, match=r"^messages\.0\.content\.1\.source\.file_id: no file 'file_123'"):
        messages(
            messages=[user([text("read this"), {"type": kind, "source": {"type": "file", "file_id": "file_123"}}])]
        )


def test_search_results_become_text() -> None:
    block = {
        "type": "search_result",
        "source": "https://docs.example.com/a",
        "title": "Install guide",
        "content": [text("Run make.")],
    }
    content = messages(messages=[user([block, text("How do I install?")])])[0]["content"]
    assert "https://docs.example.com/a" in content and "Install guide" in content and "Run make." in content
    assert content.endswith("How do I install?")
