"""Anthropic Messages API wire types: what clients send us (and, re-exported, what we send back).

Inbound types accept unknown fields (clients keep adding them: `defer_loading`,
`diagnostics`, `cache_control.scope`, ...) and ignore them. Content blocks are a
tagged union on `type`; a block type we do not know is rejected with a 400 that
names it, which is the one place where leniency would silently lose input.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")  # a client's headers an Anthropic upstream is sent


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's FORWARDED_HEADERS, to send on (a message, each request of a batch);
    `anthropic-beta` sent as several headers is kept whole, as one."""
    kept = {k: headers[k] for k in FORWARDED_HEADERS if k in headers}
    getlist = getattr(headers, "getlist", None)
    if getlist is not None and "anthropic-beta" in kept:
        kept["anthropic-beta"] = ",".join(getlist("anthropic-beta"))
    return kept


def betas(headers: Mapping[str, str]) -> frozenset[str]:
    """The betas a request asks for: `anthropic-beta` is comma-separated, and may be sent
    as several headers."""
    joined = forwarded_headers(headers).get("anthropic-beta", "")
    return frozenset(name for name in (part.strip() for part in joined.split(",")) if name)


def timestamp(when: datetime | float) -> str:
    """A time as the API writes one (`created_at`...): RFC 3339 in UTC, to the microsecond,
    with `Z`; a float is seconds since the epoch."""
    if not isinstance(when, datetime):
        when = datetime.fromtimestamp(when, UTC)
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


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


class WebSearchToolResultBlock(_Block, tag="web_search_tool_result"):
    """A web search's results replayed (`content`: a list of `web_search_result`, or one error)."""

    tool_use_id: str
    content: Any = None


class WebFetchToolResultBlock(_Block, tag="web_fetch_tool_result"):
    tool_use_id: str
    content: Any = None


class McpToolUseBlock(_Block, tag="mcp_tool_use"):
    id: str
    name: str
    server_name: str = ""
    input: Any = None


class McpToolResultBlock(_Block, tag="mcp_tool_result"):
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool = False


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
    | WebSearchToolResultBlock
    | WebFetchToolResultBlock
    | McpToolUseBlock
    | McpToolResultBlock
    | MidConversationSystemBlock
    | ToolAdditionBlock
    | ToolRemovalBlock
    | CompactionBlock
)


class MessageParam(_In):
    role: str
    content: str | list[ContentBlockParam]


# -- tools and other request options -----------------------------------------


_ABSENT = "\x00absent"  # a Tool's name when the request gave none


class Tool(_In):
    """A tool definition. Client tools carry `input_schema`; Anthropic-defined and
    server tools are recognised by a versioned `type` such as `bash_20250124`."""

    name: str = _ABSENT  # required but for `mcp_toolset`, which names its server instead (__post_init__)
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

    def __post_init__(self) -> None:
        if self.name == _ABSENT:
            if self.type != "mcp_toolset":  # worded as msgspec words a missing field
                raise ValueError("Object missing required field `name`")
            self.name = ""

    # Options of the server tools the gateway runs (dragoman.servertools).
    max_uses: int | None = None
    allowed_domains: list[str] | None = None
    blocked_domains: list[str] | None = None
    user_location: dict[str, Any] | None = None
    max_content_tokens: int | None = None
    mcp_server_name: str | None = None
    default_config: dict[str, Any] | None = None
    configs: dict[str, dict[str, Any]] | None = None


class McpServer(_In):
    """An MCP server a request names (`mcp_servers`, the MCP connector beta)."""

    type: Literal["url"]
    url: str
    name: str
    authorization_token: str | None = None
    tool_configuration: dict[str, Any] | None = None  # mcp-client-2025-04-04's shape


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
    thread: ThreadParam | None = None  # the gateway holds the conversation: see dragoman.assembly.threads
    compaction: CompactionConfig | None = None  # summarize the conversation instead of answering it
    mcp_servers: list[McpServer] | None = None  # run by the gateway (dragoman.servertools)


class CountTokensRequest(_In):
    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class Envelope(_In):
    """What the gateway core needs before it knows which backend serves, and the parts of the
    prompt left undecoded (`Raw`, no copy): a passed-through body is read once, for its route,
    its URL images (`backends.images`) and cache-aware routing (`upstream.placement`)."""

    model: str
    stream: bool = False
    thread: ThreadParam | None = None
    max_tokens: int = 0  # the output the limits reserve (0: none given, as in a count)
    messages: list[msgspec.Raw] = []
    tools: msgspec.Raw = msgspec.Raw(b"")
    system: msgspec.Raw = msgspec.Raw(b"")


MESSAGES_REQUEST = msgspec.json.Decoder(MessagesRequest)
COUNT_TOKENS_REQUEST = msgspec.json.Decoder(CountTokensRequest)
ENVELOPE = msgspec.json.Decoder(Envelope)

# The reply side lives in its own module; one namespace for both.
from dragoman.protocol.anthropic_replies import *  # noqa: E402,F403
