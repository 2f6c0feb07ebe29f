"""Anthropic MessagesRequest -> OpenAI ChatRequest, checked on the JSON body the
backend receives: the system prompt, tool use and tool results. Tool definitions, options,
validation and content blocks: test_translate_request_options.py."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from dragoman.core.capabilities import ModelCaps
from dragoman.translate.request import Options
from dragoman.translate.tool_ids import tagged
from tests.support.helpers import assistant, image, text, tool_result, tool_use, translate, user, wire
from tests.support.translate_request_scaffold import TOOL, body, error, messages


def test_request_module_imports_alone() -> None:
    # Importing the translator first (as a script or a test module would) must work.
    result = subprocess.run([sys.executable, "-c", "import dragoman.translate.request"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-400:]


BILLING = "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli;"


@pytest.mark.parametrize(
    ("system", "options", "expected"),
    [
        ("Be brief.", None, "Be brief."),
        ([text("One."), text("Two.")], None, "One.\n\nTwo."),
        ([text(BILLING), text("You are Claude Code.")], None, "You are Claude Code."),
        (
            [text(BILLING), text("You are Claude Code.")],
            Options(clock=time.monotonic, keep_billing_header=True),
            f"{BILLING}\n\nYou are Claude Code.",
        ),
        # only a *first* block is the billing header
        ([text("You are Claude Code."), text(BILLING)], None, f"You are Claude Code.\n\n{BILLING}"),
    ],
    ids=["string", "blocks", "billing-dropped", "billing-kept", "billing-not-first"],
)
def test_system_prompt(system: Any, options: Options | None, expected: str) -> None:
    sent = messages(system=system, options=options, messages=[user("hi")])
    assert sent == [{"role": "system", "content": expected}, {"role": "user", "content": "hi"}]


def test_no_system_message_without_system() -> None:
    assert messages(messages=[user("hi")]) == [{"role": "user", "content": "hi"}]


def test_system_role_messages_fold_into_the_system_prompt() -> None:
    sent = messages(
        system="Base.",
        messages=[
            {"role": "system", "content": "Extra rule."},
            user("hi"),
            assistant("hello"),
            {"role": "system", "content": "Late note."},
            user("more"),
        ],
    )
    assert sent[0] == {"role": "system", "content": "Base.\n\nExtra rule."}
    # after the conversation started, a system message cannot move to the top: it is a user turn
    assert sent[1:] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "Late note.\n\nmore"},
    ]


@pytest.mark.parametrize("role", ["ctx", "msg"])
def test_claude_code_ctx_and_msg_roles_are_user_turns(role: str) -> None:
    sent = messages(messages=[{"role": role, "content": "context"}, user("question")])
    assert sent == [{"role": "user", "content": "context\n\nquestion"}]


@pytest.mark.parametrize(("position", "role"), [(0, "bot"), (1, "tool"), (2, "developer")])
def test_invalid_role_names_the_message(position: int, role: str) -> None:
    convo = [user("a"), assistant("b"), user("c")]
    convo[position] = {"role": role, "content": "x"}
    message = error(messages=convo)
    assert message.startswith(f"messages.{position}.role:") and repr(role) in message


def test_consecutive_same_role_turns_are_merged() -> None:
    sent = messages(
        messages=[user("one"), user([text("two"), text("three")]), assistant("a"), assistant("b"), user("four")]
    )
    assert sent == [
        {"role": "user", "content": "one\n\ntwo\n\nthree"},
        {"role": "assistant", "content": "ab"},
        {"role": "user", "content": "four"},
    ]


def test_mid_conversation_system_block_becomes_text() -> None:
    block = {"type": "mid_conv_system", "content": [text("Remember the rule.")]}
    assert messages(messages=[user([text("hi"), block])]) == [{"role": "user", "content": "hi\n\nRemember the rule."}]


def test_tool_use_becomes_tool_calls_with_ids_preserved() -> None:
    sent = messages(
        tools=[TOOL],
        messages=[
            user("Weather in Paris and Rome?"),
            assistant(
                [
                    text("Checking."),
                    tool_use("toolu_01A", input={"city": "Paris"}),
                    tool_use("toolu_01B", input={"city": "Rome"}),
                ]
            ),
            user([tool_result("toolu_01A", "sunny"), tool_result("toolu_01B", "rain")]),
        ],
    )
    call = sent[1]
    assert call["role"] == "assistant" and call["content"] == "Checking."
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in call["tool_calls"]] == [
        ("toolu_01A", "get_weather", '{"city":"Paris"}'),
        ("toolu_01B", "get_weather", '{"city":"Rome"}'),
    ]
    assert sent[2:] == [
        {"role": "tool", "tool_call_id": "toolu_01A", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_01B", "content": "rain"},
    ]


def test_the_replica_a_conversations_latest_tool_call_came_from_is_read_and_its_ids_go_back_untagged() -> None:
    """Routing reads where the turn before went from its tool ids (translate/tool_ids.py); the
    server sees its own ids."""
    older, latest = tagged("call_1", "aaaaaa"), tagged("call_2", "bbbbbb")
    turns = [
        user("Weather in Paris?"),
        assistant([tool_use(older, input={"city": "Paris"})]),
        user([tool_result(older, "sunny")]),
        assistant([text("And Rome."), tool_use(latest, input={"city": "Rome"})]),
        user([tool_result(latest, "rain")]),
    ]
    translated = translate(tools=[TOOL], messages=turns)
    assert translated.previous_replica == "bbbbbb"
    sent = wire(translated.chat)["messages"]
    assert [m["tool_calls"][0]["id"] for m in sent if m["role"] == "assistant"] == ["call_1", "call_2"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["call_1", "call_2"]
    assert translate(tools=[TOOL], messages=turns[:1]).previous_replica is None
    assert translate(tools=[TOOL], messages=[user("hi"), assistant([tool_use("call_9")]),
                                             user([tool_result("call_9", "x")])]).previous_replica is None  # fmt: skip


def test_tools_and_tool_calls_carry_type_function() -> None:
    sent = body(tools=[TOOL], messages=[user("q"), assistant([tool_use("toolu_1")]), user([tool_result("toolu_1")])])
    assert sent["tools"][0]["type"] == "function"
    assert sent["messages"][1]["tool_calls"][0]["type"] == "function"


def test_stream_asks_for_usage() -> None:
    sent = body(stream=True, messages=[user("q")])
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


def test_tool_results_come_in_order_before_the_users_text() -> None:
    sent = messages(
        messages=[
            user("q"),
            assistant([tool_use("toolu_1"), tool_use("toolu_2")]),
            user(
                [
                    text("Here you go."),
                    tool_result("toolu_2", "second"),
                    tool_result("toolu_1", [text("first"), text("more")]),
                ]
            ),
        ]
    )
    assert sent[2:] == [
        {"role": "tool", "tool_call_id": "toolu_2", "content": "second"},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "first\nmore"},
        {"role": "user", "content": "Here you go."},
    ]


@pytest.mark.parametrize(("content", "expected"), [("command not found", "command not found"), (None, ""), ("", "")])
def test_tool_result_is_error_is_carried(content: Any, expected: str) -> None:
    sent = messages(
        messages=[user("q"), assistant([tool_use("toolu_1")]), user([tool_result("toolu_1", content, is_error=True)])]
    )
    tool = sent[2]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "toolu_1"
    assert "error" in tool["content"].lower() and tool["content"].endswith(expected)


def test_tool_result_without_is_error_is_not_marked() -> None:
    sent = messages(messages=[user("q"), assistant([tool_use("toolu_1")]), user([tool_result("toolu_1", "ok")])])
    assert sent[2]["content"] == "ok"


@pytest.mark.parametrize("vision", [None, True])
def test_tool_result_images_follow_in_a_labelled_user_message(vision: bool | None) -> None:
    sent = messages(
        caps=ModelCaps(vision=vision),
        messages=[
            user("Take a screenshot"),
            assistant([tool_use("toolu_shot", "computer", {"action": "screenshot"})]),
            user([tool_result("toolu_shot", [text("Screenshot taken."), image()]), text("What do you see?")]),
        ],
    )
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_shot", "content": "Screenshot taken."}
    follow = sent[3]
    assert follow["role"] == "user" and len(sent) == 4
    parts = follow["content"]
    image_at = next(i for i, p in enumerate(parts) if p["type"] == "image_url")
    assert parts[image_at]["image_url"]["url"] == "data:image/png;base64,iVBORw0KGgo="
    # the image is labelled with the tool call it came from, and the user's text comes after it
    assert any(p["type"] == "text" and "toolu_shot" in p["text"] for p in parts[:image_at])
    assert parts[-1] == {"type": "text", "text": "What do you see?"}


def test_tool_result_images_become_a_placeholder_without_vision() -> None:
    sent = messages(
        caps=ModelCaps(vision=False),
        messages=[
            user("q"),
            assistant([tool_use("toolu_shot", "computer", {"action": "screenshot"})]),
            user([tool_result("toolu_shot", [image()])]),
        ],
    )
    assert len(sent) == 3 and sent[2]["role"] == "tool"
    assert "image" in sent[2]["content"].lower() and "base64" not in sent[2]["content"]


def test_user_image_without_vision_is_rejected() -> None:
    message = error(caps=ModelCaps(vision=False), messages=[user([image(), text("what is this?")])])
    assert message.startswith("messages.0.content.0")


def test_tool_use_without_result_uses_anthropics_wording() -> None:
    message = error(
        messages=[user("q"), assistant([tool_use("toolu_A"), tool_use("toolu_B")]), user([tool_result("toolu_A")])]
    )
    assert message == (
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_B. "
        "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
    )


def test_tool_result_without_tool_use_uses_anthropics_wording() -> None:
    message = error(messages=[user("q"), assistant("no tools here"), user([tool_result("toolu_ghost")])])
    assert message.startswith("messages.2")
    assert "unexpected `tool_use_id` found in `tool_result` blocks: toolu_ghost" in message
    assert "Each `tool_result` block must have a corresponding `tool_use` block in the previous message." in message


def test_tool_result_in_first_message_is_rejected() -> None:
    assert "toolu_x" in error(messages=[user([tool_result("toolu_x")])])
