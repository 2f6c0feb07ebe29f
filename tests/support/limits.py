"""Buckets for the limits' tests."""

from __future__ import annotations

from dragoman.limits.store import Want


def hourly(key: str, limit: int, cost: float = 1.0) -> Want:
    """A bucket that barely refills while a test runs."""
    return Want(key, limit, limit / 3600, cost, cost, 3600)
