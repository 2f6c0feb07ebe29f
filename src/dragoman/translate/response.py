"""OpenAI ChatCompletion -> Anthropic Message (non-streaming). Pure: ids come in."""

from __future__ import annotations

from collections.abc import Callable

from dragoman.core.errors import UpstreamError
from dragoman.protocol import anthropic as a
from dragoman.protocol import openai
from dragoman.translate.reply import reasoning_as_answer, stop_reason_of, usage_of
from dragoman.translate.stops import StopMatcher
from dragoman.translate.thinking import signature_for
from dragoman.translate.tool_args import parse_arguments
from dragoman.translate.tool_ids import client_tool_id, tagged


def to_message(
    completion: openai.ChatCompletion,
    *,
    model: str,
    message_id: str,
    new_tool_id: Callable[[], str],
    tool_names: dict[str, str] | None = None,
    taken_tool_ids: set[str] | None = None,
    stop_sequences: list[str] | None = None,
    surface_thinking: bool = False,
    omit_thinking_text: bool = False,
    single_tool_call: bool = False,
    window_bound: bool = False,
    prefill: str = "",
    upstream: str = "upstream",
    replica_tag: Callable[[], str] = str,
) -> a.Message:
    if not completion.choices:
        raise UpstreamError(f"upstream {upstream} returned a completion without choices")
    choice = completion.choices[0]
    message = choice.message
    content: list[a.ContentBlock] = []
    reasoning = message.reasoning or message.reasoning_content or ""
    if reasoning and surface_thinking:
        signature = signature_for(reasoning, omitted=omit_thinking_text)
        content.append(a.OutThinkingBlock(thinking="" if omit_thinking_text else reasoning, signature=signature))
    text = message.content or message.refusal or ""  # a refusal is the model's answer too
    if prefill and text.startswith(prefill):  # some servers repeat the prefill first
        text = text[len(prefill) :]
    matcher = StopMatcher(stop_sequences or [])
    if matcher and text:
        text = matcher.feed(text) + matcher.flush()
    calls = message.tool_calls or [] if matcher.matched is None else []
    if single_tool_call:
        calls = calls[:1]  # the client asked for one (`disable_parallel_tool_use`); the server may not know the option
    if text:
        content.append(a.OutTextBlock(text=text))
    if calls:
        taken = set() if taken_tool_ids is None else taken_tool_ids
        _add_tool_uses(content, calls, tool_names or {}, taken, new_tool_id, replica_tag())
    elif not text:  # no answer yet: the reasoning may be it
        _add_fallback(content, choice, reasoning)
    return a.Message(
        id=message_id,
        model=model,
        content=content,
        stop_reason=stop_reason_of(
            choice.finish_reason, tool_calls=bool(calls), matched=matcher.matched, window_bound=window_bound
        ),
        stop_sequence=matcher.matched,
        usage=usage_of(completion.usage),
    )


def _add_tool_uses(
    content: list[a.ContentBlock],
    calls: list[openai.ResponseToolCall],
    names: dict[str, str],
    taken: set[str],
    new_tool_id: Callable[[], str],
    tag: str,
) -> None:
    """The calls as tool_use blocks: the client's tool names, ids the conversation has not used."""
    for call in calls:
        function = call.function or openai.ResponseFunction()
        name = names.get(function.name or "", function.name or "")
        content.append(
            a.OutToolUseBlock(
                id=client_tool_id(call.id, taken, tag) if call.id else tagged(new_tool_id(), tag),
                name=name,
                input=parse_arguments(function.arguments, tool=name),
            )  # fmt: skip
        )


def _add_fallback(content: list[a.ContentBlock], choice: openai.Choice, reasoning: str) -> None:
    """No text or tool call: the reasoning is the answer, if the model ended the reply itself;
    otherwise a thinking block alone, or an empty text block. Content that a stop sequence
    cut to nothing is an empty answer, not the reasoning."""
    message = choice.message
    as_answer = reasoning_as_answer(choice.finish_reason, saw_content=bool(message.content or message.refusal))
    if as_answer and reasoning:
        content.append(a.OutTextBlock(text=reasoning))
    elif not content:
        content.append(a.OutTextBlock(text=""))
