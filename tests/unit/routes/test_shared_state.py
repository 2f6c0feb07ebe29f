"""Sessions and cool-downs through real Redis: two gateway processes (two route tables, one
test process) see what the other noted; without Redis, or with it down, each keeps its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from dragoman.calls.types import Call, Completed, Outcome, Route
from dragoman.core.capabilities import ModelCaps
from dragoman.core.config_load import from_dict
from dragoman.protocol.anthropic import MESSAGES_REQUEST
from dragoman.routes.table import Routes

BODY = b'{"model": "main", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}'
LONG = {"name": "long", "when": {"input_tokens": {"gt": 1000}}, "model": "long", "sticky": "session"}


class Counting:
    """A backend whose count is whatever the test sets."""

    name, path = "count", "translate"
    count = 10

    async def count_tokens(self, call: Call, route: Any) -> Completed:
        return Completed(b'{"input_tokens": %d}' % self.count)


def table(url: str | None, prefix: str = "") -> tuple[Routes, Counting]:
    models = [{"name": "main", "upstream": "u", "context_window": 100_000, "fallbacks": ["long"]},
              {"name": "long", "upstream": "u", "context_window": 1_000_000}]  # fmt: skip
    limits = {"redis_url": url, "redis_prefix": prefix, "redis_timeout": 0.2} if url else {}
    config = from_dict({"upstreams": {"u": {"url": "http://127.0.0.1:1/v1"}}, "models": models, "routes": [LONG],
                        "limits": limits})  # fmt: skip
    counting = Counting()

    async def resolve(name: str) -> Route:
        return Route(counting, "u", name, ModelCaps(), 100_000)  # type: ignore[arg-type]

    return Routes(config, resolve), counting


async def route(routes: Routes, session: str, request_id: str = "r") -> str:
    outcome = Outcome(request_id=request_id, endpoint="messages")
    headers = {"x-claude-code-session-id": session}
    await routes.route(BODY, headers, MESSAGES_REQUEST.decode(BODY), "messages", outcome)
    return outcome.route


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Awaits `check` (a request routed: it awaits too) until it holds."""
    for _ in range(100):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(what)


def test_a_session_that_took_a_sticky_route_keeps_it_in_every_process(redis_url, redis_prefix):
    async def run() -> None:
        (one, counted), (two, _) = table(redis_url, redis_prefix), table(redis_url, redis_prefix)
        try:
            counted.count = 5000
            assert await route(one, "s-1") == "long"
            assert await route(two, "s-2") == ""  # a short prompt of another session
            await until(lambda: _routed(two, "s-1", "long"), "the second process keeps the first's session")
            keys = [key async for key in one.sessions.shared.client.scan_iter(match=redis_prefix + "*")]  # type: ignore[union-attr]
            assert keys and all([await one.sessions.shared.client.pttl(k) > 0 for k in keys])  # type: ignore[union-attr]
        finally:
            await one.close()
            await two.close()

    asyncio.run(run())


def test_a_sessions_reported_size_moves_it_up_in_every_process(redis_url, redis_prefix):
    async def run() -> None:
        (one, _), (two, _) = table(redis_url, redis_prefix), table(redis_url, redis_prefix)
        try:
            assert await route(one, "s-3", "r-3") == ""
            outcome = Outcome(request_id="r-3", endpoint="messages", input_tokens=200, cache_read_tokens=4000)
            one.finished(outcome, 1.0)  # its reply said the prompt was 4200 tokens
            await until(lambda: _routed(two, "s-3", "long"), "the other process moves the session up")
        finally:
            await one.close()
            await two.close()

    asyncio.run(run())


def test_a_cool_down_in_one_process_holds_in_the_others(redis_url, redis_prefix):
    async def run() -> None:
        (one, _), (two, _) = table(redis_url, redis_prefix), table(redis_url, redis_prefix)
        try:
            await route(two, "s-4")  # its poll of the cool-downs starts with its first request
            one.cooldowns.failed("main", at_once=True)  # the upstream refused it: cooled at once
            assert one.cooldowns.cooled("main")

            async def cooled() -> bool:
                return two.cooldowns.cooled("main")

            await until(cooled, "the other process passes the model over too")
            assert not two.cooldowns.cooled("long")
        finally:
            await one.close()
            await two.close()

    asyncio.run(run())


def test_without_redis_or_with_it_down_each_process_keeps_its_own(dead_port):
    async def run() -> None:
        for url in (None, f"redis://127.0.0.1:{dead_port}/0"):
            (one, counted), (two, _) = table(url), table(url)
            try:
                counted.count = 5000
                assert await route(one, "s-5") == "long"
                await asyncio.sleep(0.1)  # pacing: time for a sharing that must not happen
                assert await route(two, "s-5") == "" and await route(one, "s-5") == "long"
            finally:
                await one.close()
                await two.close()

    asyncio.run(run())


async def _routed(routes: Routes, session: str, name: str) -> bool:
    return await route(routes, session) == name
