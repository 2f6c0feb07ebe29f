"""One pooled HTTP client per upstream: its replicas, key, headers, timeouts, retries.

Connections are dragoman's own (`dragoman.backends.pool`): aiohttp cost three times
as much CPU per request (bench/clients.py measures both).

Before any byte has gone to the client, a transient failure (connection refused or
reset, 429, 502, 503, 504, 529) is retried with backoff and jitter, honouring
`retry-after`, on another healthy replica when there is one, within a bounded
budget. A replica's `retry-after` speaks for that replica only: it is passed over
for that long and the request goes at once to another one that is free.
Non-2xx answers are mapped here, once, so callers see a 2xx response or a
GatewayError (unless they ask for the raw response, as passthrough does).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import ssl
import time
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from dragoman import __version__
from dragoman.backends.base import upstream_errors
from dragoman.backends.pool import Pool
from dragoman.backends.response import Response
from dragoman.config import ConfigError, UpstreamConfig
from dragoman.errors import GatewayError, UpstreamError, UpstreamTimeout, from_upstream, register_secret

MAX_ERROR_BODY = 64 * 1024
RETRY_STATUSES = frozenset({429, 502, 503, 504, 529})
UNHEALTHY_FOR = 5.0  # seconds a replica that refused a connection is passed over
RETRY_AFTER_CAP = 60.0  # at most this long is a replica passed over for its own `retry-after`
BACKOFF_BASE = 0.25
HEDGE_AFTER = 1.0  # seconds a GET (a model list) waits on one instance before the next is asked too


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


def _retry_after(value: str | None) -> float | None:
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to backoff


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
        self, name: str, upstream: UpstreamConfig, api_key: str | None, *, auth_header: str = "authorization", prefix: str = "",
        defaults: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self._upstream = upstream
        self.headers = {
            "content-type": "application/json", "accept": "*/*", "accept-encoding": "gzip", "user-agent": f"dragoman/{__version__}",
            **(defaults or {}), **{name.lower(): value for name, value in upstream.headers.items()},
        }  # fmt: skip
        if api_key:
            self.headers[auth_header] = f"Bearer {api_key}" if auth_header == "authorization" else api_key
        register_secret(api_key)
        for header, value in upstream.headers.items():  # credentials set as plain headers
            if any(word in header.lower() for word in ("key", "auth", "token", "secret")):
                register_secret(value)
        # Each replica as a server root; `prefix` is the API path under it (e.g. /v1).
        roots = []
        for url in [upstream.url, *upstream.replicas]:
            url = url.rstrip("/")
            roots.append(url[: -len(prefix)] if prefix and url.endswith(prefix) else url)
        self.roots = roots
        self.prefix = prefix
        self._unhealthy: dict[str, float] = {}
        self._proxies = {root: _proxy_for(root, upstream.proxy) for root in roots}
        self._turn = itertools.cycle(range(len(roots)))
        try:
            self._encoded = _encode_headers(self.headers)
            self._encoded_with: dict[tuple[tuple[str, str], ...], bytes] = {}
            self._pool = Pool(roots, connect_timeout=upstream.connect_timeout, tls=self._tls(), proxies=self._proxies,
                              host=self.headers.get("host"))  # fmt: skip
        except (ValueError, OSError) as error:  # a proxy from HTTP(S)_PROXY that is not http://, unreadable TLS files, a bad key
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
        await self._pool.close()

    def _pick(self, avoid: str | None) -> str:
        now = time.monotonic()
        healthy = [r for r in self.roots if self._unhealthy.get(r, 0.0) <= now and r != avoid]
        if not healthy:
            healthy = [r for r in self.roots if r != avoid] or self.roots
        if len(healthy) == 1:
            return healthy[0]
        for _ in range(len(self.roots)):
            candidate = self.roots[next(self._turn)]
            if candidate in healthy:
                return candidate
        return healthy[0]

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
    ) -> Response:
        """POST and wait for the response head, retrying transient failures.

        Raises the mapped GatewayError for a non-2xx (with `raw`, returns the last
        response whatever its status, for passthrough to relay)."""
        lines = self._header_lines(headers)
        target = path if from_root else self.prefix + path
        budget_end = time.monotonic() + self._upstream.retry_budget
        root: str | None = None
        attempt = 0
        while True:
            root = self._pick(avoid=root)
            wait: float | None = None
            try:
                with upstream_errors(self.name):
                    response = await self._pool.request(root, b"POST", target, lines, body, head_timeout=self._upstream.first_byte_timeout,
                                                        idle_timeout=self._upstream.idle_timeout)  # fmt: skip
            except UpstreamTimeout:
                raise  # a slow upstream is not helped by asking again
            except UpstreamError:
                self._unhealthy[root] = time.monotonic() + UNHEALTHY_FOR
                if not self._may_retry(attempt, budget_end, None):
                    raise
            else:
                if response.status < 300:
                    return response
                retryable = response.status in RETRY_STATUSES
                wait = _retry_after(response.headers.get("retry-after"))
                if retryable and wait and len(self.roots) > 1 and self._pass_over(root, wait):
                    wait = 0.0  # another instance is free: no reason to wait for this one
                if not retryable or not self._may_retry(attempt, budget_end, wait):
                    if raw:
                        return response
                    try:
                        with upstream_errors(self.name):
                            error_body = await response.read(MAX_ERROR_BODY)
                    finally:
                        response.release()
                    raise from_upstream(response.status, error_body, upstream=self.name, retry_after=response.headers.get("retry-after"))
                response.release()
            attempt += 1
            if outcome is not None:
                outcome.retries += 1
            await asyncio.sleep(self._delay(attempt, wait, budget_end))

    def _pass_over(self, root: str, seconds: float) -> bool:
        """Pass `root` over for the `retry-after` it sent (capped); whether another
        instance is free to take the request meanwhile."""
        now = time.monotonic()
        self._unhealthy[root] = max(self._unhealthy.get(root, 0.0), now + min(seconds, RETRY_AFTER_CAP))
        return any(self._unhealthy.get(other, 0.0) <= now for other in self.roots if other != root)

    def _may_retry(self, attempt: int, budget_end: float, retry_after: float | None) -> bool:
        if attempt >= self._upstream.max_retries:
            return False
        remaining = budget_end - time.monotonic()
        return remaining > 0 and (retry_after is None or retry_after <= remaining)

    def _delay(self, attempt: int, retry_after: float | None, budget_end: float) -> float:
        if retry_after is not None:
            delay = retry_after
        else:
            delay = BACKOFF_BASE * 2 ** (attempt - 1) * random.uniform(0.75, 1.25)
        return max(0.0, min(delay, budget_end - time.monotonic()))

    async def get(self, path: str, *, timeout: float = 10.0, from_root: bool = False) -> tuple[int, bytes]:
        """A GET (the model list): the first answer below 500 from any instance (`first_answer`)."""
        status, _, body = await self.first_answer(b"GET", path, None, timeout=timeout, from_root=from_root, accept=_below_500)
        return status, body

    async def first_answer(
        self, method: bytes, path: str, body: bytes | None, *, timeout: float, accept: Callable[[int, str], bool],
        headers: dict[str, str] | None = None, from_root: bool = False, pass_over_silent: bool = False,
    ) -> tuple[int, str, bytes]:
        """(status, content type, body) of the first answer `accept` takes, for a request that
        costs the server nothing (a model list, the protocol probe). The next instance is asked
        at once after a failure (no connection, an answer not taken), or alongside one still
        silent after HEDGE_AFTER seconds, so that one instance that hangs does not fail it; each
        once. `timeout` bounds the whole; the last failure is raised, or the last answer returned,
        at the timeout too (an instance that answered 503 is told as such, not as a timeout).
        `pass_over_silent`: instances still silent when one answered are passed over, as those
        refusing connections are (the protocol probe: the requests that follow it avoid them)."""
        target = path if from_root else self.prefix + path
        lines = self._header_lines(headers)
        limit = None if method == b"GET" else MAX_ERROR_BODY
        first = self._pick(avoid=None)
        waiting = [first, *(root for root in self.roots if root != first)]
        asking: dict[asyncio.Task[tuple[int, str, bytes]], str] = {}
        failed: tuple[int, str, bytes] | GatewayError | None = None
        try:
            with upstream_errors(self.name):
                try:
                    async with asyncio.timeout(timeout):
                        while waiting or asking:
                            if waiting:  # the first, or the next after a failure or a silence
                                root = waiting.pop(0)
                                asking[asyncio.ensure_future(self._ask(root, method, target, lines, body, limit))] = root
                            done, _ = await asyncio.wait(asking, timeout=HEDGE_AFTER if waiting else None, return_when=asyncio.FIRST_COMPLETED)
                            for task in done:
                                root = asking.pop(task)
                                error = task.exception()
                                if error is None and accept(*task.result()[:2]):
                                    if pass_over_silent:
                                        for other, silent in asking.items():
                                            if not other.done():
                                                self._unhealthy[silent] = time.monotonic() + UNHEALTHY_FOR
                                    return task.result()
                                if isinstance(error, UpstreamError):  # no connection: passed over, as for a POST
                                    self._unhealthy[root] = time.monotonic() + UNHEALTHY_FOR
                                elif error is not None and not isinstance(error, GatewayError):
                                    raise error
                                failed = task.result() if error is None else error
                except TimeoutError:
                    if failed is None:  # no instance answered: the timeout is the news
                        raise
        finally:
            for task in asking:
                task.cancel()  # closes its connection: the instance stops working on it
            if asking:
                await asyncio.wait(asking)
                for task in asking:  # cancel() silences an error a task had already; not one it ends with as it is cancelled
                    if not task.cancelled():
                        task.exception()  # retrieved (of no interest), so never logged as "never retrieved"
        if isinstance(failed, GatewayError):
            raise failed
        assert failed is not None
        return failed

    async def _ask(
        self, root: str, method: bytes, target: str, lines: bytes, body: bytes | None, limit: int | None
    ) -> tuple[int, str, bytes]:
        with upstream_errors(self.name):
            response = await self._pool.request(root, method, target, lines, body, idle_timeout=self._upstream.idle_timeout)
            try:
                return response.status, response.content_type, await response.read(limit)
            finally:
                response.release()


def _below_500(status: int, content_type: str) -> bool:
    return status < 500
