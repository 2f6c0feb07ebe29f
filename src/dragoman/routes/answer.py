"""`respond = "count"`: a `max_tokens: 1` count probe (Claude Code's fallback when
`count_tokens` answers 404) answered here, with the true input count and no upstream call.
`Counted`: a `count_tokens` request whose count a route asked for already, answered with it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from dragoman.calls.types import Call, Completed, Reply, Route, Streaming, UpstreamModel
from dragoman.core.ids import message_id
from dragoman.protocol import anthropic as a


class CountAnswer:
    """A backend that serves nothing but the count it was made with."""

    name = "local"

    def __init__(self, input_tokens: int, route: str) -> None:
        self.input_tokens = input_tokens
        self._headers = {"x-dragoman-route": route}

    @property
    def path(self) -> str:
        return "local"

    async def messages(self, call: Call, route: Route) -> Reply:
        usage = a.Usage(input_tokens=self.input_tokens, output_tokens=0)
        message = a.Message(id=message_id(), model=call.model, content=[a.OutTextBlock(text="")], stop_reason="max_tokens",
                            stop_sequence=None, usage=usage)  # fmt: skip
        if not call.stream:
            return Completed(msgspec.json.encode(message), headers=dict(self._headers))
        return Streaming(_events(message), headers=dict(self._headers))

    async def count_tokens(self, call: Call, route: Route) -> Reply:
        return Completed(msgspec.json.encode(a.CountTokensResponse(input_tokens=self.input_tokens)))

    async def list_models(self) -> list[UpstreamModel]:
        return []

    async def tool_support(self, models: list[UpstreamModel]) -> list[UpstreamModel]:
        return models

    async def close(self) -> None:
        pass


def _event(kind: str, data: dict[str, object]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode({"type": kind, **data}) + b"\n\n"


async def _events(message: a.Message) -> AsyncIterator[bytes]:
    start = msgspec.to_builtins(message)
    start["content"], start["stop_reason"] = [], None
    yield b"".join((
        _event("message_start", {"message": start}),
        _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        _event("content_block_stop", {"index": 0}),
        _event("message_delta", {"delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                                 "usage": {"input_tokens": message.usage.input_tokens, "output_tokens": 0}}),
        _event("message_stop", {}),
    ))  # fmt: skip


class Counted:
    """The request's own backend, whose `count_tokens` answer is the one routing asked it for
    (the same call): a `count_tokens` request behind an `input_tokens` route is counted once."""

    def __init__(self, reply: Completed, backend: Any) -> None:
        self._reply = reply
        self._backend = backend

    def __getattr__(self, name: str) -> Any:  # name, path, messages, ...: the backend's own
        return getattr(self._backend, name)

    async def count_tokens(self, call: Call, route: Route) -> Reply:
        return self._reply
