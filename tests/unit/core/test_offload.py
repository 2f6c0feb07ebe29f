"""Slow work off the event loop: a few threads of its own, and a bounded queue before them."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dragoman.core import offload
from dragoman.core.errors import Overloaded


def test_past_the_waiting_bound_a_call_is_refused_with_a_529(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offload, "MAX_WAITING", 1)
    release = threading.Event()

    async def main() -> None:
        busy = [asyncio.create_task(offload.offload(release.wait, 10)) for _ in range(offload.WORKERS + 1)]
        await asyncio.sleep(0)  # each has taken its place
        with pytest.raises(Overloaded) as refused:
            await offload.offload(len, "x")
        assert refused.value.status == 529
        release.set()
        assert await asyncio.gather(*busy) == [True] * (offload.WORKERS + 1)
        assert await offload.offload(len, "abc") == 3  # places free again

    asyncio.run(main())
