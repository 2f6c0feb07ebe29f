"""The usage store as the console reads it: what this process holds written first, and
each read bounded by the writer's guard (a 503 while the store is away, never a hang)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from dragoman.core.errors import NotFound, StoreUnavailable
from dragoman.usage.outage import RETRY_AFTER
from dragoman.usage.records import UsageStore

if TYPE_CHECKING:
    from dragoman.assembly.gateway import Gateway

T = TypeVar("T")


async def store_of(gateway: Gateway) -> UsageStore:
    """The usage store, with what this process holds written to it; a 404 if usage is off."""
    writer = gateway.usage
    if writer is None:
        raise NotFound("usage accounting is off (usage.enabled = false): the console's charts need it")
    if not await writer.guard(asyncio.shield(writer.current())):  # (a flush cut short would hold the writer)
        raise StoreUnavailable("the usage store cannot be reached now; try again shortly", retry_after=RETRY_AFTER)
    return writer.store


async def guarded(gateway: Gateway, read: Awaitable[T]) -> T:
    assert gateway.usage is not None
    return await gateway.usage.guard(read)
