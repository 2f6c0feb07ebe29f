"""`Attempts` without a server: a fallback to another upstream takes one of its slots, and
one whose answer is refused (its own 529, an overloaded stream) gives it back as the request
moves on, not when it ends; a target lacking what the request needs is skipped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dragoman.calls.types import Call, Completed, Outcome, Reply, Route, Streaming
from dragoman.core.capabilities import ModelCaps
from dragoman.core.errors import UpstreamError
from dragoman.routes.fallbacks import Attempts, Cooldowns
from dragoman.routes.settings import FallbackSettings
from dragoman.routes.shape import Shape

BODY = b'{"model": "main", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}'
OVERLOADED = b'{"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}'
OK = b'event: message_start\ndata: {"type": "message_start", "message": {}}\n\nevent: message_stop\ndata: {}\n\n'


class Slots:
    def __init__(self) -> None:
        self.taken = 0

    async def acquire(self, *, queue: bool = True) -> None:
        self.taken += 1

    def release(self) -> None:
        self.taken -= 1


class Scripted:
    """A backend answering as told: a status, or a stream of the given chunks."""

    name, path = "fake", "passthrough"

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def messages(self, call: Call, route: Route) -> Reply:
        if isinstance(self.answer, Exception):
            raise self.answer
        if isinstance(self.answer, int):
            return Completed(OVERLOADED, status=self.answer)
        return Streaming(_chunks(self.answer))


async def _chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def attempts(answers: dict[str, Any], slots: dict[str, Slots], body: bytes = BODY,
             caps: dict[str, tuple[str, ModelCaps, int | None]] | None = None) -> Attempts:  # fmt: skip
    routes = {name: Route(Scripted(answer), f"up-{name}", name, ModelCaps()) for name, answer in answers.items()}  # type: ignore[arg-type]
    for name, (path, model_caps, window) in (caps or {}).items():
        backend = Scripted(answers[name])
        backend.path = path
        routes[name] = Route(backend, f"up-{name}", name, model_caps, window)  # type: ignore[arg-type]

    async def resolve(name: str) -> Route:
        return routes[name]

    settings = FallbackSettings()
    return Attempts(primary=routes["main"], primary_name="main", fallbacks=["b", "c"], context_fallbacks=[],
                    resolve=resolve, shape=Shape("main", {}, body), cooldowns=Cooldowns(settings), settings=settings,
                    retry_budget=30.0, header=None, windows={}, slots=slots)  # fmt: skip


def test_a_refused_answer_gives_its_slot_back_before_the_request_ends():
    slots = {"up-b": Slots(), "up-c": Slots()}
    chain = attempts({"main": UpstreamError("down"), "b": 529, "c": [OK]}, slots)
    outcome = Outcome(request_id="r", endpoint="messages")
    call = Call(body=BODY, model="main", upstream_model="main", headers={}, request_id="r", outcome=outcome)

    async def run() -> None:
        reply = await chain.messages(call, chain.primary)
        assert isinstance(reply, Streaming)
        assert slots["up-b"].taken == 0 and slots["up-c"].taken == 1  # b's is back; c serves, holding its own
        outcome.finish.end()
        assert slots["up-c"].taken == 0

    asyncio.run(run())


def test_a_stream_overloaded_before_content_gives_its_slot_back_as_the_next_one_starts():
    overloaded = [b"event: error\ndata: " + OVERLOADED + b"\n\n"]
    slots = {"up-b": Slots(), "up-c": Slots()}
    chain = attempts({"main": UpstreamError("down"), "b": overloaded, "c": [OK]}, slots)
    outcome = Outcome(request_id="r", endpoint="messages")
    call = Call(body=BODY, model="main", upstream_model="main", headers={}, request_id="r", stream=True,
                outcome=outcome)  # fmt: skip

    async def run() -> None:
        reply = await chain.messages(call, chain.primary)
        assert isinstance(reply, Streaming) and slots["up-b"].taken == 1  # b's stream is read lazily
        body = b"".join([chunk async for chunk in reply.chunks])
        assert b"message_stop" in body and b"overloaded" not in body
        assert slots["up-b"].taken == 0 and slots["up-c"].taken == 1
        outcome.finish.end()
        assert slots["up-b"].taken == 0 and slots["up-c"].taken == 0  # released once each

    asyncio.run(run())


def test_a_target_without_what_the_request_needs_is_passed_over():
    search = (
        b'{"model": "main", "max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305", "name": "w"}]}'
    )
    image = b'{"model": "main", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}'
    cases = [  # what b lacks, and the request that needs it
        (search, ("translate", ModelCaps(drop_server_tools=False), None)),  # runs no server tools, drops none
        (image, ("passthrough", ModelCaps(vision=False), None)),
        (BODY, ("passthrough", ModelCaps(), 10)),  # its window is smaller than the prompt
    ]
    for body, lacking in cases:
        chain = attempts({"main": UpstreamError("down"), "b": [OK], "c": [OK]}, {}, body, {"b": lacking})
        chain.shape.tokens = 50
        call = Call(body=body, model="main", upstream_model="main", headers={}, request_id="r")
        asyncio.run(chain.messages(call, chain.primary))
        assert chain.tried == ["main", "c"], lacking
