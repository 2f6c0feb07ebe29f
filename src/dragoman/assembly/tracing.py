"""Traces and GenAI metrics through OpenTelemetry (optional: `pip install 'dragoman[otel]'`).

Off unless `[tracing] enabled = true` or an OTLP endpoint is set in the environment
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); `OTEL_SDK_DISABLED=true`
turns it off. Off, `build_tracing` returns None and the request path does no tracing work
at all. On, the SDK's batch processor and periodic metric reader export from their own
threads, never from the event loop. The sampler, resource and batch settings come from
the standard `OTEL_*` variables (the SDK reads them); `[tracing]` says what they cannot.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from dragoman.assembly.request_trace import Instruments, RequestTrace, context_of, traceparent_of
from dragoman.core.config import TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("dragoman")

INSTALL_HINT = "pip install 'dragoman[otel]'"
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def wanted(config: TracingConfig, environ: Mapping[str, str]) -> bool:
    """Whether tracing is asked for: by the configuration, else by an OTLP endpoint in the environment."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if config.enabled is not None:
        return config.enabled
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


def resolve_tracing(config: TracingConfig, environ: Mapping[str, str]) -> tuple[TracingConfig, list[str]]:
    """The tracing settings with what the OTEL_* variables say of them written in (whether it is on,
    the protocol, the service name), and their problems. Asked for in the configuration without the
    packages installed, it is a problem; asked for by the environment alone, a warning, and off."""
    on = wanted(config, environ)
    protocol = config.protocol or environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or \
        environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")  # fmt: skip
    problems = []
    if on and protocol not in ("http/protobuf", "grpc"):
        problems.append(f"tracing.protocol: {protocol!r} is not supported (http/protobuf or grpc)")
    if on and not _installed():
        if config.enabled:
            problems.append(f"tracing.enabled: the OpenTelemetry packages are not installed ({INSTALL_HINT})")
        else:
            log.warning("an OTLP endpoint is set but the OpenTelemetry packages are not installed (%s): no traces",
                        INSTALL_HINT)  # fmt: skip
            on = False
    service = config.service_name or environ.get("OTEL_SERVICE_NAME") or "dragoman"
    resolved = msgspec.structs.replace(config, enabled=on, service_name=service,
                                       protocol=protocol if not problems else None)  # fmt: skip
    return resolved, problems


def _installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.sdk") is not None
    except ModuleNotFoundError:  # not even `opentelemetry`
        return False


def build_tracing(config: TracingConfig, version: str) -> Tracing | None:
    """The gateway's tracing, or None when it is off; `config` as `resolve_tracing` gives it."""
    return Tracing(config, version) if config.enabled else None


class Tracing:
    """One tracer provider and one meter provider per gateway, and the instruments."""

    def __init__(self, config: TracingConfig, version: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": config.service_name or "dragoman", "service.version": version})
        self.config = config
        self.tracer_provider: TracerProvider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(config)))
        self.tracer = self.tracer_provider.get_tracer("dragoman", version)
        self.meter_provider: MeterProvider | None = _meter_provider(config, resource) if config.metrics else None
        self.instruments = Instruments(self.meter_provider) if self.meter_provider is not None else None

    def request(self, headers: Mapping[str, str], endpoint: str, path: str) -> RequestTrace:
        """A server span for one HTTP request, continuing the client's `traceparent`."""
        span = self._server_span(headers, path, {"dragoman.endpoint": endpoint})
        return self._trace(span, "count_tokens" if endpoint == "count_tokens" else "chat")

    def batch_created(self, headers: Mapping[str, str], path: str) -> tuple[Any, str]:
        """The server span of a request that creates a batch, and the `traceparent` naming it,
        which each of the batch's requests links its own trace to."""
        span = self._server_span(headers, path, {})
        return span, traceparent_of(span)

    def batch_request(self, batch_id: str, custom_id: str, created_by: str | None) -> RequestTrace:
        """A trace of its own for one request of a batch, linked to the span that created the batch."""
        from opentelemetry.context import Context
        from opentelemetry.trace import Link, SpanKind, get_current_span

        links = []
        if created_by:
            context = get_current_span(context_of(created_by)).get_span_context()
            if context.is_valid:
                links.append(Link(context, {"dragoman.link": "batch.create"}))
        span = self.tracer.start_span("batch request", context=Context(), kind=SpanKind.INTERNAL, links=links,
                                      attributes={"dragoman.batch.id": batch_id,
                                                  "dragoman.batch.custom_id": custom_id})  # fmt: skip
        return self._trace(span, "chat")

    def _server_span(self, headers: Mapping[str, str], path: str, attributes: dict[str, str]) -> Any:
        from opentelemetry.trace import SpanKind

        parent = context_of(headers.get("traceparent", ""), headers.get("tracestate", ""))
        return self.tracer.start_span(f"POST {path}", context=parent, kind=SpanKind.SERVER,
                                      attributes={"http.request.method": "POST", "url.path": path, **attributes})  # fmt: skip

    def _trace(self, span: Any, operation: str) -> RequestTrace:
        return RequestTrace(self.tracer, span, operation=operation, capture_content=self.config.capture_content,
                            instruments=self.instruments)  # fmt: skip

    async def close(self) -> None:
        """Export what is left, off the event loop (an export may wait on the network)."""
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def _protocol(config: TracingConfig) -> str:
    return config.protocol or "http/protobuf"  # resolved (`resolve_tracing`): checked, the environment's written in


def _span_exporter(config: TracingConfig) -> Any:
    endpoint = config.endpoint
    if _protocol(config) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

        return GrpcSpans(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

    return HttpSpans(endpoint=f"{endpoint.rstrip('/')}/v1/traces" if endpoint else None)


def _meter_provider(config: TracingConfig, resource: Any) -> Any:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    endpoint = config.endpoint
    if _protocol(config) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        exporter: Any = GrpcMetrics(endpoint=endpoint)
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics

        exporter = HttpMetrics(endpoint=f"{endpoint.rstrip('/')}/v1/metrics" if endpoint else None)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=config.metrics_interval * 1000)
    return MeterProvider(resource=resource, metric_readers=[reader])
