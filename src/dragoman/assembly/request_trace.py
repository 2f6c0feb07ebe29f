"""One request's trace: a server span (or a batch request's own span) and, under it, a
client span per upstream attempt, attributed as OpenTelemetry's GenAI conventions say.

Made only when tracing is on (`assembly.tracing`); everything here runs on the event loop
and only ends spans, which the SDK's batch processor exports from its own thread.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import msgspec

from dragoman.assembly.observe import capped
from dragoman.calls.types import Call, Outcome, Route


class _Sampling(msgspec.Struct):
    """The request fields the conventions record (the rest of the body is not decoded again)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    system: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty when absent
    messages: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty when absent
    tools: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty when absent


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _Reply(msgspec.Struct):
    """What a message (or a stream's message_start and message_delta) tells about the reply."""

    id: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    usage: _Usage | None = None
    content: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty when absent
    message: _Reply | None = None  # message_start's message
    delta: _Reply | None = None  # message_delta's delta


MAX_HELD_EVENT = 1 << 20  # an event this large is no message_start or message_delta
_OF_INTEREST = b"event: message_"
_SAMPLING = msgspec.json.Decoder(_Sampling)
_REPLY = msgspec.json.Decoder(_Reply)


def _event_end(data: bytes) -> tuple[int, int]:
    """Where the first event in `data` ends, and the length of the blank line that ends it."""
    lf, crlf = data.find(b"\n\n"), data.find(b"\r\n\r\n")
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, 4
    return lf, 2


class Instruments:
    """The GenAI conventions' server metrics and token usage."""

    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter("dragoman")
        self.duration = meter.create_histogram("gen_ai.server.request.duration", unit="s",
                                               description="Time to the last byte of the reply")  # fmt: skip
        self.ttft = meter.create_histogram("gen_ai.server.time_to_first_token", unit="s",
                                           description="Time to the first output token")  # fmt: skip
        self.tpot = meter.create_histogram("gen_ai.server.time_per_output_token", unit="s",
                                           description="Time per output token after the first")  # fmt: skip
        self.tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}",
                                             description="Tokens per request, by type")  # fmt: skip


def traceparent_of(span: Any) -> str:
    """The W3C `traceparent` naming `span`: sent upstream, or kept with a batch to link to."""
    from opentelemetry.trace import format_span_id, format_trace_id

    context = span.get_span_context()
    flags = "01" if context.trace_flags.sampled else "00"
    return f"00-{format_trace_id(context.trace_id)}-{format_span_id(context.span_id)}-{flags}"


def context_of(traceparent: str, tracestate: str = "") -> Any:
    """The OpenTelemetry context a `traceparent` (and `tracestate`) header names; empty if none."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier={"traceparent": traceparent, "tracestate": tracestate})


def end_trace(outcome: Outcome, duration: float) -> None:
    """A metrics sink (`Metrics.sinks`, with tracing on): the request's spans end with it."""
    trace, outcome.trace = outcome.trace, None
    if trace is not None:
        trace.end(outcome)


class RequestTrace:
    """Filled in as the request goes: `prepared`, `attempt` per upstream try, the reply
    (`completed`, or `seen` for each piece of a stream), then `end` with the request's Outcome."""

    def __init__(self, tracer: Any, span: Any, *, operation: str, capture_content: bool,
                 instruments: Instruments | None) -> None:  # fmt: skip
        self._tracer = tracer
        self._capture = capture_content
        self._instruments = instruments
        self.span = span
        self._operation = operation
        self._wall0, self._perf0 = time.time_ns(), time.perf_counter()
        self._attempt: Any = None
        self._request_attributes: dict[str, Any] = {}
        self._model = self._metric_model = ""
        self._provider = "openai"
        self._reply = _Reply()
        self._output: bytes | None = None
        self._held: bytes | None = None  # a stream's event of interest, from its `event:` line on
        self._carry = b""  # the end of the last piece: a name cut in two by a chunk boundary

    def prepared(self, call: Call, route: Route, provider: str) -> None:
        """The request as routed: what every attempt's span carries."""
        # A client's own name, sent on unlisted, is cut short on spans and is no metric label.
        self._model, self._provider = capped(route.upstream_model), provider
        self._metric_model = route.upstream_model if route.listed else "unlisted"
        try:
            sampling = _SAMPLING.decode(call.body)
        except msgspec.DecodeError:
            sampling = _Sampling()
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": self._operation,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": self._model,
            "dragoman.upstream": route.upstream,
        }
        for name in ("max_tokens", "temperature", "top_p", "top_k", "stop_sequences"):
            value = getattr(sampling, name)
            if value is not None:
                attributes[f"gen_ai.request.{name}"] = value
        if self._capture:
            for key, raw in (("gen_ai.input.messages", sampling.messages), ("gen_ai.system_instructions", sampling.system),
                             ("gen_ai.tool.definitions", sampling.tools)):  # fmt: skip
                if raw:
                    attributes[key] = bytes(raw).decode()
        self._request_attributes = attributes
        self.span.set_attribute("gen_ai.request.model", capped(call.model))
        self.span.set_attribute("dragoman.request_id", call.request_id)

    def attempt(self, root: str, lines: bytes, reason: str | None = None, prefix_tokens: int | None = None) -> bytes:
        """Start the span of one try at `root` (a retry's is a sibling of the one before), and
        the request's header lines with its `traceparent`, so the upstream continues the trace."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        self._end_attempt("retried")
        address = urlsplit(root)
        attributes = {**self._request_attributes, "server.address": address.hostname or "", "dragoman.replica": root}
        if address.port is not None:
            attributes["server.port"] = address.port
        if reason:  # why routing chose this replica, and how much of the prompt it expected cached
            attributes["dragoman.route.reason"] = reason
            if prefix_tokens is not None:
                attributes["dragoman.route.prefix_tokens"] = prefix_tokens
        name = f"{self._operation} {self._model}".strip()
        span = self._attempt = self._tracer.start_span(name, context=set_span_in_context(self.span),
                                                               kind=SpanKind.CLIENT, attributes=attributes)  # fmt: skip
        return lines + f"traceparent: {traceparent_of(span)}\r\n".encode()

    def attempt_failed(self, error_type: str) -> None:
        """The current try failed (no answer, or a status it will be retried for)."""
        self._end_attempt(error_type)

    def completed(self, body: bytes) -> None:
        """A whole reply's message: its id, model, stop reason and usage."""
        try:
            self._reply = _REPLY.decode(body)
        except msgspec.DecodeError:
            return
        if self._capture and self._reply.content:
            self._output = bytes(self._reply.content)

    def seen(self, chunk: bytes) -> None:
        """A stream's observer (`Streaming.observe`): reads its message_start and message_delta
        on the way; only the bytes from `event: message_` to the event's end are held and
        decoded (two events a stream), whatever pieces they came in."""
        held = self._held
        if held is None:
            window = self._carry + chunk
            start = window.find(_OF_INTEREST)
            if start < 0:
                self._carry = window[-len(_OF_INTEREST) :]
                return
            held = window[start:]
        else:
            held += chunk
        self._held, self._carry = self._take_events(held)

    def _take_events(self, held: bytes) -> tuple[bytes | None, bytes]:
        """Read every whole event of interest in `held`; what is left of one still coming."""
        while True:
            end, gap = _event_end(held)
            if end < 0:
                return (held, b"") if len(held) <= MAX_HELD_EVENT else (None, b"")
            self._read_event(held[:end])
            rest = held[end + gap :]
            start = rest.find(_OF_INTEREST)
            if start < 0:
                return None, rest[-len(_OF_INTEREST) :]
            held = rest[start:]

    def _read_event(self, event: bytes) -> None:
        if b"event: message_start" not in event and b"event: message_delta" not in event:
            return
        data = next((line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")), b"")
        try:
            decoded = _REPLY.decode(data)
        except msgspec.DecodeError:
            return
        if decoded.message is not None:
            self._reply = decoded.message
        if decoded.delta is not None and decoded.delta.stop_reason is not None:
            self._reply.stop_reason = decoded.delta.stop_reason
        if decoded.usage is not None:
            usage = self._reply.usage = self._reply.usage or _Usage()
            for name in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
                if getattr(decoded.usage, name) is not None:
                    setattr(usage, name, getattr(decoded.usage, name))

    def end(self, outcome: Outcome) -> None:
        """The request is over: attributes, events and metrics from its Outcome; spans ended."""
        from opentelemetry.trace import Status, StatusCode

        now = time.perf_counter()
        usage = self._usage(outcome)
        error_type = outcome.error_type or ("client_disconnected" if outcome.disconnected else None)
        attempt = self._attempt
        if attempt is not None:
            attempt.set_attributes(usage)
            attempt.set_attributes(self._response_attributes())
            self._events(attempt, outcome, now, usage.get("gen_ai.usage.output_tokens"))
            self._end_attempt(error_type)
        span = self.span
        span.set_attribute("http.response.status_code", outcome.status)
        if outcome.safeguards:
            span.set_attribute("dragoman.safeguards", outcome.safeguards)
        if error_type is not None:
            span.set_attribute("error.type", error_type)
        if outcome.status >= 500 or (error_type is not None and outcome.status >= 400):
            span.set_status(Status(StatusCode.ERROR, error_type))
        span.end()
        self._measure(outcome, now, usage, error_type)

    # -- helpers --------------------------------------------------------------------------

    def _end_attempt(self, error_type: str | None) -> None:
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            return
        if error_type is not None:
            from opentelemetry.trace import Status, StatusCode

            attempt.set_attribute("error.type", error_type)
            attempt.set_status(Status(StatusCode.ERROR, error_type))
        attempt.end()

    def _usage(self, outcome: Outcome) -> dict[str, int]:
        reported = self._reply.usage or _Usage()
        values = {
            "gen_ai.usage.input_tokens": outcome.input_tokens
            if outcome.input_tokens is not None
            else reported.input_tokens,
            "gen_ai.usage.output_tokens": outcome.output_tokens
            if outcome.output_tokens is not None
            else reported.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": outcome.cache_read_tokens
            if outcome.cache_read_tokens is not None
            else reported.cache_read_input_tokens,
            "gen_ai.usage.cache_creation.input_tokens": reported.cache_creation_input_tokens,
        }
        return {name: value for name, value in values.items() if value is not None}

    def _response_attributes(self) -> dict[str, Any]:
        reply = self._reply
        attributes: dict[str, Any] = {}
        if reply.id:
            attributes["gen_ai.response.id"] = reply.id
        if reply.model:
            attributes["gen_ai.response.model"] = capped(reply.model)
        if reply.stop_reason:
            attributes["gen_ai.response.finish_reasons"] = [reply.stop_reason]
        if self._output is not None:
            attributes["gen_ai.output.messages"] = self._output.decode()
        return attributes

    def _events(self, span: Any, outcome: Outcome, now: float, output_tokens: int | None) -> None:
        if outcome.first_byte is None:
            return
        first = outcome.first_byte - outcome.started
        span.add_event(
            "gen_ai.first_token", {"gen_ai.server.time_to_first_token": first}, timestamp=self._ns(outcome.first_byte)
        )
        ending: dict[str, Any] = {}
        if output_tokens and output_tokens > 1:
            ending["gen_ai.server.time_per_output_token"] = (now - outcome.first_byte) / (output_tokens - 1)
        span.add_event("gen_ai.end_of_stream", ending, timestamp=self._ns(now))

    def _ns(self, perf: float) -> int:
        return self._wall0 + int((perf - self._perf0) * 1e9)

    def _measure(self, outcome: Outcome, now: float, usage: dict[str, int], error_type: str | None) -> None:
        instruments = self._instruments
        if instruments is None or not self._model:
            return
        attributes: dict[str, Any] = {"gen_ai.operation.name": self._operation, "gen_ai.provider.name": self._provider,
                                      "gen_ai.request.model": self._metric_model}  # fmt: skip
        if error_type is not None:
            attributes["error.type"] = error_type
        instruments.duration.record(now - outcome.started, attributes)
        if outcome.first_byte is not None:
            instruments.ttft.record(outcome.first_byte - outcome.started, attributes)
            output = usage.get("gen_ai.usage.output_tokens")
            if output and output > 1:
                instruments.tpot.record((now - outcome.first_byte) / (output - 1), attributes)
        for kind, key in (("input", "gen_ai.usage.input_tokens"), ("output", "gen_ai.usage.output_tokens")):
            if key in usage:
                instruments.tokens.record(usage[key], {**attributes, "gen_ai.token.type": kind})
