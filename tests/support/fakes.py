"""A scripted OpenAI-compatible upstream on a real loopback socket.

Tests queue replies (`json_reply`, `stream_reply`, `error_reply`) and read back the
requests the gateway made. Chunk shapes mirror what vLLM, llama.cpp and Ollama send.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.openai_shapes import chunk, completion_dict, usage, usage_chunk  # noqa: F401 (shared)
from tests.support.threaded_site import ThreadedSite


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # JSON body for non-streaming replies
    chunks: list[Any] | None = None  # stream: dicts (sent as data: JSON), raw bytes, ("sleep", seconds),
    # or ("wait", threading.Event): the stream pauses there until the test sets the event
    headers: dict[str, str] = field(default_factory=dict)
    done: bool = True  # send data: [DONE]
    hang: float = 0.0  # seconds to wait before answering
    hold: threading.Event | None = (
        None  # answer only once the test sets it: "in flight until X happened", with no timing to guess
    )
    drop: bool = False  # stream: abort the TCP connection after the chunks (no [DONE], no end of body)
    cut: bool = False  # stream: close the connection (a FIN) after the chunks, its head sent even with none (a replica restarting)


def completion(content: str | None = "Hello!", *, finish: str = "stop", tool_calls: list | None = None,
               prompt: int = 10, completion_tokens: int = 5, cached: int | None = None, **message: Any) -> dict:  # fmt: skip
    """A whole reply, with usage, as a fake upstream serves it."""
    return completion_dict(content, finish=finish, tool_calls=tool_calls, usage=usage(prompt, completion_tokens, cached),
                           **message)  # fmt: skip


def text_stream(*pieces: str, finish: str = "stop", prompt: int = 10) -> list[Any]:
    chunks: list[Any] = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in pieces]
    chunks += [chunk({}, finish), usage_chunk(prompt, len(pieces))]
    return chunks


class FakeUpstream:
    def __init__(self, models: list[dict] | None = None, ssl_context: Any = None) -> None:
        self._ssl = ssl_context
        self.models = models if models is not None else [{"id": "test-model", "object": "model", "owned_by": "vllm"}]
        self.replies: deque[Reply] = deque()
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        # Answers a request when the queue is empty: called with the request body; None falls back to `completion()`.
        self.responder: Callable[[dict], Reply | None] | None = None
        self.disconnects = 0  # streams the gateway hung up on before they were written out
        self.show: dict[str, dict] = {}  # Ollama /api/show answers, by model
        self.tokenize_requests: list[dict] = []
        self.abandoned = 0  # requests the gateway closed while the fake was still "thinking"
        self.completed = 0  # streams written out to the end
        self.no_model_list = False  # GET /v1/models answers 404, as on a server without one
        self.template_drops_tools = False  # /tokenize counts no tools, as for a chat template without them
        self.metrics: str | None = None  # Prometheus text served at GET /metrics (None: 404, as on a server without)
        self.metrics_requests = 0
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/api/show", self._show)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/metrics", self._metrics)
        self._site = ThreadedSite(app, ssl_context)
        self.port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self.port}/v1"

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def json_reply(self, body: dict, status: int = 200, **kw: Any) -> None:
        self.queue(Reply(status=status, body=body, **kw))

    def stream_reply(self, chunks: list[Any], **kw: Any) -> None:
        self.queue(Reply(chunks=chunks, **kw))

    def start(self) -> FakeUpstream:
        self.port = self._site.start()
        return self

    def stop(self) -> None:
        self._site.stop()

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics_requests += 1
        if self.metrics is None:
            return web.Response(status=404, text="404: Not Found")
        return web.Response(text=self.metrics, content_type="text/plain", charset="utf-8")

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's chat-form /tokenize: one token per whitespace-separated word here, of the
        content and of the replayed reasoning (which a reasoning model's template renders)."""
        body = await request.json()
        self.tokenize_requests.append(body)
        words = sum(len(str(m.get(key) or "").split()) for m in body.get("messages", [])
                    for key in ("content", "reasoning", "reasoning_content"))  # fmt: skip
        words += len(json.dumps(body["tools"]).split()) if body.get("tools") and not self.template_drops_tools else 0
        return web.json_response({"count": words + 5, "max_model_len": 8192, "tokens": []})

    async def _show(self, request: web.Request) -> web.Response:
        """Ollama's model details, from `self.show[model]` (404 when absent)."""
        model = (await request.json()).get("model")
        if model not in self.show:
            return web.json_response({"error": f"model '{model}' not found"}, status=404)
        return web.json_response(self.show[model])

    async def _models(self, request: web.Request) -> web.Response:
        if self.no_model_list:
            return web.json_response({"error": {"message": "Not Found", "type": "invalid_request_error"}}, status=404)
        return web.json_response({"object": "list", "data": self.models})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        reply = self.replies.popleft() if self.replies else (self.responder(body) if self.responder else None)
        reply = reply or Reply(body=completion())
        if reply.hang or reply.hold is not None:
            loop = asyncio.get_running_loop()
            end = loop.time() + reply.hang
            while loop.time() < end or (
                reply.hold is not None and not reply.hold.is_set()
            ):  # notice a gateway that gave up on us
                if request.transport is None or request.transport.is_closing():
                    self.abandoned += 1
                    raise ConnectionResetError("the gateway closed the connection")
                await asyncio.sleep(0.01)
        if reply.chunks is None:
            return web.json_response(reply.body, status=reply.status, headers=reply.headers)
        response = web.StreamResponse(
            status=reply.status, headers={"content-type": "text/event-stream", **reply.headers}
        )
        try:
            await response.prepare(request)
            for item in reply.chunks:
                if isinstance(item, tuple) and item[0] == "sleep":
                    await asyncio.sleep(item[1])
                elif isinstance(item, tuple) and item[0] == "wait":
                    await asyncio.to_thread(item[1].wait, 10)
                elif isinstance(item, bytes):
                    await response.write(item)
                else:
                    await response.write(b"data: " + json.dumps(item).encode() + b"\n\n")
            if reply.drop:
                assert request.transport is not None
                request.transport.abort()
                return response
            if reply.cut:
                await response.write(b"")  # the head, if no chunk sent it (aiohttp holds it until the first)
                assert request.transport is not None
                request.transport.close()  # what was written goes first
                return response
            if reply.done:
                await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            self.disconnects += 1  # the gateway hung up: expected, not worth a traceback
            return response
        except asyncio.CancelledError:
            self.disconnects += 1
            raise
        self.completed += 1
        return response


def tool_call_stream(name: str, arguments: dict[str, Any], *, call_id: str = "call_1", text: str = "",
                     prompt: int = 20) -> list[Any]:  # fmt: skip
    """A streamed turn in which the model calls one function (e.g. the gateway's `web_search`),
    its arguments in two pieces, as vLLM streams them."""
    encoded = json.dumps(arguments)
    chunks: list[Any] = [chunk({"role": "assistant", "content": text})]
    chunks.append(chunk({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                         "function": {"name": name, "arguments": encoded[:5]}}]}))  # fmt: skip
    chunks.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": encoded[5:]}}]}))
    return chunks + [chunk({}, "tool_calls"), usage_chunk(prompt, 7)]


def web_search_call(query: str, call_id: str = "call_1") -> Reply:
    """The scripted model asking the gateway's `web_search` function for `query`."""
    return Reply(chunks=tool_call_stream("web_search", {"query": query}, call_id=call_id))
