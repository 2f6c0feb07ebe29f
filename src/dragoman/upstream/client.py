"""One pooled HTTP client per upstream: its replicas, key, headers, timeouts, retries.

Connections are dragoman's own (`dragoman.upstream.transport.pool`): aiohttp cost three times
as much CPU per request (bench/clients.py measures both).

Which failures are retried, how often and on which replica is described once, for people,
in docs/operations.md (Retries and replicas); this module applies it (`upstream.retries`), with
`upstream.replicas` choosing the instance and `upstream.opening` watching a stream's first
body bytes. Non-2xx answers are mapped here, once, so callers see a 2xx response or a
GatewayError (unless they ask for the raw response, as passthrough does).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dragoman import __version__
from dragoman.core.config import ConfigError, UpstreamConfig
from dragoman.core.error_mapping import from_upstream
from dragoman.core.errors import UpstreamError, UpstreamTimeout
from dragoman.core.redaction import Redactor
from dragoman.upstream import gauges, hedge
from dragoman.upstream.errors import upstream_errors
from dragoman.upstream.opening import Opening, Sending
from dragoman.upstream.placement import Decision, MessagesParts, Placement, PromptKind, prompt_of
from dragoman.upstream.replicas import CoolDowns, Replicas
from dragoman.upstream.retries import RETRY_STATUSES, backoff, count_retry, may_retry, retry_after
from dragoman.upstream.transport.failures import ConnectTimeout, HeadTimeout
from dragoman.upstream.transport.pool import Pool
from dragoman.upstream.transport.response import Response

MAX_ERROR_BODY = 64 * 1024
# Seconds a model list may take, every instance together (the hedged GET): what /ready,
# discovery and `dragoman check` report is what it saw by then (a 503, or no answer).
MODEL_LIST_TIMEOUT = 5.0
# Seconds the `auto` protocol probe (backends/auto.py) may take, every instance together:
# every request to the upstream waits for it.
PROBE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class Waits:
    """How long the requests that cost a server nothing (`first_answer`) wait on its instances:
    the gateway's (`Gateway.timings.waits`), so that a test sets its own instead of patching
    these defaults."""

    hedge_after: float = hedge.HEDGE_AFTER  # on one instance, before the next is asked too
    model_list: float = MODEL_LIST_TIMEOUT
    probe: float = PROBE_TIMEOUT


def _encode_headers(headers: dict[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if name.lower() in _OWN_HEADERS:
            continue
        line = f"{name}: {value}\r\n"
        if line.count("\n") != 1 or "\r" in line[:-2] or "\0" in line:
            raise ValueError(f"header {name!r}: a name or value holds a line break or NUL")
        lines.append(line.encode("latin-1"))
    return b"".join(lines)


_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})  # set by the pool


def _proxy_for(root: str, configured: str | None) -> str | None:
    """The proxy for a replica: the upstream's own setting, else HTTP(S)_PROXY unless
    NO_PROXY exempts the host (read once, at startup)."""
    if configured:
        return configured
    parts = urlsplit(root)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)


class HttpClient:
    def __init__(
        self,
        name: str,
        upstream: UpstreamConfig,
        api_key: str | None,
        *,
        redactor: Redactor,
        cool_downs: CoolDowns | None = None,  # how long a failed instance is passed over (the gateway's)
        waits: Waits | None = None,  # how long a model list and the protocol probe wait (the gateway's)
        shown_by: gauges.LoadCollector | None = None,  # the gateway's /metrics of its replicas' load
        auth_header: str = "authorization",
        prefix: str = "",
        defaults: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self._upstream = upstream
        self.waits = waits or Waits()
        self.headers = {
            "content-type": "application/json", "accept": "*/*", "accept-encoding": "gzip", "user-agent": f"dragoman/{__version__}",
            **(defaults or {}), **{name.lower(): value for name, value in upstream.headers.items()},
        }  # fmt: skip
        if api_key:
            self.headers[auth_header] = f"Bearer {api_key}" if auth_header == "authorization" else api_key
        self.redactor = redactor  # the gateway's: it redacts this client's keys and every other upstream's
        redactor.register(api_key)
        for header, value in upstream.headers.items():  # credentials set as plain headers
            if any(word in header.lower() for word in ("key", "auth", "token", "secret")):
                redactor.register(value)
        # Each replica as a server root; `prefix` is the API path under it (e.g. /v1).
        roots = []
        for url in [upstream.url, *upstream.replicas]:
            url = url.rstrip("/")
            roots.append(url[: -len(prefix)] if prefix and url.endswith(prefix) else url)
        self.roots = roots
        self.prefix = prefix
        # A trial request to a silent replica takes at most a connection and a first byte.
        policy = upstream.routing or ("cache_aware" if len(roots) > 1 else "round_robin")
        placement = Placement(roots, policy, upstream.cache_routing) if policy != "round_robin" else None
        self.replicas = Replicas(name, roots, trial_for=upstream.connect_timeout + upstream.first_byte_timeout,
                                 cool_downs=cool_downs, placement=placement)  # fmt: skip
        self._proxies = {root: _proxy_for(root, upstream.proxy) for root in roots}
        try:
            self._encoded = _encode_headers(self.headers)
            self._encoded_with: dict[tuple[tuple[str, str], ...], bytes] = {}
            self._pool = Pool(roots, connect_timeout=upstream.connect_timeout, tls=self._tls(), proxies=self._proxies,
                              host=self.headers.get("host"))  # fmt: skip
            # Each replica's own load, read in the background from the first request on (docs/routing.md).
            self.loads = gauges.for_upstream(name, upstream, placement, self._pool, self._encoded, shown_by)
        except (
            ValueError,
            OSError,
        ) as error:  # a proxy from HTTP(S)_PROXY that is not http://, unreadable TLS files, a bad key
            raise ConfigError(f"upstreams.{name}: {error}") from None

    def _header_lines(self, extra: dict[str, str] | None) -> bytes:
        """The request's header lines; the client's own are encoded once, at start-up."""
        if extra is None:
            return self._encoded
        key = tuple(extra.items())
        lines = self._encoded_with.get(key)
        if lines is None:
            lines = _encode_headers({**self.headers, **extra})
            if len(self._encoded_with) < 64:  # client headers passed on (anthropic-version, -beta): a few combinations
                self._encoded_with[key] = lines
        return lines

    def _tls(self) -> ssl.SSLContext | None:
        """The TLS settings of every https:// replica (None when there is none)."""
        if not any(root.startswith("https:") for root in self.roots):
            return None
        upstream = self._upstream
        context = ssl.create_default_context(cafile=upstream.ca_bundle)
        context.set_alpn_protocols(["http/1.1"])
        if not upstream.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if upstream.client_cert:  # presented whether or not the server's certificate is checked
            context.load_cert_chain(upstream.client_cert, upstream.client_key)
        return context

    async def close(self) -> None:
        if self.loads is not None:
            await self.loads.stop()
        await self._pool.close()

    @property
    def tags(self) -> bool:
        """Whether its replicas' tool ids are tagged (`replica_tag`): with replicas, under cache_aware."""
        placement = self.replicas.placement
        return placement is not None and placement.tags

    def replica_tag(self, root: str | None) -> str:
        """The tag for the tool ids the replica `root` makes ("": none), which routing reads back."""
        placement = self.replicas.placement
        return "" if placement is None else placement.tag(root)

    def url(self, path: str, *, from_root: bool = False, root: str | None = None) -> str:
        return (root or self.roots[0]) + ("" if from_root else self.prefix) + path

    async def post(
        self,
        path: str,
        body: bytes,
        *,
        headers: dict[str, str] | None = None,
        from_root: bool = False,
        raw: bool = False,
        outcome: Any = None,
        stream: bool = False,
        prompt: PromptKind | MessagesParts | None = None,
        conversation: str | None = None,
        previous: str | None = None,
        deadline: float | None = None,
    ) -> Response:
        """POST and wait for the response head, retrying transient failures.

        Raises the mapped GatewayError for a non-2xx (with `raw`, returns the last
        response whatever its status, for passthrough to relay). With `stream`, a
        `200 text/event-stream` head is no answer yet: the response's `opening` waits
        for its first body bytes (`dragoman.upstream.opening`), and may send it again.
        `prompt` says the body is a model's prompt of that kind (or gives its parts, read
        already), which cache-aware routing matches (with the client's `conversation`, if
        it named one, and the tag of the replica its turn before went to, `previous`, if it said).
        No retry waits past `deadline` either, when given (a fallback's: the request's budget)."""
        budget_end = time.monotonic() + self._upstream.retry_budget
        if deadline is not None:
            budget_end = min(budget_end, deadline)
        request = Sending(path if from_root else self.prefix + path, self._header_lines(headers), body, outcome, stream,
                          budget_end, kind=prompt,
                          conversation=conversation, previous=previous)  # fmt: skip
        return await self._post(request, raw)

    async def _post(self, request: Sending, raw: bool) -> Response:
        try:
            return await self._attempts(request, raw)
        except BaseException:
            self._release(request)
            raise

    def _place(self, request: Sending) -> str:
        """The instance for this attempt; it counts the request in flight until its reply ends."""
        self._release(request)  # the attempt before, if any
        placement = self.replicas.placement
        if placement is None:
            return self.replicas.pick(avoid=request.root)
        if self.loads is not None:
            self.loads.start()  # once: it needs the running loop
        if request.kind is not None and request.prompt is None and placement.wants_prompt():
            request.prompt = prompt_of(request.body, request.kind, request.conversation, placement.settings.block_bytes,
                                       placement.root_of(request.previous))  # fmt: skip
        decision = self.replicas.place(avoid=request.root, prompt=request.prompt)
        placement.sent(decision.root, request.prompt)
        request.held = decision.root
        if request.outcome is not None:
            _note(request.outcome, decision)
        return decision.root

    def _release(self, request: Sending) -> None:
        if self.replicas.placement is not None:
            _release(self.replicas.placement, request)

    def _answered(self, request: Sending) -> None:
        """The reply came: the request stays in flight until it ends (or at once, with no outcome to say so)."""
        if request.held is None:
            return
        placement = self.replicas.placement
        assert placement is not None  # only it holds
        if request.outcome is None:
            _release(placement, request)
        elif not request.counted:
            request.counted = True
            # Not a closure over the client: the outcome would keep its pool and sockets alive.
            request.outcome.finish.hold(functools.partial(_release, placement, request))

    async def _attempts(self, request: Sending, raw: bool) -> Response:
        replicas = self.replicas
        while True:
            root = request.root = self._place(request)
            if request.outcome is not None:
                request.outcome.replica = root  # for usage accounting: the instance that answers
            wait: float | None = None  # before the retry: None for backoff
            elsewhere = False  # the retry goes at once to another instance, which is free
            try:
                with upstream_errors(self.name):
                    response = await self._send(root, request)
            except UpstreamTimeout:
                # No first byte: nothing has reached the client, so another instance may take
                # the request. Once, and only if one is free: each such wait costs the timeout.
                elsewhere = self.resends_silent(request, root)
                if not elsewhere:
                    raise
            except UpstreamError:
                elsewhere = replicas.others_free(root)  # it is passed over (by _send): no reason to wait for it
                if not may_retry(request.attempt, self._upstream.max_retries, request.budget_end, None, elsewhere):
                    raise
            else:
                if response.status < 300:
                    if response.opening is None:
                        replicas.answered(root)
                    self._answered(request)
                    return response
                replicas.answered(root)  # a refusal is an answer
                retryable = response.status in RETRY_STATUSES
                wait = retry_after(response.headers.get("retry-after"))
                if retryable and wait and len(self.roots) > 1:
                    elsewhere = replicas.pass_over(root, wait)  # another instance free: no reason to wait for this one
                if not retryable or not may_retry(
                    request.attempt, self._upstream.max_retries, request.budget_end, wait, elsewhere
                ):
                    if raw:
                        self._answered(request)
                        return response
                    try:
                        with upstream_errors(self.name):
                            error_body = await response.read(MAX_ERROR_BODY)
                    finally:
                        response.release()
                    raise from_upstream(response.status, error_body, upstream=self.name, redactor=self.redactor,
                                        retry_after=response.headers.get("retry-after"))  # fmt: skip
                response.release()
            count_retry(request)
            if not elsewhere:
                await asyncio.sleep(backoff(request.attempt, wait, request.budget_end))

    async def _send(self, root: str, request: Sending) -> Response:
        """POST to `root` and wait for the head; a failure decides when `root` is asked again
        (an answer is for `_post` to note: a stream's head alone is none)."""
        replicas = self.replicas
        trace = getattr(request.outcome, "trace", None)  # tracing on: a span per attempt, its traceparent sent
        if trace is None:
            lines = request.lines
        else:  # the routing decision (_pick) was noted on the outcome just before
            lines = trace.attempt(root, request.lines, request.outcome.routing, request.outcome.prefix_tokens)
        try:
            response = await self._pool.request(root, b"POST", request.target, lines, request.body,
                                                head_timeout=self._upstream.first_byte_timeout,
                                                idle_timeout=self._upstream.idle_timeout)  # fmt: skip
        except (ConnectTimeout, HeadTimeout):
            replicas.failed(root, silent=True)
            if trace is not None:
                trace.attempt_failed("timeout")
            raise
        except ConnectionError:
            replicas.failed(root, silent=False)
            if trace is not None:
                trace.attempt_failed("connection_error")
            raise
        except BaseException:
            replicas.abandoned(root)  # the client left, say: no verdict on the instance
            raise
        if trace is not None and response.status >= 300:
            trace.attempt_failed(str(response.status))
        if request.stream and response.status == 200 and response.content_type == "text/event-stream":
            response.opening = Opening(self, request, root, self._upstream.first_byte_timeout)
        return response

    def resends_silent(self, request: Sending, root: str) -> bool:
        """Whether `request`, which `root` left without an answer within first_byte_timeout,
        goes once more, at once, to another instance: only once per request, and only if
        another is free (each such wait costs the whole timeout), within max_retries."""
        once, request.timed_out = not request.timed_out, True
        return once and self._resends_elsewhere(request, root)

    def resends_broken(self, request: Sending, root: str) -> bool:
        """Whether a stream request whose connection `root` closed or reset after the head, before
        a byte of the body, goes once more, at once, to another instance: as for a silence, only
        once per request (the request itself may be what brings a server down: it is not passed
        round the fleet) and only if another is free (waiting out a restart would be all the
        backoff could do), within max_retries."""
        once, request.broke = not request.broke, True
        return once and self._resends_elsewhere(request, root)

    def _resends_elsewhere(self, request: Sending, root: str) -> bool:
        elsewhere = self.replicas.others_free(root)
        return elsewhere and may_retry(request.attempt, self._upstream.max_retries, request.budget_end, None, elsewhere)

    async def resend(self, request: Sending) -> Response:
        """`request` again, after `resends_silent` or `resends_broken` said so (the stream's opening asks)."""
        count_retry(request)
        return await self._post(request, raw=False)  # a refusal now can only be an error event: mapped here

    async def get(self, path: str, *, timeout: float | None = None, from_root: bool = False) -> tuple[int, bytes]:
        """A GET (the model list): the first answer below 500 from any instance (`first_answer`),
        within `waits.model_list` unless told otherwise."""
        timeout = self.waits.model_list if timeout is None else timeout
        status, _, body = await self.first_answer(
            b"GET", path, None, timeout=timeout, from_root=from_root, accept=_below_500
        )
        return status, body

    async def first_answer(
        self,
        method: bytes,
        path: str,
        body: bytes | None,
        *,
        timeout: float,
        accept: Callable[[int, str], bool],
        headers: dict[str, str] | None = None,
        from_root: bool = False,
        pass_over_silent: bool = False,
    ) -> tuple[int, str, bytes]:
        """(status, content type, body) of the first answer `accept` takes from any instance
        (`upstream.hedge`), for a request that costs the server nothing (a model list, the
        protocol probe). `pass_over_silent`: instances still silent when one answered are passed
        over as silent (the protocol probe: the requests that follow it avoid them). Answers do
        not end a replica's cool-down: a server may list its models while its engine hangs."""
        target = path if from_root else self.prefix + path
        lines = self._header_lines(headers)
        limit = None if method == b"GET" else MAX_ERROR_BODY
        on_silent = functools.partial(self.replicas.failed, silent=True) if pass_over_silent else None
        return await hedge.first_answer(self.name, self.replicas.order(),
                                        lambda root: self._ask(root, method, target, lines, body, limit),
                                        timeout=timeout, accept=accept, on_silent=on_silent,
                                        hedge_after=self.waits.hedge_after)  # fmt: skip

    async def _ask(
        self, root: str, method: bytes, target: str, lines: bytes, body: bytes | None, limit: int | None
    ) -> tuple[int, str, bytes]:
        with upstream_errors(self.name):
            try:
                response = await self._pool.request(
                    root, method, target, lines, body, idle_timeout=self._upstream.idle_timeout
                )
                try:
                    return response.status, response.content_type, await response.read(limit)
                finally:
                    response.release()
            except ConnectionError as error:  # no connection, or it failed: passed over, as for a POST
                self.replicas.failed(root, silent=isinstance(error, ConnectTimeout))
                raise


def _release(placement: Placement, request: Sending) -> None:
    """The request's instance no longer counts it in flight (its attempt or its reply ended)."""
    held, request.held = request.held, None
    if held is not None:
        placement.ended(held)


def _note(outcome: Any, decision: Decision) -> None:
    """The routing decision, for the access log and the metrics (the last attempt's)."""
    outcome.replica, outcome.routing = decision.root, decision.reason
    outcome.prefix_tokens, outcome.routed_tokens = decision.matched_tokens, decision.prompt_tokens
    outcome.replica_load = decision.load


def _below_500(status: int, content_type: str) -> bool:
    return status < 500
