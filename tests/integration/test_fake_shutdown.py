"""The scripted upstream fakes stop without leaving anything to be collected later: a fake's
loop stopped with a request handler still pending (an idle keep-alive connection waiting for
its next request, a stream sleeping between chunks) shows up, once collected, as asyncio's
"Task was destroyed but it is pending!" or as an unclosed event loop, in whatever test runs then."""

from __future__ import annotations

import gc
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.fake_anthropic import FakeAnthropic, NativeReply, text_events
from tests.support.fakes import FakeUpstream, text_stream

Fake = FakeUpstream | FakeAnthropic


def _upstream() -> tuple[FakeUpstream, str]:
    return FakeUpstream().start(), "/chat/completions"


def _native() -> tuple[FakeAnthropic, str]:
    return FakeAnthropic().start(), "/v1/messages"


def _script_slow_stream(fake: Fake) -> None:
    """A stream whose head and first event are written, then a pause far longer than any test."""
    if isinstance(fake, FakeUpstream):
        first, *rest = text_stream("Hello")
        fake.stream_reply([first, ("sleep", 60.0), *rest])
    else:
        first, *rest = text_events()
        fake.replies.append(NativeReply(events=[first, ("sleep", 60.0), *rest]))


FAKES: dict[str, Callable[[], tuple[Any, str]]] = {"openai": _upstream, "anthropic": _native}
BODY = {"model": "test-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def leftovers(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[str]]]:
    """What collecting the garbage reports once the test has run a scenario: asyncio's errors,
    unraisable exceptions, ResourceWarnings."""
    gc.collect()  # what earlier tests in this worker left is theirs, not this scenario's
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda hooked: unraisable.append(f"unraisable: {hooked.exc_value!r}"))
    caplog.set_level(logging.ERROR, logger="asyncio")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)

        def collect() -> list[str]:
            gc.collect()
            return (unraisable + [f"{w.category.__name__}: {w.message}" for w in caught]
                    + [f"asyncio: {r.getMessage()}" for r in caplog.records if r.name == "asyncio"])  # fmt: skip

        yield collect


def _stop_with_an_idle_connection(kind: str) -> None:
    fake, path = FAKES[kind]()
    with httpx.Client(base_url=fake.url) as client:
        assert client.post(path, json=BODY).status_code == 200  # the connection stays open, idle
        fake.stop()


def _stop_in_the_middle_of_a_stream(kind: str) -> None:
    fake, path = FAKES[kind]()
    _script_slow_stream(fake)
    with (
        httpx.Client(base_url=fake.url) as client,
        client.stream("POST", path, json={**BODY, "stream": True}) as response,
    ):
        assert next(response.iter_bytes()).startswith(
            b"data: " if kind == "openai" else b"event: "
        )  # the handler now sleeps
        fake.stop()


# Each scenario runs in a function of its own, so that nothing refers to the fake once it returns
# and `gc.collect()` here collects it, and its loop, now rather than in some later test.
@pytest.mark.parametrize("kind", FAKES)
def test_a_fake_stopped_with_an_idle_keep_alive_connection_leaves_nothing_pending(kind, leftovers):
    _stop_with_an_idle_connection(kind)
    assert leftovers() == []


@pytest.mark.parametrize("kind", FAKES)
def test_a_fake_stopped_in_the_middle_of_a_stream_leaves_nothing_pending(kind, leftovers):
    _stop_in_the_middle_of_a_stream(kind)
    assert leftovers() == []
