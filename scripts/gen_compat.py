"""Generate docs/compatibility.md from the code's own protocol types.

Each Anthropic request field, content block, tool kind, response field and stream
event is compared with what dragoman's msgspec types decode and emit:
- a field our request type declares is "supported" (the note says how);
- a field only the official SDK knows is "accepted, ignored" (inbound types do not
  forbid unknown fields);
- a content-block type missing from our tagged union is "rejected" with a 400.
The official SDK's type definitions are the reference list; a unit test checks
that the committed file is what this script prints, so the two cannot drift.

    python scripts/gen_compat.py > docs/compatibility.md
"""

from __future__ import annotations

import typing
from typing import Any

import anthropic.types as sdk
import anthropic.types.beta.message_create_params as sdk_beta_create
import anthropic.types.message_count_tokens_params as sdk_count
import anthropic.types.message_create_params as sdk_create
import msgspec

from dragoman.protocol import anthropic as ours
from dragoman.translate.builtin_tools import _BUILTIN, SERVER_TOOL_FAMILIES

SUPPORTED, IGNORED, REJECTED = "supported", "accepted, ignored", "rejected (400)"

REQUEST_NOTES = {
    "model": "mapped through names, aliases (`*` wildcards), discovered upstream models and the default model; the response carries the client's name",
    "messages": "user/assistant turns; consecutive same-role turns merged; `system`, `ctx` and `msg` roles folded; a final assistant turn is a prefill",
    "max_tokens": "required; lowered visibly (header `X-Max-Tokens-Applied`) to the model's output limit and remaining context; a reply "
    'cut at a limit the remaining context set has `stop_reason: "model_context_window_exceeded"`',
    "system": "string or text blocks; Claude Code's per-session billing-header block is dropped (setting `keep_billing_header`)",
    "stop_sequences": "any number, matched by the gateway over the streamed text; the matched sequence is reported exactly; the upstream is then hung up on, and usage is the prompt as counted plus a token per chunk received",
    "stream": "Anthropic's SSE event sequence; the response head and `message_start` go out with the first token (or, after "
    "`keepalive_interval` without one, with a `ping`), so a failure before then is an HTTP error with its status; on the translating "
    "path `message_start`'s `usage.input_tokens` is 0: the count comes with `message_delta` (the SDKs' accumulators take it from there)",
    "temperature": "passed on (0 to 1)",
    "top_p": "passed on",
    "top_k": "passed on where the backend takes it (not to OpenAI)",
    "metadata": "`user_id` becomes `user` for backends that take it (OpenAI)",
    "tools": "client tools become function tools; Anthropic-defined tools get their documented schema; `web_search_*`, `web_fetch_*` and `mcp_toolset` are run by the gateway when configured ([server-tools.md](server-tools.md)); other server tools are rejected or dropped",
    "mcp_servers": "with `[mcp]` (beta `mcp-client-2025-11-20` or `-04-04`): served by the gateway as an MCP client, Streamable HTTP or SSE ([server-tools.md](server-tools.md)); else ignored",
    "tool_choice": "auto, any (`required`), tool (named function), none; `disable_parallel_tool_use` becomes `parallel_tool_calls: false`, and of the calls of a server that ignores it only the first comes back",
    "thinking": "enabled/adaptive surface the backend's reasoning as thinking blocks on reasoning models; budget_tokens selects an effort (none: `medium`; adaptive: the model's default); "
    "as on Anthropic, a 400 for an enabled budget below 1024, or not below max_tokens (unless the `interleaved-thinking-2025-05-14` "
    "beta), or with a tool_choice that forces tool use (`any`, `tool`); passthrough leaves these to the server",
    "output_config": "`effort` becomes `reasoning_effort` on reasoning models; `format` becomes `response_format` json_schema",
    "output_format": "older spelling of `output_config.format`",
    "reasoning_effort": "not Anthropic's: an explicit effort, validated against the model's efforts",
    "compaction": "`summarize`: the model is asked for a summary of the conversation (`instructions`, or the gateway's own), with no "
    'tools; the reply is one `compaction` block with `stop_reason: "compaction"`, streamed or not (translating path; passthrough '
    "forwards the field). The request as sent gets every check any request gets first: a thinking budget, tool list, "
    "`tool_choice` or effort Anthropic refuses is the same 400",
    "thread": "message threads: the gateway holds each conversation (system, tools, messages, reply) in memory under the reply's id; "
    "`continue` sends only new messages; an unknown or evicted id is `thread_not_found` (404), upon which the SDKs resend the whole "
    "conversation; each reply can be continued once (`thread_already_continued`); held per API key (tenant), 256 MiB and 24 h at most",
}
IGNORED_NOTES = {
    "cache_control": "backends cache prefixes automatically",
    "container": "no code-execution containers",
    "context_management": "no server-side context editing",
    "service_tier": "no tiers",
    "inference_geo": "no regions",
    "speed": "no fast mode",
    "diagnostics": "",
}

BLOCK_NOTES = {
    "text": "user text parts; assistant text",
    "image": "base64 sources become `image_url` parts (jpeg, png, gif, webp) as data URLs; URL sources are fetched by dragoman (public addresses only unless `fetch_allow_private`; a refused or unreadable URL is a 400 naming it) and sent the same way, on both paths, so no model server fetches a URL; a model without vision gets a 400; base64 data that is not padded base64 throughout (a 400 in Anthropic's words, `invalid base64 data`) or whose first bytes are no such image is a 400 naming `source.data`, and a mislabelled image (a JPEG sent as `image/png`) is sent with the type its bytes show, where Anthropic answers 400; `file` sources (Files API) are replaced by the uploaded image, typed by its bytes where its upload gave no image type or another one",
    "document": "plain-text, content and base64 PDF sources become text with title and context (a PDF past 100 pages, 4 MiB of page content, 10 s of reading or 2,097,152 characters of text is a 400 naming `source.data`; the images of a content source go in their places as images; a model without vision gets a 400, or, in a tool result, a note that an image was left out); URL sources are fetched when the operator enables it (public addresses only), else a 400; `file` sources (Files API) are replaced by the uploaded PDF or text, recognised by its first bytes when its upload was typed `application/octet-stream` (raw bytes sent without a name or type) or with a type the bytes contradict",
    "search_result": "text with its source and title",
    "tool_use": "assistant `tool_calls`, ids preserved; a server's id outside Anthropic's `[a-zA-Z0-9_-]`, or one already used in the conversation or the reply (servers that name every call `0` or `call_0`), reaches the client encoded and unique (`toolu_b64…`) and goes back to the server as it was; behind replicas, an id also names its replica (`toolu_dr…`, [routing](routing.md#several-gateway-replicas))",
    "tool_result": "tool messages, in order, before the turn's other content; `is_error` carried; images moved to a following user message",
    "thinking": "dropped before the model sees it, unless the model replays reasoning",
    "redacted_thinking": "dropped",
    "server_tool_use": "with `[web_search]` or `[web_fetch]` ([server-tools.md](server-tools.md)): the call it was, shown to the model with its result; else dropped",
    "web_search_tool_result": "with `[web_search]`: its results shown to the model again (`encrypted_content` opened; an altered one is a 400); else dropped",
    "web_fetch_tool_result": "with `[web_fetch]`: the page's text shown to the model again; else dropped",
    "mcp_tool_use": "with `[mcp]`: the call it was, shown to the model with its result; else dropped",
    "mcp_tool_result": "with `[mcp]`: its text shown to the model again; else dropped",
    "mid_conv_system": "its text joins the conversation as user-side text",
    "tool_addition": "a `tool_definition` or a `tool_reference` to a `tools` entry; the upstream is offered the tools in force at the end of "
    "the conversation (Chat Completions has one tool list per request); the block itself is not sent",
    "tool_removal": "a `tool_reference` by name; as `tool_addition`",
    "compaction": "its summary becomes a user turn standing for the messages it replaced; one without content is dropped",
}


RUN_HERE = {  # server tools the gateway runs itself (dragoman.servertools), when configured
    "web_search_": "run by the gateway with `[web_search]` (SearXNG, Brave or Tavily; [server-tools.md](server-tools.md)): "
    "`max_uses`, `allowed_domains`, `blocked_domains`, `user_location` (country); without it rejected (400), or removed "
    'with `server.server_tools = "drop"`',
    "web_fetch_": "run by the gateway with `[web_fetch]`, through its URL fetcher: only URLs already in the conversation; "
    '`max_uses`, domain lists, `max_content_tokens`; without it rejected (400), or removed with `server_tools = "drop"`',
    "mcp_toolset": "with `[mcp]`: the toolset's server served by the gateway as an MCP client; `default_config` and `configs` "
    'say which tools are offered; without it rejected (400), or removed with `server_tools = "drop"`',
}


def _union_types(annotation: Any) -> list[type]:
    return [t for t in typing.get_args(annotation) if isinstance(t, type)]


def _block_tag(cls: type) -> str:
    fields = getattr(cls, "model_fields", None)  # pydantic models (responses, events)
    annotation = fields["type"].annotation if fields else typing.get_type_hints(cls)["type"]
    return typing.get_args(annotation)[0]


def _our_block_tags() -> set[str]:
    return {cls.__struct_config__.tag for cls in typing.get_args(ours.ContentBlockParam)}


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def request_fields() -> list[str]:
    declared = set(ours.MessagesRequest.__struct_fields__)
    names = list(sdk_create.MessageCreateParamsBase.__annotations__) + ["stream", "temperature", "top_p", "top_k"]
    names += [n for n in sdk_beta_create.MessageCreateParamsBase.__annotations__ if n not in names and n != "betas"]
    names += [n for n in ours.MessagesRequest.__struct_fields__ if n not in names]
    lines = [_row("field", "status", "notes"), _row("---", "---", "---")]
    for name in dict.fromkeys(names):
        if name in declared:
            lines.append(_row(f"`{name}`", SUPPORTED, REQUEST_NOTES.get(name, "")))
        else:
            lines.append(_row(f"`{name}`", IGNORED, IGNORED_NOTES.get(name, "")))
    return lines


def count_tokens_fields() -> list[str]:
    declared = set(ours.CountTokensRequest.__struct_fields__)
    lines = [_row("field", "status"), _row("---", "---")]
    for name in sdk_count.MessageCountTokensParams.__annotations__:
        lines.append(_row(f"`{name}`", SUPPORTED if name in declared else IGNORED))
    return lines


def content_blocks() -> list[str]:
    supported = _our_block_tags()
    tags = [_block_tag(cls) for cls in _union_types(sdk.ContentBlockParam)]
    tags += sorted(supported - set(tags))
    lines = [_row("block `type`", "status", "notes"), _row("---", "---", "---")]
    for tag in tags:
        if tag in supported:
            lines.append(_row(f"`{tag}`", SUPPORTED, BLOCK_NOTES.get(tag, "")))
        else:
            lines.append(
                _row(
                    f"`{tag}`", REJECTED, "a result of a server tool, which cannot run here; the message names the type"
                )
            )
    return lines


def tools() -> list[str]:
    lines = [_row("tool", "status", "notes"), _row("---", "---", "---")]
    lines.append(
        _row(
            "custom (`type` absent or `custom`)",
            SUPPORTED,
            "function tool with `input_schema`; names over 64 characters shortened reversibly; names are not held to Anthropic's pattern `^[a-zA-Z0-9_-]{1,128}$` (a name it would refuse reaches the server as written)",
        )
    )
    for kind in sorted(_BUILTIN):
        lines.append(_row(f"`{kind}`", SUPPORTED, "function tool with the documented input schema"))
    for family in SERVER_TOOL_FAMILIES:
        run = RUN_HERE.get(family)
        if run is not None:
            lines.append(_row(f"`{family}*`", SUPPORTED, run))
        else:
            lines.append(
                _row(f"`{family}*`", REJECTED, 'server tool; `server.server_tools = "drop"` removes it instead')
            )
    lines.append(
        _row(
            "other versions of `bash_`, `text_editor_`, `computer_`, `memory_`",
            REJECTED,
            "the message names the unknown version",
        )
    )
    return lines


def response_fields() -> list[str]:
    emitted = set(ours.Message.__struct_fields__) | {"type"}
    lines = [_row("field", "status"), _row("---", "---")]
    for name in sdk.Message.model_fields:
        lines.append(_row(f"`{name}`", "sent" if name in emitted else "not sent (optional in the SDK)"))
    usage = set(ours.Usage.__struct_fields__)
    for name in sdk.Usage.model_fields:
        lines.append(_row(f"`usage.{name}`", "sent" if name in usage else "not sent (optional in the SDK)"))
    return lines


def stream_events() -> list[str]:
    ours_events = {cls.__struct_config__.tag for cls in typing.get_args(ours.StreamEvent)}
    ours_deltas = {cls.__struct_config__.tag for cls in typing.get_args(ours.Delta)}
    lines = [_row("event or delta", "status"), _row("---", "---")]
    for cls in _union_types(typing.get_args(sdk.RawMessageStreamEvent)[0]):
        tag = _block_tag(cls)
        lines.append(_row(f"`{tag}`", "sent" if tag in ours_events else "not sent"))
    lines.append(_row("`ping`", "sent" if "ping" in ours_events else "not sent"))
    lines.append(
        _row("`error`", "sent when a started stream fails (one that fails before its first event is an HTTP error)")
    )
    for cls in _union_types(typing.get_args(sdk.RawContentBlockDelta)[0]):
        tag = _block_tag(cls)
        lines.append(_row(f"delta `{tag}`", "sent" if tag in ours_deltas else "not sent"))
    return lines


def batch_fields() -> list[str]:
    from anthropic.types.messages import MessageBatch, MessageBatchResult

    from dragoman.protocol.batches import MessageBatch as OurBatch

    ours_fields = set(OurBatch.__struct_fields__)
    lines = [_row("`MessageBatch` field", "status"), _row("---", "---")]
    for name in MessageBatch.model_fields:
        lines.append(_row(f"`{name}`", "sent" if name in ours_fields else "not sent"))
    union = typing.get_args(MessageBatchResult)[0]  # Annotated[Union[...], discriminator]
    produced = ("succeeded", "errored", "canceled", "expired")  # dragoman.batches.service writes these
    for tag in (_block_tag(cls) for cls in _union_types(union)):
        lines.append(_row(f"result `{tag}`", "produced" if tag in produced else "not produced"))
    return lines


def main() -> None:
    parts = [
        "# Compatibility",
        "",
        "Generated by `scripts/gen_compat.py` from dragoman's protocol types, compared with the official",
        f"`anthropic` Python SDK's type definitions (version {_sdk_version()}). Do not edit by hand.",
        "",
        "This is the translating path (OpenAI-compatible upstreams). The passthrough path forwards",
        "every field, block and event unchanged, but for the null fields the SDKs type that a server",
        "leaves out (`stop_details`, `container`, `diagnostics`), which it puts in (docs/backends.md).",
        "",
        "## Request fields (`POST /v1/messages`)",
        "",
        *request_fields(),
        "",
        "## `POST /v1/messages/count_tokens` fields",
        "",
        *count_tokens_fields(),
        "",
        "## Content blocks (request side)",
        "",
        *content_blocks(),
        "",
        "## Tools",
        "",
        *tools(),
        "",
        "## Response fields",
        "",
        *response_fields(),
        "",
        "## Stream events",
        "",
        *stream_events(),
        "",
        "## Message Batches (`/v1/messages/batches`)",
        "",
        "Create, retrieve, list, cancel, delete and results are served; each request runs through",
        "the same path as `POST /v1/messages` (translating or passthrough). Batches are kept on",
        "disk, shared by every process of the gateway, and survive restarts. As on Anthropic, each",
        "request's `params` are checked when it runs: an invalid one is an `errored` result whose",
        "message names the field where the batch request holds it",
        "(`requests.3.params.thinking.enabled.budget_tokens: ...`); an upstream's own error is",
        "passed on as the upstream said it.",
        "",
        *batch_fields(),
        "",
        "## Files (`/v1/files`)",
        "",
        "Upload (multipart), list, retrieve metadata and delete are served; files are kept in a",
        'directory (`files.dir`). An image or document block whose source is `{"type": "file"}`',
        "gets the file's content in its place (base64 for images and PDFs, text for text files) on both",
        "paths, in token counting and in batches. Uploaded files cannot be downloaded, as on Anthropic.",
        "Files have no `scope` (sessions are not served), so a list filtered by `scope_id` is empty.",
        "An upload's `expires_in_seconds` is honoured: `expires_at` is reported, and an expired file is a",
        "404 `file_expired` when a request names it. An upload with no filename (or an empty one) is",
        "named `unnamed` plus its type's extension, as on Anthropic; a text file is read in the charset",
        "its upload declared (if none, or no text encoding: as its byte order mark says, else UTF-8).",
        "A file is used as what its first bytes show (a PDF, a JPEG, PNG, GIF or WebP image, or UTF-8 or",
        "UTF-16 text) where its declared type is no help: `application/octet-stream` (raw bytes uploaded",
        "without a name or type, or a name `mimetypes` does not know, like `.jsonl`) or a type the bytes",
        "contradict; its metadata keeps the type it was uploaded with. Anthropic refuses such a file as a",
        "document (`Unsupported document file format: application/octet-stream`).",
        "",
    ]
    print("\n".join(parts))


def _sdk_version() -> str:
    import anthropic

    return anthropic.__version__


if __name__ == "__main__":
    assert msgspec  # the protocol types are msgspec structs
    main()
