"""A scripted Anthropic-native upstream (`/v1/messages`) on a real loopback socket."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from dragoman.core.config import Config
from dragoman.core.config_load import from_dict
from tests.support.threaded_site import ThreadedSite


def message(text: str = "Hi", model: str = "native-model", **usage: Any) -> dict:
    """A reply with every field the SDKs type (the gateway passes it unchanged); `usage` as
    given (cache_creation_input_tokens, ...), 7 input and 2 output tokens unless said."""
    return {
        "id": "msg_native", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
        "stop_details": None, "container": None, "diagnostics": None,
        "usage": {"input_tokens": 7, "output_tokens": 2, **usage},
    }  # fmt: skip


def event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def text_events(text: str = "Hello", model: str = "native-model", **usage: Any) -> list[bytes]:
    """A whole stream of `text`; `usage` goes in message_start's (as Anthropic's input counts do)."""
    start = message("", model, **usage)
    start["content"] = []
    return [
        event("message_start", {"type": "message_start", "message": start}),
        event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        ),
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None, "stop_details": None, "container": None},
                "usage": {"output_tokens": 3},
            },
        ),
        event("message_stop", {"type": "message_stop"}),
    ]


@dataclass
class NativeReply:
    status: int = 200
    body: Any = None
    # bytes, ("sleep", seconds), "drop" (the connection breaks) or "close" (it is closed, a FIN, after what was written: the head at least)
    events: list[Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    hang: float = 0.0  # seconds to wait before answering


class FakeAnthropic:
    def __init__(self) -> None:
        self.replies: deque[NativeReply] = deque()
        self.requests: list[tuple[str, dict, dict[str, str]]] = []
        self.disconnects = 0
        self.owned_by: str | None = None  # in the model list: llama-server says "llamacpp"
        self.models_down = False  # the model list answers 503 (a server still starting)
        self.no_model_list = False  # the model list answers 404 (a server without one)
        self.model_lists = 0  # model lists asked for
        self.responder: Callable[[dict], NativeReply] | None = None  # the reply to a body, once `replies` are out
        app = web.Application()
        app.router.add_post("/v1/messages", self._handle)
        app.router.add_post("/v1/messages/count_tokens", self._handle)
        app.router.add_get("/v1/models", self._models)
        self._site = ThreadedSite(app)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeAnthropic:
        self.port = self._site.start()
        return self

    def stop(self) -> None:
        self._site.stop()

    async def _sleep_watching(self, request: web.Request, seconds: float) -> None:
        """Sleep, but notice at once when the gateway closes the connection."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            if request.transport is None or request.transport.is_closing():
                raise ConnectionResetError("the gateway closed the connection")
            await asyncio.sleep(0.01)

    async def _models(self, request: web.Request) -> web.Response:
        self.model_lists += 1
        if self.models_down:
            return web.json_response(
                {"type": "error", "error": {"type": "overloaded_error", "message": "starting"}}, status=503
            )
        if self.no_model_list:
            return web.json_response(
                {"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}}, status=404
            )
        model = {"type": "model", "id": "native-model", "display_name": "Native"}
        if self.owned_by is not None:
            model["owned_by"] = self.owned_by
        return web.json_response({"data": [model], "has_more": False})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.path, await request.json(), dict(request.headers)))
        if self.replies:
            reply = self.replies.popleft()
        else:
            reply = NativeReply(body=message()) if self.responder is None else self.responder(self.requests[-1][1])
        if reply.hang:
            await self._sleep_watching(request, reply.hang)
        if isinstance(reply.body, bytes):  # a raw body: its content-type in `headers`
            return web.Response(body=reply.body, status=reply.status, headers=reply.headers)
        if reply.events is None:
            return web.json_response(reply.body, status=reply.status, headers=reply.headers)
        response = web.StreamResponse(
            status=reply.status, headers={"content-type": "text/event-stream", **reply.headers}
        )
        await response.prepare(request)
        try:
            for item in reply.events:
                if item == "drop":  # the connection breaks here
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                if item == "close":
                    await response.write(b"")  # the head, if no event sent it (aiohttp holds it until the first)
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if isinstance(item, tuple):
                    await self._sleep_watching(request, item[1])
                else:
                    await response.write(item)
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects += 1
            raise
        return response


ASK = {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}


def passthrough_config(native: FakeAnthropic, **server: object) -> Config:
    """A gateway passing `claude-test` through to `native` as `native-model` (no retries)."""
    return from_dict({
        "server": server,
        "upstreams": {
            "native": {"url": native.url + "/v1", "protocol": "anthropic", "api_key": "upstream-secret", "max_retries": 0}
        },
        "models": [{"name": "claude-test", "upstream": "native", "upstream_model": "native-model"}],
    })  # fmt: skip
