"""What a reply says besides its content, on the translating path: why it stopped and
what it used. Shared by the stream translator and the non-streaming translation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from dragoman.protocol import anthropic as a
from dragoman.protocol import openai

FINISH_REASONS: dict[str, a.StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


class ReplySettings(TypedDict):
    """What StreamTranslator and to_message need to know about the reply they build."""

    model: str
    message_id: str
    new_tool_id: Callable[[], str]
    tool_names: dict[str, str]
    taken_tool_ids: set[str]
    stop_sequences: list[str]
    surface_thinking: bool
    omit_thinking_text: bool
    single_tool_call: bool
    window_bound: bool  # max_tokens was lowered to fit the context window (backends.fitting)
    prefill: str
    upstream: str
    replica_tag: Callable[[], str]  # the tag of the replica answering, for its tool ids ("": none) (tool_ids.py)


def usage_of(usage: openai.Usage | None) -> a.Usage:
    if usage is None:
        return a.Usage(input_tokens=0, output_tokens=0)
    cached = (usage.prompt_tokens_details.cached_tokens or 0) if usage.prompt_tokens_details else 0
    reasoning = usage.completion_tokens_details.reasoning_tokens if usage.completion_tokens_details else None
    return a.Usage(
        input_tokens=max(usage.prompt_tokens - cached, 0),
        output_tokens=usage.completion_tokens,
        cache_read_input_tokens=cached,
        output_tokens_details=None if reasoning is None else {"thinking_tokens": reasoning},
    )


def stop_reason_of(
    finish: str | None, *, tool_calls: bool, matched: str | None, window_bound: bool = False
) -> a.StopReason:
    """Anthropic's stop reason for an upstream finish reason. `window_bound`: the request's
    max_tokens was lowered to the room the prompt left in the context window, so a reply
    cut at it was stopped by the window, not by the client's max_tokens."""
    if matched is not None:
        return "stop_sequence"
    if finish == "length":
        # A tool call cut short too, as Anthropic says it of one (its input may be
        # incomplete): both reasons mean the reply was cut; the window's tells the client
        # that asking for more tokens will not help.
        return "model_context_window_exceeded" if window_bound else "max_tokens"
    if tool_calls:
        return "tool_use"
    reason = FINISH_REASONS.get(finish or "stop", "end_turn")
    # `tool_calls` with no call parsed (a server's tool parser that failed and left the call
    # in the text): Anthropic never says tool_use without a tool_use block, and the SDKs'
    # tool runners would look for one.
    return "end_turn" if reason == "tool_use" else reason


def reasoning_as_answer(finish: str | None, *, saw_content: bool) -> bool:
    """Whether a reply without text or tool calls gives its reasoning as the text: only one
    the model ended itself (a server's reasoning parser that took the whole answer), not
    one cut by `max_tokens` while the model was still thinking."""
    return not saw_content and finish != "length"
