"""Each replica's own load, read from its Prometheus metrics, for routing (docs/routing.md).

vLLM, SGLang and llama-server (`--metrics`) publish at `/metrics` how many requests they
run, how many wait, and (vLLM, SGLang) how full their KV cache is. Those figures count the
requests of every gateway replica, which count only their own in flight otherwise: reading
them is how gateway replicas see each other's load without talking. They are read here in the
background, every `load_metrics_interval` seconds, and handed to the upstream's `Placement`,
which weighs the numbers stored: no I/O and no parsing on a request's path.

A replica that publishes none of them (404, 501, refused, not Prometheus text) is left to the
requests in flight from this gateway: said once in the log at info, asked again less and less
often (up to RETRY_MAX seconds apart), never an error. A figure older than STALE_AFTER
intervals is not used.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dragoman.core.config import UpstreamConfig

if TYPE_CHECKING:
    from dragoman.upstream.placement import Placement
    from dragoman.upstream.transport.pool import Pool

log = logging.getLogger("dragoman.upstream")

METRICS_PATH = "/metrics"  # under the replica's root, where the three servers publish them
STALE_AFTER = 3  # intervals after which a figure read is no longer believed
RETRY_MAX = 60.0  # seconds between attempts at most, for a replica that publishes nothing
MAX_BYTES = 8 * 1024 * 1024  # of metrics text read (vLLM's is about 100 KB per model)


@dataclass(frozen=True, slots=True)
class Published:
    """The metric names one kind of server publishes its load under."""

    running: str  # requests being computed (in a batch, or holding a slot)
    waiting: str  # requests queued for a slot or for KV cache
    # The KV cache's used fraction, 0 to 1, under the first of these names present (renamed over versions).
    kv_usage: tuple[str, ...] = ()


# Checked against each server's source: vLLM vllm/v1/metrics/loggers.py (gpu_cache_usage_perc,
# deprecated in 0.9, is read where kv_cache_usage_perc is not); SGLang
# python/sglang/srt/metrics/collector.py (token_usage: tokens held by requests over the pool);
# llama.cpp tools/server (server-task.cpp, with --metrics: kv_cache_usage_ratio is gone from
# the version dragoman builds, read where an older server publishes it).
SERVERS: dict[str, Published] = {
    "vllm": Published("vllm:num_requests_running", "vllm:num_requests_waiting",
                      ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "sglang": Published("sglang:num_running_reqs", "sglang:num_queue_reqs", ("sglang:token_usage",)),
    "llamacpp": Published("llamacpp:requests_processing", "llamacpp:requests_deferred",
                          ("llamacpp:kv_cache_usage_ratio",)),
}  # fmt: skip

# Series that repeat a figure once per tensor- or pipeline-parallel rank (SGLang labels each
# rank's scheduler, which sees the same queue): only rank 0's is counted. Data-parallel series
# (vLLM's `engine`, SGLang's `dp_rank`) each hold their own requests: they are added up.
_COPY = re.compile(r'\b(?:tp_rank|pp_rank)="(?!0")')


@dataclass(frozen=True, slots=True)
class Reading:
    """What a replica published about its load."""

    running: float
    waiting: float
    kv_usage: float | None  # None: not published


def parse(text: str) -> Reading | None:
    """The load in a Prometheus text exposition; None if it holds none of SERVERS' counts.

    Only the lines of SERVERS' few names are read, each found by `str.find`: this runs on the
    event loop, for each replica, every interval, and prometheus_client's parser, which reads
    every line, took 90 times as long (10 ms against 0.1 ms for a vLLM's 70 KB)."""
    text = "\n" + text  # every sample line then starts with a newline
    counts = [0.0, 0.0]  # running, waiting: added up over data-parallel series
    found = False
    usage: float | None = None  # averaged over them
    for published in SERVERS.values():
        for index, name in enumerate((published.running, published.waiting)):
            values = _samples(text, name)
            if values:
                counts[index] += sum(values)
                found = True
        for name in published.kv_usage if usage is None else ():
            values = _samples(text, name)
            if values:
                usage = sum(values) / len(values)
                break
    return Reading(counts[0], counts[1], usage) if found else None


def _samples(text: str, name: str) -> list[float]:
    """The values of `name`'s samples in `text` (which starts with a newline), but copies."""
    values = []
    key = "\n" + name
    at = text.find(key)
    while at >= 0:
        start = at + len(key)
        end = text.find("\n", start)
        value = _value(text[start : end if end >= 0 else len(text)])
        if value is not None:
            values.append(value)
        at = text.find(key, start)
    return values


def _value(rest: str) -> float | None:
    """A sample's value from what follows its name: `{labels} value [timestamp]` or ` value`;
    None for a copy, no number, or another metric whose name starts with this one's."""
    if rest.startswith("{"):
        close = rest.rfind("}")
        if close < 0 or _COPY.search(rest, 0, close):
            return None
        rest = rest[close + 1 :]
    elif not rest.startswith((" ", "\t")):
        return None
    try:
        value = float(rest.split()[0])
    except (ValueError, IndexError):
        return None
    return value if math.isfinite(value) else None


Fetch = Callable[[str], Awaitable[tuple[int, bytes]]]  # a replica's root -> (status, body) of its metrics


def fetcher(pool: Pool, headers: bytes, timeout: float) -> Fetch:
    """GET a replica's metrics through the upstream's own connections and headers (its key:
    vLLM's --api-key does not cover /metrics, a proxy in front may), within `timeout`."""

    async def fetch(root: str) -> tuple[int, bytes]:
        async with asyncio.timeout(timeout):
            response = await pool.request(root, b"GET", METRICS_PATH, headers, None, idle_timeout=timeout)
            try:
                return response.status, await response.read(MAX_BYTES)
            finally:
                response.release()

    return fetch


def for_upstream(name: str, upstream: UpstreamConfig, placement: Placement | None, pool: Pool,
                 headers: bytes, shown_by: LoadCollector | None = None) -> ReplicaLoads | None:  # fmt: skip
    """The reader of upstream `name`'s replicas' load; None where none is wanted: round robin
    (no `placement`), a single replica, or `load_metrics = false`."""
    if placement is None or len(placement.in_flight) < 2 or not upstream.load_metrics:
        return None
    interval = upstream.load_metrics_interval
    return ReplicaLoads(name, placement, fetcher(pool, headers, max(2.0, 2 * interval)), interval=interval,
                        shown_by=shown_by)  # fmt: skip


class ReplicaLoads:
    """Reads the metrics of upstream `name`'s replicas every `interval` seconds, once
    started, and reports each to `placement` (and to /metrics: `LoadCollector`)."""

    def __init__(self, name: str, placement: Placement, fetch: Fetch, *, interval: float,
                 clock: Callable[[], float] = time.monotonic, shown_by: LoadCollector | None = None) -> None:  # fmt: skip
        self.name = name
        self._shown_by = shown_by  # the gateway's /metrics, while reading
        self.placement = placement
        self.roots = list(placement.in_flight)
        self.interval = interval
        self.fresh_for = STALE_AFTER * interval
        self.readings: dict[str, tuple[Reading, float]] = {}  # root -> what it published, when read
        self._fetch = fetch
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False

    def start(self) -> None:
        """Start reading (at the first request: it needs the running loop); idempotent."""
        if self._tasks or self._stopped:
            return
        self._tasks = [asyncio.create_task(self._watch(root), name=f"load of {root}") for root in self.roots]
        if self._shown_by is not None:
            self._shown_by.running.add(self)

    async def stop(self) -> None:
        """Stop reading and wait until every read has ended; idempotent."""
        self._stopped = True
        if self._shown_by is not None:
            self._shown_by.running.discard(self)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def read(self, root: str) -> str | None:
        """Read `root`'s metrics once and report them; why not, if they could not be read."""
        try:
            status, body = await self._fetch(root)
        except Exception as error:  # refused, reset, timed out, a bad response: never a request's failure
            return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if status != 200:
            return f"status {status}"
        reading = parse(body.decode("utf-8", "replace"))
        if reading is None:
            return "none of the load figures vLLM, SGLang or llama-server publish"
        now = self._clock()
        self.readings[root] = (reading, now)
        self.placement.report(root, reading.running, reading.waiting, reading.kv_usage, self.fresh_for)
        return None

    async def _watch(self, root: str) -> None:
        failures = 0
        while True:
            why = await self.read(root)
            if why is None:
                if failures:
                    log.info("upstream %s: replica %s publishes its load again at %s", self.name, root, METRICS_PATH)
                failures = 0
                delay = self.interval
            else:
                if failures == 0:
                    log.info("upstream %s: replica %s publishes no load at %s (%s); routing counts this gateway's "
                             "requests in flight there, and asks again at most every %g s",
                             self.name, root, METRICS_PATH, why, RETRY_MAX)  # fmt: skip
                failures += 1
                delay = min(self.interval * 2**failures, RETRY_MAX)
            await asyncio.sleep(delay)

    def fresh(self) -> Iterator[tuple[str, Reading]]:
        """The readings still believed, by replica."""
        oldest = self._clock() - self.fresh_for
        for root, (reading, read_at) in list(self.readings.items()):
            if read_at >= oldest:
                yield root, reading


class LoadCollector(Collector):
    """The figures each replica published, as gauges by upstream and replica, for every
    ReplicaLoads of one gateway that is reading (`shown_by` it)."""

    def __init__(self) -> None:
        self.running: weakref.WeakSet[ReplicaLoads] = weakref.WeakSet()  # started and not stopped

    def collect(self) -> Iterable[GaugeMetricFamily]:
        labels = ["upstream", "replica"]
        running = GaugeMetricFamily("dragoman_replica_requests_running",
                                    "Requests the replica said it was running (its /metrics)", labels=labels)  # fmt: skip
        waiting = GaugeMetricFamily("dragoman_replica_requests_waiting",
                                    "Requests the replica said were waiting (its /metrics)", labels=labels)  # fmt: skip
        usage = GaugeMetricFamily("dragoman_replica_kv_cache_usage",
                                  "The used fraction of the replica's KV cache (its /metrics)", labels=labels)  # fmt: skip
        for loads in list(self.running):
            for root, reading in loads.fresh():
                running.add_metric([loads.name, root], reading.running)
                waiting.add_metric([loads.name, root], reading.waiting)
                if reading.kv_usage is not None:
                    usage.add_metric([loads.name, root], reading.kv_usage)
        return [running, waiting, usage]

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []  # series come and go with readings; no name to reserve
