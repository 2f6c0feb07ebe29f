"""What operators see: Prometheus metrics and one JSON log line per request.

Backends note what happened on the request's `Outcome` (tokens, keep-alives,
retries); `Metrics.record` writes the line and the metrics from it, and hands it to the
sinks (usage, the trace), when the request's `Finish` ends it: once the last byte has
gone out, or the client has left. Recording is all it does. Message contents and keys
are never logged.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dragoman.calls.types import Completed, Outcome, Reply
from dragoman.core.error_mapping import anthropic_envelope
from dragoman.core.redaction import NO_KEYS, Redactor

log = logging.getLogger("dragoman.access")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """stderr, at the configured level: in `dragoman serve` and in each `--workers` process
    (a spawned worker inherits no logging set-up from its parent)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


MAX_LOGGED = 200  # characters of a logged string (a client's model name can be megabytes long)


def capped(text: str) -> str:
    """`text` cut to MAX_LOGGED characters, saying how long it was: for any logged string a
    client or an upstream chose."""
    return text if len(text) <= MAX_LOGGED else f"{text[:MAX_LOGGED]}...({len(text)} chars)"


LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TOKEN_BUCKETS = (0, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.redactor: Redactor = NO_KEYS  # the gateway's keys, kept out of the access line (its gateway sets it)
        r = self.registry
        self.requests = Counter(
            "dragoman_requests", "Requests served", ["endpoint", "model", "upstream", "path", "status"], registry=r
        )
        self.latency = Histogram(
            "dragoman_request_duration_seconds",
            "Time to the last byte",
            ["endpoint", "path"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "dragoman_time_to_first_token_seconds",
            "Time to the first streamed byte after message_start",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("dragoman_tokens", "Tokens, by direction", ["model", "direction"], registry=r)
        self.upstream_errors = Counter(
            "dragoman_upstream_errors", "Errors answered on behalf of an upstream", ["upstream", "type"], registry=r
        )
        self.retries = Counter("dragoman_upstream_retries", "Upstream retries", ["upstream"], registry=r)
        self.streams = Gauge("dragoman_streams_in_flight", "Streams being served", registry=r)
        self.keepalives = Counter("dragoman_keepalives", "Keep-alive comments and pings sent", registry=r)
        self.disconnects = Counter("dragoman_client_disconnects", "Clients that left before the end", registry=r)
        # Usage by tenant (configured names, "" for keys of none) and served model: bounded label sets.
        self.usage_requests = Counter(
            "dragoman_usage_requests", "Finished requests, by tenant and model", ["tenant", "model"], registry=r
        )
        self.usage_tokens = Counter(
            "dragoman_usage_tokens", "Tokens used, by tenant, model and kind", ["tenant", "model", "kind"], registry=r
        )
        # Called with every finished request's outcome and duration (usage accounting, a trace's end); no I/O there.
        self.sinks: list[Callable[[Outcome, float], None]] = []
        self.open_sinks: list[Callable[[Outcome], None]] = []  # called with each new request's outcome
        self._routing_metrics(r)
        self.server_tools = Counter("dragoman_server_tool_calls", "Server tool calls the gateway ran (dragoman.servertools)",
                                    ["tool", "provider", "outcome"], registry=r)  # fmt: skip
        self._cache: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _routing_metrics(self, r: CollectorRegistry) -> None:
        """What cache-aware routing decided (upstream.placement), by replica."""
        self.routed = Counter(
            "dragoman_routing_decisions",
            "Requests placed on a replica, by reason",
            ["upstream", "replica", "reason"],
            registry=r,
        )
        self.routed_tokens = Counter(
            "dragoman_routing_prompt_tokens",
            "Prompt tokens placed on a replica (estimated)",
            ["upstream", "replica"],
            registry=r,
        )
        self.expected_cached = Counter(
            "dragoman_routing_expected_cached_tokens", "Prompt tokens routing expected the replica to hold cached",
            ["upstream", "replica"], registry=r,
        )  # fmt: skip
        self.prefix_match = Histogram(
            "dragoman_routing_prefix_match_tokens", "Prompt tokens matched in the chosen replica's prefix index",
            ["upstream", "replica"], buckets=TOKEN_BUCKETS, registry=r,
        )  # fmt: skip

    def outcome(self, request_id: str, endpoint: str) -> Outcome:
        """A new request's outcome, recorded here when the request ends (`Outcome.finish`)."""
        outcome = Outcome(request_id=request_id, endpoint=endpoint)
        outcome.finish.record = self.record
        for sink in self.open_sinks:
            sink(outcome)
        return outcome

    def record(self, outcome: Outcome) -> None:
        """One finished request's metrics, sinks and log line (from its `Finish`, once)."""
        duration = time.perf_counter() - outcome.started
        # Labelled by the served model: client-chosen names would make series without bound.
        model = (outcome.served_model if outcome.served_model_listed else "unlisted") or "unknown"
        self._series(self.requests, outcome.endpoint, model, outcome.upstream, outcome.path, str(outcome.status)).inc()
        self._series(self.latency, outcome.endpoint, outcome.path).observe(duration)
        if outcome.first_byte is not None:
            self._series(self.ttft, outcome.path).observe(outcome.first_byte - outcome.started)
        if outcome.input_tokens:  # the whole prompt: Anthropic's input_tokens leaves out cache reads and writes
            prompt = outcome.input_tokens + (outcome.cache_read_tokens or 0) + (outcome.cache_creation_tokens or 0)
            self._series(self.tokens, model, "input").inc(prompt)
        if outcome.output_tokens:
            self._series(self.tokens, model, "output").inc(outcome.output_tokens)
        if outcome.upstream_failed:
            self.upstream_errors.labels(outcome.upstream, outcome.error_type or "api_error").inc()
        if outcome.retries:
            self.retries.labels(outcome.upstream).inc(outcome.retries)
        if outcome.keepalives:
            self.keepalives.inc(outcome.keepalives)
        if outcome.disconnected:
            self.disconnects.inc()
        self._count_usage(outcome, model)
        for tool, provider, result in outcome.server_tool_runs:
            self._series(self.server_tools, tool, provider, result).inc()
        for sink in self.sinks:
            sink(outcome, duration)
        if outcome.routing:
            self._routing(outcome)
        if log.isEnabledFor(logging.INFO):  # the line is built only when someone reads it
            log.info(_line(outcome, duration, self.redactor))

    def _count_usage(self, outcome: Outcome, model: str) -> None:
        tenant = outcome.tenant or ""
        self._series(self.usage_requests, tenant, model).inc()
        if outcome.endpoint == "count_tokens":
            return  # a count is an answer, not usage
        for kind, tokens in (("input", outcome.input_tokens), ("cache_read", outcome.cache_read_tokens),
                             ("cache_creation", outcome.cache_creation_tokens), ("output", outcome.output_tokens)):  # fmt: skip
            if tokens:
                self._series(self.usage_tokens, tenant, model, kind).inc(tokens)

    def _routing(self, outcome: Outcome) -> None:
        upstream, replica = outcome.upstream, outcome.replica
        self._series(self.routed, upstream, replica, outcome.routing).inc()
        if outcome.routed_tokens:
            matched = outcome.prefix_tokens or 0
            self._series(self.routed_tokens, upstream, replica).inc(outcome.routed_tokens)
            self._series(self.expected_cached, upstream, replica).inc(matched)
            self._series(self.prefix_match, upstream, replica).observe(matched)

    def _series(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once per label set (it takes a lock)."""
        key = (id(metric), labels)
        series = self._cache.get(key)
        if series is None:
            series = self._cache[key] = metric.labels(*labels)
        return series


def _line(outcome: Outcome, duration: float, redactor: Redactor) -> str:
    fields = {
        "request_id": outcome.request_id,
        "endpoint": outcome.endpoint,
        "key_id": outcome.key_id,  # a digest, never the key
        "tenant": outcome.tenant,
        "model": outcome.model,
        "served_model": outcome.served_model,
        "route": outcome.route,
        "upstream": outcome.upstream,
        "path": outcome.path,
        "status": outcome.status,
        "input_tokens": outcome.input_tokens,
        "output_tokens": outcome.output_tokens,
        "cache_read_input_tokens": outcome.cache_read_tokens,
        "cache_creation_input_tokens": outcome.cache_creation_tokens,
        "replica": outcome.replica,
        "routing": outcome.routing,
        "prefix_match_tokens": outcome.prefix_tokens if outcome.routed_tokens else None,
        "replica_load": outcome.replica_load,
        "ttft_ms": None if outcome.first_byte is None else round((outcome.first_byte - outcome.started) * 1000, 1),
        "duration_ms": round(duration * 1000, 1),
        "error": outcome.error_type,
        "error_message": logged_message(outcome.error_message, redactor),
        "client_disconnected": outcome.disconnected or None,
        "tools_dropped": outcome.tools_dropped or None,
        "safeguards": outcome.safeguards,
    }
    return json_line(fields)


def logged_message(message: str | None, redactor: Redactor) -> str | None:
    """An error's message as the access line has it: without keys (an upstream may quote one
    back), on one line, capped by `json_line`. It names no more of the request than the
    client's own answer does."""
    return None if not message else redactor.redact(" ".join(message.split()))


def json_line(fields: dict[str, Any]) -> str:
    """An access-log record: the fields that have a value, as compact JSON, each string capped."""
    return json.dumps(
        {k: capped(v) if isinstance(v, str) else v for k, v in fields.items() if v is not None and v != ""},
        separators=(",", ":"),
    )


def observe(reply: Reply, outcome: Outcome) -> Reply:
    """Note the reply's status on the outcome, and for a whole reply the error type of an
    upstream's error relayed as it came."""
    outcome.status = reply.status
    if isinstance(reply, Completed) and reply.status >= 400 and outcome.error_type is None:
        envelope = anthropic_envelope(reply.body)  # an upstream's error relayed as it came
        outcome.error_type = envelope.error.type if envelope is not None else "api_error"
        outcome.error_message = envelope.error.message if envelope is not None else None
    return reply
