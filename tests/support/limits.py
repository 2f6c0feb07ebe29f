"""Buckets and Redis's counts for the limits' tests (their private Redis: tests/unit/limits/conftest.py)."""

from __future__ import annotations

import redis

from dragoman.limits.store import Want


def hourly(key: str, limit: int, cost: float = 1.0) -> Want:
    """A bucket that barely refills while a test runs."""
    return Want(key, limit, limit / 3600, cost, cost, 3600)


def evalsha_calls(url: str) -> int:
    """Script runs Redis counted (the first of a store's finds no script: it is loaded and run again)."""
    return int(redis.Redis.from_url(url).info("commandstats")["cmdstat_evalsha"]["calls"])
