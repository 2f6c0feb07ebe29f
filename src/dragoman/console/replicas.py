"""The console's replicas view: per upstream and replica, what this process knows now
(health, requests in flight, the replica's own load as `upstream/gauges.py` reads it,
routing decisions by reason since start) and, from the rollups, the last hour's requests,
errors and prompt-cache hit rate (every process's)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dragoman.console.store import guarded, store_of
from dragoman.usage.records import Query, Sums

if TYPE_CHECKING:
    from dragoman.assembly.gateway import Gateway
    from dragoman.upstream.client import HttpClient

WINDOW = 3600  # seconds of rollups behind a replica's requests, errors and cache hit rate


def _decisions(gateway: Gateway) -> dict[tuple[str, str], dict[str, int]]:
    """Routing decisions by (upstream, replica), then reason: this process's counters."""
    decisions: dict[tuple[str, str], dict[str, int]] = {}
    for metric in gateway.metrics.routed.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                labels = sample.labels
                reasons = decisions.setdefault((labels["upstream"], labels["replica"]), {})
                reasons[labels["reason"]] = reasons.get(labels["reason"], 0) + int(sample.value)
    return decisions


def _roots(gateway: Gateway, name: str) -> tuple[list[str], HttpClient | None]:
    client = getattr(gateway.backends.get(name), "http", None)
    if client is not None:
        return list(client.roots), client
    upstream = gateway.config.upstreams[name]
    return [url.rstrip("/") for url in (upstream.url, *upstream.replicas)], None


def _replica(root: str, client: HttpClient | None, decisions: dict[str, int], used: Sums | None) -> dict[str, Any]:
    replicas = client.replicas if client is not None else None
    placement = replicas.placement if replicas is not None else None
    loads = client.loads if client is not None else None
    reading = dict(loads.fresh()).get(root) if loads is not None else None
    prompt = (used.input_tokens + used.cache_read_tokens + used.cache_creation_tokens) if used else 0
    return {
        "name": root,
        "healthy": None if replicas is None else not replicas.passed_over(root),
        "in_flight": placement.in_flight.get(root) if placement is not None else None,
        "running": reading.running if reading is not None else None,
        "waiting": reading.waiting if reading is not None else None,
        "kv_cache_usage": reading.kv_usage if reading is not None else None,
        "decisions": decisions,
        "requests": used.requests if used else 0,
        "errors": used.errors if used else 0,
        "cache_hit_rate": used.cache_read_tokens / prompt if used and prompt else None,
    }


def shape(gateway: Gateway, used: Iterable[Sums]) -> dict[str, Any]:
    """The view, given the last hour's sums by (upstream, replica)."""
    decisions = _decisions(gateway)
    by_replica = {(s.groups[0], s.groups[1]): s for s in used}
    upstreams = []
    for name in gateway.config.upstreams:
        roots, client = _roots(gateway, name)
        upstreams.append({"name": name, "replicas": [
            _replica(root, client, decisions.get((name, root), {}), by_replica.get((name, root))) for root in roots
        ]})  # fmt: skip
    return {"window": WINDOW, "upstreams": upstreams}


async def replicas(gateway: Gateway) -> dict[str, Any]:
    """Every configured upstream's replicas, in the configuration's order."""
    used: list[Sums] = []
    if gateway.usage is not None:
        store = await store_of(gateway)
        end = (math.floor(time.time() / 60) + 1) * 60
        used = await guarded(gateway, store.sums(Query(end - WINDOW, end, 0, ("upstream", "replica"))))
    return shape(gateway, used)
