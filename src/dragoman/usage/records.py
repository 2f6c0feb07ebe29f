"""What one finished request used, and the store interface the writer and readers share."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec

from dragoman.calls.types import Outcome

BucketWidth = Literal["1m", "1h", "1d"]
WIDTH_SECONDS: dict[str, int] = {"1m": 60, "1h": 3600, "1d": 86400}
GROUPS = ("api_key_id", "model")  # the report's group_by[] values; the CLI also groups by tenant


class UsageRecord(msgspec.Struct, frozen=True, array_like=True):
    """One request's usage. `at` is when it started (seconds since the epoch, UTC)."""

    at: float
    request_id: str
    endpoint: str
    key_id: str | None
    tenant: str | None
    model: str  # the name the client asked for
    upstream_model: str
    upstream: str
    replica: str
    input_tokens: int
    cache_read_tokens: int
    output_tokens: int
    status: int
    error_type: str | None
    disconnected: bool
    duration: float  # seconds
    ttft: float | None  # seconds to the first token, for streams
    # Written to the prompt cache (passthrough: the upstream's usage; OpenAI-compatible servers
    # tell none), and how many of those for an hour rather than five minutes. Last: schema v2.
    cache_creation_tokens: int = 0
    cache_creation_1h_tokens: int = 0
    web_search_requests: int = 0  # server tools the gateway ran (dragoman.servertools). Schema v3
    web_fetch_requests: int = 0
    route: str | None = None  # the [[routes]] entry it took, if any. Last: schema v4.


def record_of(outcome: Outcome, duration: float) -> UsageRecord:
    """The record of a finished request, from what its outcome holds. A count_tokens
    request uses no tokens (its count is an answer, not usage), as on Anthropic."""
    ttft = None if outcome.first_byte is None else outcome.first_byte - outcome.started
    used = outcome.endpoint != "count_tokens"
    return UsageRecord(
        at=time.time() - duration, request_id=outcome.request_id, endpoint=outcome.endpoint,
        key_id=outcome.key_id, tenant=outcome.tenant, model=_text(outcome.model), upstream_model=_text(outcome.served_model),
        upstream=outcome.upstream, replica=outcome.replica, input_tokens=used and outcome.input_tokens or 0,
        cache_read_tokens=used and outcome.cache_read_tokens or 0, output_tokens=used and outcome.output_tokens or 0,
        status=outcome.status, error_type=outcome.error_type, disconnected=outcome.disconnected,
        duration=duration, ttft=ttft, cache_creation_tokens=used and outcome.cache_creation_tokens or 0,
        cache_creation_1h_tokens=used and outcome.cache_creation_1h_tokens or 0,
        web_search_requests=outcome.web_search_requests, web_fetch_requests=outcome.web_fetch_requests,
        route=outcome.route or None,
    )  # fmt: skip


MAX_NAME = 256  # characters of a model name kept: the client chooses it


def _text(name: str) -> str:
    """A client's name as a store keeps it: bounded, and without NUL (PostgreSQL's text
    refuses it, and one refused record would hold back every other)."""
    return name[:MAX_NAME].replace("\0", "")


@dataclass(frozen=True, slots=True)
class Query:
    """Sums of usage between `start` (inclusive) and `end` (exclusive), in buckets of
    `width` seconds (0: one bucket), grouped by `group_by` columns, optionally filtered."""

    start: float
    end: float
    width: int = 0
    group_by: tuple[str, ...] = ()  # of "api_key_id", "model", "tenant", "upstream_model", "upstream", "replica"
    key_ids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    refusals: bool | None = None  # 401/403 answers: None counted with the rest, False left out, True alone
    ttft: bool = False  # with the TTFT histogram (Sums.ttft), which costs 28 more sums


@dataclass(slots=True)  # not frozen: a chart makes thousands, and a frozen one costs six times as much to make
class Sums:
    bucket: float  # the bucket's start (the query's start when not bucketed)
    groups: tuple[str | None, ...]  # in the order of Query.group_by
    requests: int
    input_tokens: int
    cache_read_tokens: int
    output_tokens: int
    errors: int
    cache_creation_tokens: int = 0
    cache_creation_1h_tokens: int = 0  # of those
    web_search_requests: int = 0
    web_fetch_requests: int = 0
    ttft: tuple[int, ...] = ()  # requests by time to first token, in usage.rollups.TTFT_BOUNDS' buckets


class UsageStore(Protocol):
    """Where records go (SQLite or PostgreSQL). `open` creates or migrates the schema."""

    async def open(self) -> None: ...

    async def write(self, records: list[UsageRecord]) -> None: ...

    async def sums(self, query: Query) -> list[Sums]: ...

    async def rows(self, query: Query, counters: tuple[str, ...]) -> list[tuple[Any, ...]]:
        """`sums` as plain rows, for charts of thousands of points: the bucket (if bucketed),
        the groups, then `counters` (of usage.rollups.COUNTED, "requests" first); in `sums`' order."""
        ...

    async def recent(self, limit: int, failures: bool | None = None, key_id: str | None = None) -> list[UsageRecord]:
        """The `limit` latest records, newest first: failed ones only (`failures=True`), the
        others only (False) or all (None); of one key, if given."""
        ...

    async def prune(self, before: float) -> int:
        """Delete the records that started before `before`, and minute rollups wholly
        before it (hour and day rollups are kept: see usage.rollups); how many records went."""
        ...

    async def close(self) -> None: ...
