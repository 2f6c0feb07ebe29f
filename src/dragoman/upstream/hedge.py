"""One answer from any instance, for a request that costs the server nothing (a model list,
the protocol probe): the instances are asked in turn, the next at once after a failure or
alongside one still silent after HEDGE_AFTER seconds, so that one instance that hangs does
not fail it. The retrying POST (`upstream.client`) never hedges: a prompt costs GPU time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from dragoman.core.errors import GatewayError
from dragoman.upstream.errors import upstream_errors

HEDGE_AFTER = 1.0  # seconds a request waits on one instance before the next is asked too

Answer = tuple[int, str, bytes]  # status, content type, body


async def first_answer(
    upstream: str,
    roots: list[str],
    ask: Callable[[str], Awaitable[Answer]],
    *,
    timeout: float,
    accept: Callable[[int, str], bool],
    on_silent: Callable[[str], None] | None = None,
    hedge_after: float = HEDGE_AFTER,
) -> Answer:
    """The first answer `accept` takes of `ask` sent to each of `roots`, each once. `timeout`
    bounds the whole; the last failure is raised, or the last answer returned, at the timeout
    too (an instance that answered 503 is told as such, not as a timeout); the next instance is
    asked alongside one still silent after `hedge_after` seconds. `on_silent` is told
    of the instances still silent when one answered. What is still asked at the end is
    cancelled, which closes its connection: the instance stops working on it."""
    waiting = list(roots)
    asking: dict[asyncio.Future[Answer], str] = {}
    failed: Answer | GatewayError | None = None
    try:
        with upstream_errors(upstream):
            try:
                async with asyncio.timeout(timeout):
                    while waiting or asking:
                        if waiting:  # the first, or the next after a failure or a silence
                            root = waiting.pop(0)
                            asking[asyncio.ensure_future(ask(root))] = root
                        done, _ = await asyncio.wait(
                            asking, timeout=hedge_after if waiting else None, return_when=asyncio.FIRST_COMPLETED
                        )
                        for task in done:
                            root = asking.pop(task)
                            error = task.exception()
                            if error is None and accept(*task.result()[:2]):
                                if on_silent is not None:
                                    for other, silent in asking.items():
                                        if not other.done():
                                            on_silent(silent)
                                return task.result()
                            if error is not None and not isinstance(error, GatewayError):
                                raise error
                            failed = task.result() if error is None else error
            except TimeoutError:
                if failed is None:  # no instance answered: the timeout is the news
                    raise TimeoutError(f"no instance answered within {timeout:g} s") from None
    finally:
        for task in asking:
            task.cancel()
        if asking:
            await asyncio.wait(asking)
            for (
                task
            ) in asking:  # cancel() silences an error a task had already; not one it ends with as it is cancelled
                if not task.cancelled():
                    task.exception()  # retrieved (of no interest), so never logged as "never retrieved"
    if isinstance(failed, GatewayError):
        raise failed
    assert failed is not None
    return failed
