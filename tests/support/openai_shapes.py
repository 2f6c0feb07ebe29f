"""OpenAI Chat Completions bodies as an upstream sends them, as plain dicts: the one
definition the unit tests (decoded, `helpers`) and the fake upstreams (`fakes`) share."""

from __future__ import annotations

from typing import Any

MODEL = "served-model"


def usage(prompt: int = 10, completion_tokens: int = 5, cached: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def completion_dict(
    content: str | None = "Hello!",
    *,
    finish: str | None = "stop",
    tool_calls: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    **message: Any,
) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content, **message}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def usage_chunk(prompt: int = 10, completion_tokens: int = 5, cached: int | None = None) -> dict[str, Any]:
    body = chunk(usage=usage(prompt, completion_tokens, cached))
    body["choices"] = []
    return body
