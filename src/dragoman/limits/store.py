"""Token buckets and the one small interface their stores share.

A bucket holds up to `capacity` tokens and refills continuously at `per_second` (a
budget refills not at all: its key names its day or month). `take` checks every
bucket a request needs and takes from all or none, atomically; `adjust` settles a
request's real cost later. `LocalStore` keeps them in this process; `redis_store`
keeps them in Redis, shared by every worker and replica.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

PRUNE_EVERY = 60.0  # seconds between sweeps of idle buckets


@dataclass(frozen=True, slots=True)
class Want:
    """What one request asks of one bucket."""

    key: str
    capacity: float
    per_second: float  # refill rate; 0 for a budget
    cost: float  # taken when admitted (may leave the bucket below zero: a debt refilled later)
    need: float  # tokens the bucket must hold to admit (at most its capacity)
    ttl: float  # seconds an untouched bucket is kept (it is full again by then)


def kept_until(end: float, now: float) -> float:
    """The ttl of a bucket whose period ends at `end`: a minute past it, counted from the start
    of `now`'s minute, so a request's `Want` equals the one before it for a minute (and a store
    reuses its encoding, `redis_store._encode`, instead of keeping one per request)."""
    return end - now // 60 * 60 + 60


@dataclass(slots=True)
class Taken:
    admitted: bool
    levels: list[float]  # each bucket's tokens after the take (as found, when refused)
    refused: int = -1  # the bucket that refused, the one with the longest wait
    wait: float = 0.0  # seconds until that bucket admits (inf for a budget)


class Store(Protocol):
    async def take(self, wants: Sequence[Want]) -> Taken:
        """Take every want's cost if every bucket holds its need; else take nothing."""
        ...

    def adjust(self, changes: Sequence[tuple[Want, float]]) -> None:
        """Add each delta to its bucket (a refund > 0, a charge < 0); does not wait."""
        ...

    async def seed(self, changes: Sequence[tuple[Want, float]]) -> None:
        """Add each delta to its bucket only where the store holds nothing for it (a spend
        counted from the ledger, which a bucket already counting would count twice)."""
        ...

    async def close(self) -> None: ...


def wait_for(level: float, want: Want) -> float:
    """Seconds until a bucket at `level` holds `want.need`."""
    if level >= want.need:
        return 0.0
    return (want.need - level) / want.per_second if want.per_second > 0 else math.inf


def refused(levels: Sequence[float], wants: Sequence[Want]) -> Taken | None:
    """The refusal these levels mean, or None when every bucket admits."""
    waits = [wait_for(level, want) for level, want in zip(levels, wants, strict=True)]
    worst = max(range(len(waits)), key=waits.__getitem__, default=-1)
    if worst < 0 or waits[worst] <= 0:
        return None
    return Taken(False, list(levels), worst, waits[worst])


class LocalStore:
    """Buckets in this process's memory: exact for one process, per process with `--workers`."""

    def __init__(self, clock: object = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, list[float]] = {}  # key -> [tokens, at, expires]
        self._pruned = 0.0

    def _level(self, want: Want, now: float) -> float:
        bucket = self._buckets.get(want.key)
        if bucket is None:
            return want.capacity
        level = bucket[0] + (now - bucket[1]) * want.per_second
        return level if level < want.capacity else want.capacity

    def _set(self, want: Want, level: float, now: float) -> None:
        bucket = self._buckets.get(want.key)
        if bucket is None:
            self._buckets[want.key] = [level, now, now + want.ttl]
        else:
            bucket[0], bucket[1], bucket[2] = level, now, now + want.ttl

    def take_now(self, wants: Sequence[Want]) -> Taken:
        now = self._clock()  # type: ignore[operator]
        if now - self._pruned > PRUNE_EVERY:
            self._prune(now)
        levels = [self._level(want, now) for want in wants]
        for level, want in zip(levels, wants, strict=True):
            if level < want.need:
                return refused(levels, wants) or Taken(False, levels, 0, 0.0)
        for index, want in enumerate(wants):
            levels[index] -= want.cost
            self._set(want, levels[index], now)
        return Taken(True, levels)

    async def take(self, wants: Sequence[Want]) -> Taken:
        return self.take_now(wants)

    def adjust(self, changes: Sequence[tuple[Want, float]]) -> None:
        now = self._clock()  # type: ignore[operator]
        for want, delta in changes:
            self._set(want, min(want.capacity, self._level(want, now) + delta), now)

    async def seed(self, changes: Sequence[tuple[Want, float]]) -> None:
        self.adjust([(want, delta) for want, delta in changes if want.key not in self._buckets])

    def _prune(self, now: float) -> None:
        self._pruned = now
        for key in [key for key, bucket in self._buckets.items() if bucket[2] < now]:
            del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)

    async def close(self) -> None:
        self._buckets.clear()
