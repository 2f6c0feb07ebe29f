"""Anthropic MessagesRequest -> OpenAI ChatRequest. Pure: no I/O, no clock, no ids.

Everything a backend-specific difference needs comes in as data (`Profile`,
`ModelCaps`); the result carries what the response side must know to map the
reply back (tool names, stop sequences, whether thinking was asked for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dragoman.core.capabilities import ModelCaps
from dragoman.core.errors import InvalidRequest
from dragoman.core.profiles import Profile
from dragoman.protocol import anthropic, openai
from dragoman.translate import content
from dragoman.translate.checks import check_request
from dragoman.translate.compaction import with_summaries
from dragoman.translate.thinking import plan, replayed_reasoning
from dragoman.translate.tool_changes import CHANGES
from dragoman.translate.tool_defs import offered_tools
from dragoman.translate.tool_ids import replica_tag_of, upstream_tool_id
from dragoman.translate.tool_results import tool_result_messages

BILLING_PREFIX = "x-anthropic-billing-header:"


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """What the gateway tells the translation; `clock` (seconds) is what a PDF's time budget is read on."""

    clock: Callable[[], float]
    keep_billing_header: bool = False
    drop_server_tools: bool = False


@dataclass(slots=True)
class Translated:
    chat: openai.ChatRequest
    # upstream tool name -> client's name, for names shortened to fit the backend
    tool_names: dict[str, str] = field(default_factory=dict)
    # stop sequences the gateway matches itself (all of them: see translate/stops.py)
    stop_sequences: list[str] = field(default_factory=list)
    prefill: str = ""
    surface_thinking: bool = False
    omit_thinking_text: bool = False
    effort: str | None = None  # the reasoning effort applied, for X-Reasoning-Effort
    # `disable_parallel_tool_use`: at most one tool_use comes back, whatever the server does
    single_tool_call: bool = False
    # the tool_use ids of the conversation: a reply's calls get others (translate/tool_ids.py)
    tool_ids: set[str] = field(default_factory=set)
    # the tag of the replica the conversation's latest tool call came from, if its id says (routing)
    previous_replica: str | None = None


def _system_text(system: str | list[anthropic.TextBlock] | None, options: Options) -> list[str]:
    if system is None:
        return []
    if isinstance(system, str):
        return [system] if system else []
    texts = [block.text for block in system]
    if texts and not options.keep_billing_header and texts[0].startswith(BILLING_PREFIX):
        texts = texts[1:]
    return [t for t in texts if t]


def _text_of(value: str | list[anthropic.ContentBlockParam]) -> str:
    if isinstance(value, str):
        return value
    return "\n".join(b.text for b in value if isinstance(b, anthropic.TextBlock))


def _normalise_turns(request: anthropic.MessagesRequest, system: list[str]) -> list[tuple[str, list[Any], int]]:
    """(role, blocks, original index) turns: system-role messages folded, roles checked,
    consecutive same-role turns merged as Anthropic merges them."""
    turns: list[tuple[str, list[Any], int]] = []
    seen_assistant = False
    for index, message in with_summaries(request.messages):
        role = message.role
        blocks: list[Any] = (
            [anthropic.TextBlock(text=message.content)] if isinstance(message.content, str) else list(message.content)
        )
        if role == "system":
            text = _text_of(message.content)
            if not text:
                continue
            if not seen_assistant:
                system.append(text)
                continue
            role, blocks = "user", [anthropic.TextBlock(text=text)]
        elif role in ("ctx", "msg"):  # sent by some Claude Code versions; vLLM treats them as user too
            role = "user"
        elif role not in ("user", "assistant"):
            raise InvalidRequest(f"messages.{index}.role: {role!r} is not a valid role; use 'user' or 'assistant'")
        seen_assistant = seen_assistant or role == "assistant"
        expanded: list[Any] = []
        for block in blocks:
            if isinstance(block, anthropic.MidConversationSystemBlock):
                expanded.extend(block.content)
            elif not isinstance(block, CHANGES):  # tool changes act on the tool list, not the model's input
                expanded.append(block)
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(expanded)
        else:
            turns.append((role, expanded, index))
    return turns


def _check_tool_pairing(turns: list[tuple[str, list[Any], int]]) -> None:
    for position, (role, blocks, index) in enumerate(turns):
        if role != "assistant":
            continue
        ids = [b.id for b in blocks if isinstance(b, anthropic.ToolUseBlock)]
        if not ids or position == len(turns) - 1:
            continue
        answered = {b.tool_use_id for b in turns[position + 1][1] if isinstance(b, anthropic.ToolResultBlock)}
        missing = [i for i in ids if i not in answered]
        if missing:
            raise InvalidRequest(
                f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in the next message."
            )
    for position, (role, blocks, index) in enumerate(turns):
        if role != "user":
            continue
        previous = turns[position - 1][1] if position > 0 else []
        known = {b.id for b in previous if isinstance(b, anthropic.ToolUseBlock)}
        for block in blocks:
            if isinstance(block, anthropic.ToolResultBlock) and block.tool_use_id not in known:
                raise InvalidRequest(
                    f"messages.{index}.content: unexpected `tool_use_id` found in `tool_result` blocks: {block.tool_use_id}. "
                    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                )


def _assistant_message(blocks: list[Any], names: dict[str, str], replay_field: str | None) -> openai.AssistantMessage:
    """Echoed thinking blocks are dropped, unless the model needs its reasoning replayed."""
    texts = [b.text for b in blocks if isinstance(b, anthropic.TextBlock)]
    calls = [
        openai.ToolCall(
            id=upstream_tool_id(b.id),
            function=openai.FunctionCall(
                name=names.get(b.name, b.name), arguments=openai.ENCODER.encode(b.input).decode()
            ),
        )
        for b in blocks
        if isinstance(b, anthropic.ToolUseBlock)
    ]
    message = openai.AssistantMessage(content="".join(texts) if texts else None, tool_calls=calls or None)
    if replay_field is not None:
        thoughts = "".join(
            replayed_reasoning(b.thinking, b.signature) for b in blocks if isinstance(b, anthropic.ThinkingBlock)
        )
        if thoughts or calls:  # DeepSeek requires the field on every turn with tool calls
            setattr(message, replay_field, thoughts)
    return message


def to_chat_request(
    request: anthropic.MessagesRequest,
    *,
    upstream_model: str,
    profile: Profile,
    caps: ModelCaps = ModelCaps(),  # noqa: B008 (a frozen dataclass, as Options below)
    options: Options,
    stream: bool,
    betas: frozenset[str] = frozenset(),
) -> Translated:
    check_request(request, betas)
    system = _system_text(request.system, options)
    turns = _normalise_turns(request, system)
    if not turns:
        raise InvalidRequest("messages: at least one user or assistant message is required")
    _check_tool_pairing(turns)
    drop = options.drop_server_tools if caps.drop_server_tools is None else caps.drop_server_tools
    names, tools, tool_choice, parallel = offered_tools(request, turns, profile, drop)
    reasoning = plan(request, caps.reasoning, model=request.model)
    replay_field = profile.reasoning_field if caps.reasoning_replay else None
    messages = _chat_messages(system, turns, names, caps.vision, replay_field, options.clock)
    prefill, continue_final = _prefill(messages, turns, profile)
    chat = openai.ChatRequest(
        model=upstream_model,
        messages=messages,
        stream=stream,
        stream_options=openai.StreamOptions(include_usage=True) if stream else None,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k if profile.accepts_top_k else None,
        user=request.metadata.user_id if (request.metadata and profile.accepts_user) else None,
        tools=tools or None,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        response_format=_response_format(request),
        reasoning_effort=reasoning.effort,
        chat_template_kwargs=reasoning.chat_template_kwargs,
        continue_final_message=continue_final,
        add_generation_prompt=False if continue_final else None,
    )
    # max_tokens 0 only warms the prompt cache: one token is generated and not returned.
    limit = max(request.max_tokens, 1)
    if caps.reasoning.reasoning and profile.reasoning_max_tokens_field == "max_completion_tokens":
        chat.max_completion_tokens = limit
    else:
        chat.max_tokens = limit
    return Translated(
        chat=chat,
        tool_names={short: original for original, short in names.items() if short != original},
        stop_sequences=list(request.stop_sequences or ()),
        prefill=prefill,
        surface_thinking=reasoning.surface_thinking,
        omit_thinking_text=reasoning.omit_thinking_text,
        effort=reasoning.effort,
        single_tool_call=bool(request.tool_choice and request.tool_choice.disable_parallel_tool_use),
        tool_ids=_conversation_tool_ids(request),
        previous_replica=_previous_replica(request),
    )


def _chat_messages(
    system: list[str],
    turns: list[tuple[str, list[Any], int]],
    names: dict[str, str],
    vision: bool | None,
    replay_field: str | None,
    clock: Callable[[], float],
) -> list[openai.ChatMessage]:
    """The conversation as chat messages: a user turn's tool results become tool messages
    (before its other content, as the chat format wants them right after the calls)."""
    messages: list[openai.ChatMessage] = []
    if system:
        messages.append(openai.SystemMessage(content="\n\n".join(system)))
    for role, blocks, index in turns:
        where = f"messages.{index}.content"
        if role == "assistant":
            messages.append(_assistant_message(blocks, names, replay_field))
            continue
        tool_messages, tool_images = tool_result_messages(blocks, where, vision, clock)
        messages.extend(tool_messages)
        parts = tool_images + content.user_parts(blocks, where, vision=vision, clock=clock)
        if parts or not tool_messages:
            messages.append(openai.UserMessage(content=content.collapse(parts)))
    return messages


def _prefill(
    messages: list[openai.ChatMessage], turns: list[tuple[str, list[Any], int]], profile: Profile
) -> tuple[str, bool | None]:
    """(prefill, continue_final_message): a final assistant turn is text the reply continues,
    its trailing whitespace dropped; servers that can are told to continue it, not to start anew."""
    last = messages[-1]
    if not isinstance(last, openai.AssistantMessage):
        return "", None
    if last.tool_calls:
        raise InvalidRequest(f"messages.{turns[-1][2]}: the final assistant turn cannot end with a tool_use block")
    prefill = (last.content or "").rstrip()
    messages[-1] = openai.AssistantMessage(content=prefill)
    return prefill, True if profile.prefill == "continue_final_message" else None


def _conversation_tool_ids(request: anthropic.MessagesRequest) -> set[str]:
    """The tool_use ids the conversation holds: the reply's calls must get others."""
    return {
        block.id
        for message in request.messages
        if not isinstance(message.content, str)
        for block in message.content
        if isinstance(block, anthropic.ToolUseBlock)
    }


def _previous_replica(request: anthropic.MessagesRequest) -> str | None:
    """Where the conversation's latest tool call was made, as its id says (tool_ids.py): the
    replica that holds the conversation's prefix, whichever gateway process sent it there."""
    for message in reversed(request.messages):
        if message.role != "assistant" or isinstance(message.content, str):
            continue
        for block in reversed(message.content):
            if isinstance(block, anthropic.ToolUseBlock):
                return replica_tag_of(block.id)
    return None


def _response_format(request: anthropic.MessagesRequest) -> dict[str, Any] | None:
    fmt = (request.output_config.format if request.output_config else None) or request.output_format
    if fmt is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema, "strict": True}}
