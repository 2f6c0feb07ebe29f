"""Waiting for what a test can only observe from outside: one bounded helper that fails
saying what it waited for.

Prefer an event the code under test (or a fake) sets; poll only what a test can merely read
(a counter, a file, a log line, a metric). Never sleep a guessed time instead."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def eventually(predicate: Callable[[], T], what: str = "the condition", timeout: float = 5.0, every: float = 0.01) -> T:
    """Poll `predicate` until it returns something truthy, and return that; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(every)


async def eventually_async(
    predicate: Callable[[], T], what: str = "the condition", timeout: float = 5.0, every: float = 0.01
) -> T:
    """`eventually` inside an event loop: the loop runs between polls."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        await asyncio.sleep(every)
