"""An OTLP/HTTP receiver for the tracing tests: it decodes the real protobuf exports
(`opentelemetry-proto`) into plain spans and metric names."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Span:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    status_code: int
    service: str


@dataclass
class Received:
    spans: list[Span] = field(default_factory=list)
    metrics: set[str] = field(default_factory=set)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class OtlpReceiver:
    """Listens on 127.0.0.1; `url` is the base a gateway's `[tracing] endpoint` takes."""

    def __init__(self) -> None:
        self.received = Received()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver._take(self.path, body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self.received.spans)

    def metric_names(self) -> set[str]:
        with self._lock:
            return set(self.received.metrics)

    def _take(self, path: str, body: bytes) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        if path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            spans = [
                _span(span, _attributes(resource.resource.attributes).get("service.name", ""))
                for resource in request.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            ]
            with self._lock:
                self.received.spans.extend(spans)
        elif path == "/v1/metrics":
            metrics = ExportMetricsServiceRequest()
            metrics.ParseFromString(body)
            names = {m.name for r in metrics.resource_metrics for s in r.scope_metrics for m in s.metrics}
            with self._lock:
                self.received.metrics |= names


def _span(span: Any, service: str) -> Span:
    return Span(
        name=span.name,
        kind=span.kind,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        attributes=_attributes(span.attributes),
        events=[(event.name, _attributes(event.attributes)) for event in span.events],
        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        status_code=span.status.code,
        service=service,
    )


class GrpcOtlpReceiver:
    """The same, over OTLP/gRPC (traces only): `url` is the endpoint `protocol = "grpc"` takes."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.received = Received()
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the service's name)
                receiver.received.spans.extend(
                    _span(span, _attributes(resource.resource.attributes).get("service.name", ""))
                    for resource in request.resource_spans
                    for scope in resource.scope_spans
                    for span in scope.spans
                )
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GrpcOtlpReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)
