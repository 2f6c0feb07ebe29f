"""Anthropic Messages API wire types of what we send back: messages, stream events, errors.

Every field is always present, as Anthropic sends it; `dragoman.protocol.anthropic`
re-exports these next to the request types, so callers use one namespace.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType

from dragoman.core.errors import ErrorDetail, ErrorResponse

__all__ = [
    "OutTextBlock",
    "OutThinkingBlock",
    "OutToolUseBlock",
    "OutCompactionBlock",
    "OutServerToolUseBlock",
    "OutWebSearchToolResultBlock",
    "OutWebFetchToolResultBlock",
    "OutMcpToolUseBlock",
    "OutMcpToolResultBlock",
    "WebSearchResult",
    "WebSearchToolResultError",
    "WebFetchToolResultError",
    "ContentBlock",
    "CALL_BLOCKS",
    "StopReason",
    "Usage",
    "Message",
    "MessageStart",
    "ContentBlockStart",
    "TextDelta",
    "InputJSONDelta",
    "ThinkingDelta",
    "SignatureDelta",
    "CompactionDelta",
    "Delta",
    "ContentBlockDelta",
    "ContentBlockStop",
    "MessageDeltaBody",
    "MessageDeltaUsage",
    "MessageDelta",
    "MessageStop",
    "Ping",
    "StreamEvent",
    "ErrorDetail",
    "ErrorResponse",
    "CountTokensResponse",
]


class _Out(Struct, kw_only=True, gc=False):
    """Base for outbound types: every field is always present, as Anthropic sends it
    (untracked by the garbage collector, as `_In`)."""


class OutTextBlock(_Out, tag="text", tag_field="type"):
    text: str


class OutThinkingBlock(_Out, tag="thinking", tag_field="type"):
    thinking: str
    signature: str


class OutToolUseBlock(_Out, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: Any


class OutCompactionBlock(_Out, tag="compaction", tag_field="type"):
    content: str | None


class OutServerToolUseBlock(_Out, tag="server_tool_use", tag_field="type"):
    """A server tool the gateway ran (dragoman.servertools): `id` starts `srvtoolu_`."""

    id: str
    name: str
    input: Any


class WebSearchResult(_Out, tag="web_search_result", tag_field="type"):
    url: str
    title: str
    encrypted_content: str
    page_age: str | None = None


class WebSearchToolResultError(_Out, tag="web_search_tool_result_error", tag_field="type"):
    error_code: str


class OutWebSearchToolResultBlock(_Out, tag="web_search_tool_result", tag_field="type"):
    tool_use_id: str
    content: list[WebSearchResult] | WebSearchToolResultError


class WebFetchToolResultError(_Out, tag="web_fetch_tool_result_error", tag_field="type"):
    error_code: str


class OutWebFetchToolResultBlock(_Out, tag="web_fetch_tool_result", tag_field="type"):
    tool_use_id: str
    content: Any  # a `web_fetch_result` (dict), or a WebFetchToolResultError


class OutMcpToolUseBlock(_Out, tag="mcp_tool_use", tag_field="type"):
    id: str  # `mcptoolu_...`
    name: str
    server_name: str
    input: Any


class OutMcpToolResultBlock(_Out, tag="mcp_tool_result", tag_field="type"):
    tool_use_id: str
    is_error: bool
    content: list[OutTextBlock]


ContentBlock = (
    OutTextBlock
    | OutThinkingBlock
    | OutToolUseBlock
    | OutCompactionBlock
    | OutServerToolUseBlock
    | OutWebSearchToolResultBlock
    | OutWebFetchToolResultBlock
    | OutMcpToolUseBlock
    | OutMcpToolResultBlock
)
# Blocks whose input streams as `input_json_delta`s.
CALL_BLOCKS = (OutToolUseBlock, OutServerToolUseBlock, OutMcpToolUseBlock)

StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
    "compaction",
]


class Usage(_Out):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    # Nothing to report, but sent as Anthropic sends them: the TypeScript SDK types them
    # as present (`T | null`), so code testing `!== null` must not meet `undefined`.
    cache_creation: dict[str, int] | None = None
    server_tool_use: dict[str, int] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    output_tokens_details: dict[str, int] | None = None


class Message(_Out, tag="message", tag_field="type", kw_only=True):
    id: str
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    stop_details: dict[str, Any] | None = None  # as Usage's: present, null
    container: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    usage: Usage


# -- stream events ------------------------------------------------------------


class MessageStart(_Out, tag="message_start", tag_field="type"):
    message: Message


class ContentBlockStart(_Out, tag="content_block_start", tag_field="type"):
    index: int
    content_block: ContentBlock


class TextDelta(_Out, tag="text_delta", tag_field="type"):
    text: str


class InputJSONDelta(_Out, tag="input_json_delta", tag_field="type"):
    partial_json: str


class ThinkingDelta(_Out, tag="thinking_delta", tag_field="type"):
    thinking: str


class SignatureDelta(_Out, tag="signature_delta", tag_field="type"):
    signature: str


class CompactionDelta(_Out, tag="compaction_delta", tag_field="type"):
    content: str | None


Delta = TextDelta | InputJSONDelta | ThinkingDelta | SignatureDelta | CompactionDelta


class ContentBlockDelta(_Out, tag="content_block_delta", tag_field="type"):
    index: int
    delta: Delta


class ContentBlockStop(_Out, tag="content_block_stop", tag_field="type"):
    index: int


class MessageDeltaBody(_Out):
    stop_reason: StopReason | None
    stop_sequence: str | None
    # Present, null, as the SDKs type them: the TypeScript SDK's MessageStream copies
    # delta.stop_details into its message whatever it is, so an absent one left
    # finalMessage().stop_details undefined (not null, as Message's is).
    stop_details: dict[str, Any] | None = None
    container: dict[str, Any] | None = None


class MessageDeltaUsage(_Out):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens_details: dict[str, int] | UnsetType = UNSET  # left out unless the server counted reasoning
    server_tool_use: dict[str, int] | UnsetType = UNSET  # left out unless the gateway ran server tools


class MessageDelta(_Out, tag="message_delta", tag_field="type"):
    delta: MessageDeltaBody
    usage: MessageDeltaUsage


class MessageStop(_Out, tag="message_stop", tag_field="type"):
    pass


class Ping(_Out, tag="ping", tag_field="type"):
    pass


StreamEvent = (
    MessageStart | ContentBlockStart | ContentBlockDelta | ContentBlockStop | MessageDelta | MessageStop | Ping
)


# -- errors -------------------------------------------------------------------


# ErrorDetail, ErrorResponse: defined with the error tree (core.errors), re-exported here.


class CountTokensResponse(_Out):
    input_tokens: int
