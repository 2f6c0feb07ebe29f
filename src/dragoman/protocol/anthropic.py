"""Anthropic Messages API wire types: what clients send us and what we send back.

Inbound types accept unknown fields (clients keep adding them: `defer_loading`,
`diagnostics`, `cache_control.scope`, ...) and ignore them. Content blocks are a
tagged union on `type`; a block type we do not know is rejected with a 400 that
names it, which is the one place where leniency would silently lose input.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType


class _In(Struct, kw_only=True, omit_defaults=True, gc=False):
    """Base for inbound (request) types.

    Wire types are plain trees, never cycles, so the garbage collector need not track
    them (`gc=False`): a request and every streamed event allocate several of them, and
    tracked allocations are what trigger collections."""


class _Block(_In, tag_field="type"):
    """Base for content blocks, discriminated by their `type`."""


# -- request-side content blocks ---------------------------------------------


class Base64Source(_In, tag="base64", tag_field="type"):
    media_type: str
    data: str


class URLSource(_In, tag="url", tag_field="type"):
    url: str


class FileSource(_In, tag="file", tag_field="type"):
    file_id: str


class TextSource(_In, tag="text", tag_field="type"):
    data: str
    media_type: str = "text/plain"


class ContentSource(_In, tag="content", tag_field="type"):
    content: str | list[Any]


ImageSource = Base64Source | URLSource | FileSource
DocumentSource = Base64Source | URLSource | FileSource | TextSource | ContentSource


class TextBlock(_Block, tag="text"):
    text: str
    citations: list[Any] | None | UnsetType = UNSET


class ImageBlock(_Block, tag="image"):
    source: ImageSource


class DocumentBlock(_Block, tag="document"):
    source: DocumentSource
    title: str | None = None
    context: str | None = None


class SearchResultBlock(_Block, tag="search_result"):
    source: str
    title: str
    content: list[TextBlock]


class ToolUseBlock(_Block, tag="tool_use"):
    id: str
    name: str
    input: Any


class ToolReferenceBlock(_Block, tag="tool_reference"):
    """Names a deferred tool that a tool search has loaded (Claude Code's ToolSearch)."""

    tool_name: str


class ToolResultBlock(_Block, tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock | SearchResultBlock | ToolReferenceBlock] | None = None
    is_error: bool = False


class ThinkingBlock(_Block, tag="thinking"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block, tag="redacted_thinking"):
    data: str


class ServerToolUseBlock(_Block, tag="server_tool_use"):
    id: str
    name: str
    input: Any = None


class MidConversationSystemBlock(_Block, tag="mid_conv_system"):
    content: list[TextBlock]


class ToolAdditionBlock(_Block, tag="tool_addition"):
    """Offers a tool from here on: `tool` is a `tool_definition` (with the `tools` entry in
    `definition`) or a `tool_reference` by name (the SDKs' tool runners send these)."""

    tool: dict[str, Any]


class CompactionBlock(_Block, tag="compaction"):
    """A summary standing for the messages before it (sent back from a `compaction` reply)."""

    content: str | None = None
    encrypted_content: str | None = None
    signature: str | None = None
    tool_changes: list[Any] | None = None


class ToolRemovalBlock(_Block, tag="tool_removal"):
    """Withdraws a tool from here on: `tool` is a `tool_reference` by name."""

    tool: dict[str, Any]


ContentBlockParam = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | SearchResultBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ServerToolUseBlock
    | MidConversationSystemBlock
    | ToolAdditionBlock
    | ToolRemovalBlock
    | CompactionBlock
)


class MessageParam(_In):
    role: str
    content: str | list[ContentBlockParam]


# -- tools and other request options -----------------------------------------


class Tool(_In):
    """A tool definition. Client tools carry `input_schema`; Anthropic-defined and
    server tools are recognised by a versioned `type` such as `bash_20250124`."""

    name: str
    type: str | None = None
    description: str | None = None
    # Kept as the client's JSON text: forwarded as is unless a backend strips keys
    # (a Claude Code request carries ~15 KB of schemas; decoding them costs per request).
    input_schema: msgspec.Raw = msgspec.Raw()
    strict: bool | None = None
    # Hidden from the model until a tool_reference in the conversation loads it.
    defer_loading: bool | None = None
    # Options of Anthropic-defined tools that shape their synthesised schema.
    display_width_px: int | None = None
    display_height_px: int | None = None


class ToolChoice(_In):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_In):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = None
    display: str | None = None  # "omitted": thinking blocks come back without their text


class OutputFormat(_In):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(_In):
    effort: str | None = None
    format: OutputFormat | None = None


class Metadata(_In):
    user_id: str | None = None


class ThreadParam(_In):
    type: Literal["create", "continue"]
    previous_message_id: str | None = None


class CompactionConfig(_In):
    type: Literal["summarize"]
    instructions: str | None = None


class MessagesRequest(_In):
    model: str
    messages: list[MessageParam]
    max_tokens: int
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None
    reasoning_effort: str | None = None
    thread: ThreadParam | None = None  # the gateway holds the conversation: see dragoman.threads
    compaction: CompactionConfig | None = None  # summarize the conversation instead of answering it


class CountTokensRequest(_In):
    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class Envelope(_In):
    """The two fields the gateway core needs before it knows which backend serves."""

    model: str
    stream: bool = False
    thread: ThreadParam | None = None


# -- response side ------------------------------------------------------------


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


ContentBlock = OutTextBlock | OutThinkingBlock | OutToolUseBlock | OutCompactionBlock

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal", "compaction"]


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


class MessageDeltaUsage(_Out):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


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


class ErrorDetail(_Out, omit_defaults=True):
    type: str
    message: str
    details: dict[str, str] | None = None  # `error_code` for the errors the SDKs act on (threads)


class ErrorResponse(_Out, tag="error", tag_field="type", omit_defaults=True):
    error: ErrorDetail
    request_id: str | None = None  # omitted in stream error events, which carry none


class CountTokensResponse(_Out):
    input_tokens: int


MESSAGES_REQUEST = msgspec.json.Decoder(MessagesRequest)
COUNT_TOKENS_REQUEST = msgspec.json.Decoder(CountTokensRequest)
ENVELOPE = msgspec.json.Decoder(Envelope)
