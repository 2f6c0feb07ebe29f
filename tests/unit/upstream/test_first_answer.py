"""`HttpClient.first_answer` (a model list, the protocol probe over the instances): an
instance's failing answer is told at the timeout, and the answers it does not take are
retrieved, never logged later as "never retrieved". Instances are stand-ins for `_ask`."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from dragoman.core.config import OpenAIUpstream
from dragoman.core.errors import UpstreamError
from dragoman.core.redaction import Redactor
from dragoman.upstream import hedge
from dragoman.upstream.client import HttpClient
from dragoman.upstream.replicas import Replicas

Answer = tuple[int, str, bytes]


def client(instances: int) -> HttpClient:
    roots = [f"http://127.0.0.1:{9 + n}" for n in range(instances)]  # never connected to: `_ask` is replaced
    return HttpClient("up", OpenAIUpstream(url=roots[0], replicas=roots[1:], max_retries=0), None, redactor=Redactor())


def asked_in_turn(up: HttpClient, *answers: Callable[[], Coroutine[Any, Any, Answer]]) -> None:
    """The first instance asked gives the first answer, the next the second, and so on."""
    turn = iter(answers)

    async def ask(root: str, *args: object) -> Answer:
        return await next(turn)()

    up._ask = ask  # type: ignore[method-assign]


async def silent() -> Answer:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def test_a_failing_answer_is_told_at_the_timeout_not_a_timeout() -> None:
    """One instance answers 503 at once, the other stays silent until the timeout: the 503."""

    async def starting() -> Answer:
        return 503, "text/plain", b"loading model"

    async def main() -> None:
        up = client(2)
        asked_in_turn(up, starting, silent)
        assert await up.get("/models", timeout=0.2) == (503, b"loading model")
        await up.close()

    asyncio.run(main())


async def answered() -> Answer:
    return 200, "application/json", b'{"data": []}'


async def fails_as_cancelled() -> Answer:
    """Silent, then ends with an error of its own when cancelled (its connection fails as it is closed)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        raise UpstreamError("upstream up is unreachable: reset") from None
    raise AssertionError("unreachable")


@pytest.mark.parametrize("scenario", ["same round", "cancelled"])
def test_answers_not_taken_are_retrieved_never_logged_later(monkeypatch: pytest.MonkeyPatch, scenario: str) -> None:
    """The first instance is hedged; the second's answer is taken. What the first ends with,
    an error in the same round ("same round") or one raised as it is cancelled
    ("cancelled"), is not logged later as a task exception never retrieved."""
    monkeypatch.setattr(hedge, "HEDGE_AFTER", 0.001)
    unretrieved: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unretrieved.append(context))
        up = client(2)
        for _ in range(20):  # a round's answers are looked at in a set's order: each order, most likely
            go = asyncio.Event()

            async def slow(go: asyncio.Event = go) -> Answer:
                await go.wait()
                return await answered()

            async def refused(go: asyncio.Event = go) -> Answer:
                go.set()  # the first ends just before this one: both in the same round
                raise UpstreamError("upstream up is unreachable: refused")

            asked_in_turn(up, *((slow, refused) if scenario == "same round" else (fails_as_cancelled, answered)))
            assert await up.get("/models") == (200, b'{"data": []}')
            up.replicas = Replicas("up", up.roots, trial_for=600)  # none passed over
        gc.collect()
        await up.close()

    asyncio.run(main())
    assert unretrieved == []
