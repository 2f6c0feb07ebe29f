"""Gateway.close: what the gateway runs in the background (a /ready round, discovery of an
upstream that was down) is cancelled and awaited, never left pending as the loop closes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dragoman.assembly.gateway import Gateway
from dragoman.calls.types import UpstreamModel
from dragoman.core.config_load import from_dict


class _Hung:
    """A backend whose model list never comes."""

    path = "translate"

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.closed = False

    async def list_models(self) -> list[UpstreamModel]:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        self.closed = True


def _gateway(tmp_path: Path, backend: _Hung) -> Gateway:
    config = from_dict({"server": {"registry_cache": "", "default_model": "m"}, "batches": {"dir": str(tmp_path / "batches")},
                        "files": {"dir": str(tmp_path / "files")}, "upstreams": {"up": {"url": "http://127.0.0.1:9/v1"}}})  # fmt: skip
    backends: Any = {"up": backend}
    return Gateway(config, backends)


def _pending() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task is not asyncio.current_task() and not task.done()]


def test_closing_during_a_ready_round_leaves_no_task_pending(tmp_path: Path) -> None:
    async def main() -> None:
        backend = _Hung()
        gateway = _gateway(tmp_path, backend)
        probe = asyncio.ensure_future(gateway.reachable_upstreams())  # a /ready request
        await backend.asked.wait()
        await gateway.close()
        with pytest.raises(asyncio.CancelledError):  # its round was cancelled
            await probe
        assert _pending() == [] and backend.closed

    asyncio.run(main())


def test_closing_during_background_discovery_leaves_no_task_pending(tmp_path: Path) -> None:
    async def main() -> None:
        backend = _Hung()
        gateway = _gateway(tmp_path, backend)
        await gateway.route("m")  # the upstream's list is unknown: asked again in the background
        await backend.asked.wait()
        await gateway.close()
        assert _pending() == [] and backend.closed

    asyncio.run(main())


def test_what_was_process_state_is_the_gateways_and_closes_with_it(tmp_path: Path) -> None:
    """The slow-work threads and the bodies read past their stream's end are the gateway's own:
    a second gateway shares none of it, and closing one stops them."""
    first, second = _gateway(tmp_path, _Hung()), _gateway(tmp_path, _Hung())
    assert first.shared.offload is not second.shared.offload and first.shared.redactor is not second.shared.redactor

    class _OpenBody:
        ended = closed = False

        async def readany(self) -> bytes:
            await asyncio.Event().wait()
            return b""

        def close(self) -> None:
            self.closed = True

    async def main() -> _OpenBody:
        body = _OpenBody()
        first.shared.ends.end_body(body)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # its read has begun
        await first.close()
        return body

    assert asyncio.run(main()).closed  # not left to the grace: closed with the gateway
    with pytest.raises(RuntimeError):  # its threads take no more work
        asyncio.run(first.shared.offload(len, "x"))
