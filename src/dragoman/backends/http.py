"""One pooled HTTP client per upstream: its replicas, key, headers, timeouts, retries.

Before any byte has gone to the client, a transient failure (connection refused or
reset, 429, 502, 503, 504, 529) is retried with backoff and jitter, honouring
`retry-after`, on another healthy replica when there is one, within a bounded
budget. Non-2xx answers are mapped here, once, so callers see a 2xx response or a
GatewayError (unless they ask for the raw response, as passthrough does).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from dragoman.backends.base import upstream_errors
from dragoman.config import UpstreamConfig
from dragoman.errors import GatewayError, UpstreamError, UpstreamTimeout, from_upstream

MAX_ERROR_BODY = 64 * 1024
RETRY_STATUSES = frozenset({429, 502, 503, 504, 529})
UNHEALTHY_FOR = 5.0  # seconds a replica that refused a connection is passed over
BACKOFF_BASE = 0.25


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
        self, name: str, upstream: UpstreamConfig, api_key: str | None, *, auth_header: str = "authorization", prefix: str = ""
    ) -> None:
        self.name = name
        self._upstream = upstream
        self._session: aiohttp.ClientSession | None = None
        self.headers = {"content-type": "application/json", **upstream.headers}
        if api_key:
            self.headers[auth_header] = f"Bearer {api_key}" if auth_header == "authorization" else api_key
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

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True, ssl=self._ssl())
            timeout = aiohttp.ClientTimeout(total=None, connect=self._upstream.connect_timeout, sock_connect=self._upstream.connect_timeout)
            # trust_env would look up .netrc and the proxy variables on every request;
            # the proxy is decided once per replica instead (see _proxies).
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=True, trust_env=False, skip_auto_headers=("user-agent",)
            )
        return self._session

    def _ssl(self) -> Any:
        upstream = self._upstream
        if not (upstream.ca_bundle or upstream.client_cert):
            return upstream.tls_verify  # True: the default context; False: no verification
        import ssl

        context = ssl.create_default_context(cafile=upstream.ca_bundle)
        if not upstream.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if upstream.client_cert:  # presented whether or not the server's certificate is checked
            context.load_cert_chain(upstream.client_cert, upstream.client_key)
        return context

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

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
    ) -> aiohttp.ClientResponse:
        """POST and wait for the response head, retrying transient failures.

        Raises the mapped GatewayError for a non-2xx (with `raw`, returns the last
        response whatever its status, for passthrough to relay)."""
        send_headers = self.headers if headers is None else {**self.headers, **headers}
        budget_end = time.monotonic() + self._upstream.retry_budget
        root: str | None = None
        attempt = 0
        while True:
            root = self._pick(avoid=root)
            wait: float | None = None
            try:
                with upstream_errors(self.name):
                    async with asyncio.timeout(self._upstream.first_byte_timeout):
                        response = await self.session().post(
                            self.url(path, from_root=from_root, root=root), data=body, headers=send_headers, proxy=self._proxies[root]
                        )
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
                if not retryable or not self._may_retry(attempt, budget_end, wait):
                    if raw:
                        return response
                    try:
                        error_body = await response.content.read(MAX_ERROR_BODY)
                    finally:
                        response.release()
                    raise from_upstream(response.status, error_body, upstream=self.name, retry_after=response.headers.get("retry-after"))
                response.release()
            attempt += 1
            if outcome is not None:
                outcome.retries += 1
            await asyncio.sleep(self._delay(attempt, wait, budget_end))

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
        last: GatewayError | None = None
        for root in [self._pick(avoid=None), *self.roots]:
            try:
                with upstream_errors(self.name):
                    async with asyncio.timeout(timeout):
                        async with self.session().get(
                            self.url(path, from_root=from_root, root=root), headers=self.headers, proxy=self._proxies[root]
                        ) as response:
                            return response.status, await response.read()
            except UpstreamError as error:  # try the next replica
                self._unhealthy[root] = time.monotonic() + UNHEALTHY_FOR
                last = error
        assert last is not None
        raise last
