"""What Anthropic refuses in a Messages request and the translation would otherwise hide:
each a 400 naming the field, instead of a request the model sees differently."""

from __future__ import annotations

from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic

# Blocks a turn of this role cannot hold: translated, they would vanish or become an empty prefill.
MISPLACED: dict[str, tuple[type, ...]] = {
    "assistant": (anthropic.ToolResultBlock, anthropic.ImageBlock, anthropic.DocumentBlock),
    "user": (anthropic.ToolUseBlock, anthropic.ServerToolUseBlock),
}
URL_SCHEMES = ("http://", "https://")

# Extended thinking (`thinking.type: "enabled"`), as Anthropic checks it, with its words.
MIN_THINKING_BUDGET = 1024
# With this beta the budget spans all the thinking blocks of a turn, so it may exceed max_tokens.
INTERLEAVED_THINKING = "interleaved-thinking-2025-05-14"
BUDGET_NOT_BELOW_MAX_TOKENS = (
    "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size"
)
FORCED_TOOL_USE = "Thinking may not be enabled when tool_choice forces tool use."


def check_request(request: anthropic.MessagesRequest, betas: frozenset[str] = frozenset()) -> None:
    """`betas`: the request's `anthropic-beta` names (some relax a check)."""
    if not request.messages:
        raise InvalidRequest("messages: at least one message is required")
    if request.max_tokens < 0:
        raise InvalidRequest("max_tokens: must be greater than or equal to 0")
    if request.temperature is not None and not 0.0 <= request.temperature <= 1.0:
        raise InvalidRequest("temperature: must be between 0 and 1")
    if request.top_p is not None and not 0.0 <= request.top_p <= 1.0:
        raise InvalidRequest("top_p: must be between 0 and 1")
    if request.top_k is not None and request.top_k < 0:
        raise InvalidRequest("top_k: must be greater than or equal to 0")
    for index, stop in enumerate(request.stop_sequences or ()):
        if not stop:
            raise InvalidRequest(f"stop_sequences.{index}: must not be empty")
    _check_tools(request)
    _check_thinking(request, betas)
    _check_blocks(request.messages)


def _check_tools(request: anthropic.MessagesRequest) -> None:
    seen: set[str] = set()
    for index, tool in enumerate(request.tools or ()):
        if tool.type == "mcp_toolset":  # it names its server instead (dragoman.servertools)
            continue
        if not tool.name:
            raise InvalidRequest(f"tools.{index}.name: must not be empty")
        if tool.name in seen:
            raise InvalidRequest(
                f"tools.{index}.name: {tool.name!r} is the name of an earlier tool; tool names must be unique"
            )
        seen.add(tool.name)
    choice = request.tool_choice
    if choice is not None and choice.type in ("any", "tool") and not request.tools:
        raise InvalidRequest(f"tool_choice: type {choice.type!r} needs tools; the request has none")


def _check_thinking(request: anthropic.MessagesRequest, betas: frozenset[str]) -> None:
    """Only `enabled` has a budget; `adaptive` and `disabled` pass (Claude Code sends all three).
    `enabled` without a budget passes too: the budget is an effort hint here, and none means
    medium effort (translate/thinking.py)."""
    thinking = request.thinking
    if thinking is None or thinking.type != "enabled":
        return
    budget = thinking.budget_tokens
    if budget is not None and budget < MIN_THINKING_BUDGET:
        raise InvalidRequest(
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}"
        )
    if budget is not None and budget >= request.max_tokens and INTERLEAVED_THINKING not in betas:
        raise InvalidRequest(BUDGET_NOT_BELOW_MAX_TOKENS)
    if request.tool_choice is not None and request.tool_choice.type in ("any", "tool"):
        raise InvalidRequest(FORCED_TOOL_USE)


def _check_blocks(messages: list[anthropic.MessageParam]) -> None:
    for index, message in enumerate(messages):
        if isinstance(message.content, str):
            continue
        misplaced = MISPLACED.get(message.role, ())
        for at, block in enumerate(message.content):
            if isinstance(block, misplaced):
                kind = block.__struct_config__.tag
                raise InvalidRequest(
                    f"messages.{index}.content.{at}: {kind} blocks are not allowed in {message.role} turns"
                )
            if isinstance(block, anthropic.ImageBlock) and isinstance(block.source, anthropic.URLSource):
                if not block.source.url.startswith(URL_SCHEMES):
                    raise InvalidRequest(f"messages.{index}.content.{at}.source.url: must be an http or https URL")
