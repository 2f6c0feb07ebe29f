"""A request cancelled at shutdown (past the grace period) is answered 529, and its task is
no longer marked as being cancelled once it has been (what it runs next relies on that)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from dragoman.assembly.observe import Metrics
from dragoman.server import app as app_module
from dragoman.server.app import App


@pytest.mark.parametrize("again_while_answering", [False, True])
def test_a_request_cancelled_at_shutdown_is_answered_and_its_task_not_left_cancelling(
    monkeypatch: pytest.MonkeyPatch, again_while_answering: bool
) -> None:
    serving = asyncio.Event()

    async def serve(*args: object) -> None:
        serving.set()
        await asyncio.Event().wait()  # a request the shutdown outlives

    monkeypatch.setattr(app_module.endpoints, "serve", serve)
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        answering = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if again_while_answering and len(sent) == 1:
                answering.set()
                await asyncio.Event().wait()  # the client reads nothing: cancelled again meanwhile

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def request() -> int:
            scope = {"type": "http", "method": "POST", "path": "/v1/messages", "headers": [], "query_string": b""}
            await App(SimpleNamespace(state=None), SimpleNamespace(metrics=Metrics()))(scope, receive, send)  # type: ignore[arg-type]
            task = asyncio.current_task()
            assert task is not None
            return task.cancelling()

        task = asyncio.ensure_future(request())
        await serving.wait()
        task.cancel()  # the server stopping past its grace period
        if again_while_answering:
            await answering.wait()
            task.cancel()
        assert await task == 0

    asyncio.run(main())
    assert sent[0]["status"] == 529
    if not again_while_answering:
        assert json.loads(sent[1]["body"])["error"]["type"] == "overloaded_error"
