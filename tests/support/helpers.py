"""Shared helpers for the unit tests: request/response builders, an Anthropic
event-grammar checker and two independent folds of a stream (ours and the
official SDK's accumulator, fed through the real SSE bytes)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from dragoman.core.capabilities import ModelCaps
from dragoman.core.profiles import PROFILES, Profile
from dragoman.protocol import anthropic as a
from dragoman.protocol import openai, sse
from dragoman.translate.request import Options, Translated, to_chat_request
from tests.support.openai_shapes import chunk, completion_dict, usage, usage_chunk  # noqa: F401 (shared)

# -- requests ---------------------------------------------------------------------


OPTIONS = Options(clock=time.monotonic)  # what a gateway tells the translation, by default


def request(**fields: Any) -> a.MessagesRequest:
    """A MessagesRequest decoded from JSON exactly as a client sends it."""
    body = {"model": "claude-test", "max_tokens": 256, **fields}
    return a.MESSAGES_REQUEST.decode(json.dumps(body).encode())


def translate(
    *,
    profile: str | Profile = "vllm",
    caps: ModelCaps | None = None,
    options: Options | None = None,
    stream: bool = False,
    **fields: Any,
) -> Translated:
    chosen = PROFILES[profile] if isinstance(profile, str) else profile
    kwargs: dict[str, Any] = {}
    if caps is not None:
        kwargs["caps"] = caps
    return to_chat_request(request(**fields), upstream_model="served-model", profile=chosen, stream=stream,
                           options=options or OPTIONS, **kwargs)  # fmt: skip


def wire(chat: openai.ChatRequest) -> dict[str, Any]:
    """The JSON body the gateway sends upstream."""
    return json.loads(openai.ENCODER.encode(chat))


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(id: str, name: str = "get_weather", input: Any = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": {"city": "Paris"} if input is None else input}


def tool_result(tool_use_id: str, content: Any = "sunny", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, **extra}


PNG_B64 = "iVBORw0KGgo="


def image(media_type: str = "image/png", data: str = PNG_B64) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


# -- upstream replies -----------------------------------------------------------


def completion(*args: Any, **kwargs: Any) -> openai.ChatCompletion:
    return decode_completion(completion_dict(*args, **kwargs))


def decode_completion(body: dict[str, Any]) -> openai.ChatCompletion:
    return openai.CHAT_COMPLETION.decode(json.dumps(body).encode())


def decode_chunk(body: dict[str, Any]) -> openai.ChatChunk:
    return openai.CHAT_CHUNK.decode(json.dumps(body).encode())


def merge_chunks(chunks: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The non-streaming completion equivalent to a chunk stream, merged the way the
    OpenAI SDK's accumulator merges (tool calls by `index`, fields concatenated)."""
    content = reasoning = refusal = ""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    last_usage = None
    for body in chunks:
        if body.get("usage"):
            last_usage = body["usage"]
        for choice in body.get("choices", [])[:1]:
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
            refusal += delta.get("refusal") or ""
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"function": {"name": None, "arguments": ""}})
                if call.get("id"):
                    slot["id"] = call["id"]
                function = call.get("function") or {}
                if function.get("name"):
                    slot["function"]["name"] = function["name"]
                arguments = function.get("arguments")
                if isinstance(arguments, dict):
                    arguments = json.dumps(arguments)
                slot["function"]["arguments"] += arguments or ""
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    extra: dict[str, Any] = {"reasoning": reasoning} if reasoning else {}
    if refusal:
        extra["refusal"] = refusal
    tool_calls = [calls[k] for k in sorted(calls)] or None
    return completion_dict(content or None, finish=finish, tool_calls=tool_calls, usage=last_usage, **extra)


# -- ids ------------------------------------------------------------------------


def tool_ids(prefix: str = "toolu_test") -> Callable[[], str]:
    """A deterministic stand-in for ids.tool_use_id."""
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter)}"


# -- Anthropic stream checks ----------------------------------------------------------

_DELTA_FOR_BLOCK = {
    "text": {"text_delta"},
    "tool_use": {"input_json_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
}


def as_dicts(events: Iterable[a.StreamEvent]) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(event) for event in events]


def check_grammar(events: list[a.StreamEvent]) -> None:
    """Assert the event grammar the SDKs rely on:

    message_start (content_block_start content_block_delta* content_block_stop)* message_delta+ message_stop

    with block indices 0, 1, 2, ... in order, never two blocks open at once, deltas
    matching their block's type, a tool block's JSON parsing to an object and a
    thinking block ending with its signature. `ping` may appear anywhere.
    """
    items = [e for e in as_dicts(events) if e["type"] != "ping"]
    assert items, "no events"
    kinds = [e["type"] for e in items]
    assert kinds[0] == "message_start", kinds
    start = items[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["stop_sequence"] is None, start
    assert start["role"] == "assistant" and start["type"] == "message"
    assert kinds[-1] == "message_stop", kinds
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1, kinds

    open_index: int | None = None
    open_type = ""
    next_index = 0
    json_text = ""
    signed = False
    seen_message_delta = False
    for event in items[1:-1]:
        kind = event["type"]
        if seen_message_delta:
            assert kind == "message_delta", f"{kind} after message_delta: {kinds}"
            continue
        if kind == "content_block_start":
            assert open_index is None, f"block {event['index']} started while block {open_index} is open: {kinds}"
            assert event["index"] == next_index, f"block index {event['index']}, expected {next_index}"
            block = event["content_block"]
            open_index, open_type, json_text, signed = event["index"], block["type"], "", False
            assert open_type in _DELTA_FOR_BLOCK, block
            if open_type == "text":
                assert block["text"] == "", block
            elif open_type == "tool_use":
                assert block["input"] == {} and block["id"] and block["name"], block
            elif open_type == "thinking":
                assert block["thinking"] == "", block
        elif kind == "content_block_delta":
            assert event["index"] == open_index, f"delta for block {event['index']} while {open_index} is open"
            delta = event["delta"]
            assert delta["type"] in _DELTA_FOR_BLOCK[open_type], f"{delta['type']} in a {open_type} block"
            assert not signed, "delta after signature_delta"
            if delta["type"] == "input_json_delta":
                json_text += delta["partial_json"]
            elif delta["type"] == "signature_delta":
                signed = True
        elif kind == "content_block_stop":
            assert event["index"] == open_index, f"stop for block {event['index']} while {open_index} is open"
            if open_type == "tool_use" and json_text.strip():
                assert isinstance(json.loads(json_text), dict), json_text
            if open_type == "thinking":
                assert signed, "thinking block closed without a signature_delta"
            open_index = None
            next_index += 1
        elif kind == "message_delta":
            assert open_index is None, f"message_delta while block {open_index} is open"
            assert event["delta"]["stop_reason"] is not None, event
            seen_message_delta = True
        else:
            raise AssertionError(f"unexpected event {kind}: {kinds}")
    assert seen_message_delta, f"no message_delta: {kinds}"


def sdk_fold(events: list[a.StreamEvent]) -> dict[str, Any]:
    """Fold the stream the way the official Python SDK does: through the SSE bytes
    the gateway writes, its SSE decoder (dispatching on the `event:` line) and its
    `accumulate_event`."""
    from anthropic._streaming import SSEDecoder
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in SSEDecoder().iter_bytes(iter([sse.encode_all(events)])):
        data = json.loads(event.data)
        assert event.event == data["type"], (event.event, data)
        if event.event == "ping":
            continue
        snapshot = accumulate_event(event=data, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return snapshot.to_dict()


_BLOCK_KEYS = {
    "text": ("type", "text"),
    "thinking": ("type", "thinking", "signature"),
    "tool_use": ("type", "id", "name", "input"),
}
_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def summary(message: a.Message | dict[str, Any]) -> dict[str, Any]:
    """What a client reads from a message: content, stop reason and sequence, usage."""
    data = msgspec.to_builtins(message) if isinstance(message, a.Message) else message
    usage_in = data["usage"]
    return {
        "content": [{k: block[k] for k in _BLOCK_KEYS[block["type"]]} for block in data["content"]],
        "stop_reason": data["stop_reason"],
        "stop_sequence": data["stop_sequence"],
        "usage": {k: usage_in.get(k) or 0 for k in _USAGE_KEYS},
    }


# -- batches on disk ----------------------------------------------------------------


def batch_path(root: Path, batch_id: str) -> Path:
    """Where batch `batch_id` is under `root`: in its owner's directory (`shared` without keys)."""
    found = sorted(root.glob(f"*/{batch_id}"))
    return found[0] if found else root / "shared" / batch_id
