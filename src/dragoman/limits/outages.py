"""`dragoman_store_outage_requests`: requests admitted or refused because a store was down
(Redis for the limits, the database for the Admin API and the reports), one counter per
registry whoever counts. Apart from `fallback` so that counting needs no Redis client loaded."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

_OUTAGE_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def outage_counter(registry: CollectorRegistry | None, policy: str, store: str = "redis") -> Callable[[str], None]:
    """`count(decision)`: a request admitted or refused because `store` was out (beside
    `dragoman_limits_store_errors`, Redis's failed calls). One counter per registry, for every store."""
    if registry is None:
        return lambda decision: None
    counter = _OUTAGE_COUNTERS.get(registry)
    if counter is None:
        counter = _OUTAGE_COUNTERS[registry] = Counter(
            "dragoman_store_outage_requests", "Requests admitted or refused because a store was down",
            ["store", "policy", "decision"], registry=registry)  # fmt: skip
    return lambda decision: counter.labels(store, policy, decision).inc()
