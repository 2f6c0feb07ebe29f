"""One pooled HTTP client per upstream, with its key, headers and timeouts.

Non-2xx answers are mapped here, once, so callers only ever see a 2xx response or
a GatewayError.
"""

from __future__ import annotations

import asyncio

import aiohttp

from dragoman.backends.base import upstream_errors
from dragoman.config import UpstreamConfig
from dragoman.errors import from_upstream

MAX_ERROR_BODY = 64 * 1024


class HttpClient:
    def __init__(self, name: str, upstream: UpstreamConfig, api_key: str | None, *, auth_header: str = "authorization") -> None:
        self.name = name
        self._upstream = upstream
        self._session: aiohttp.ClientSession | None = None
        self.headers = {"content-type": "application/json", **upstream.headers}
        if api_key:
            if auth_header == "authorization":
                self.headers["authorization"] = f"Bearer {api_key}"
            else:
                self.headers[auth_header] = api_key

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
            timeout = aiohttp.ClientTimeout(total=None, connect=self._upstream.connect_timeout, sock_connect=self._upstream.connect_timeout)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=True, trust_env=True, skip_auto_headers=("user-agent",)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(
        self, url: str, body: bytes, *, stream: bool = False, headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """POST and wait for the response head; raise the mapped error for a non-2xx."""
        send_headers = self.headers if headers is None else {**self.headers, **headers}
        with upstream_errors(self.name):
            async with asyncio.timeout(self._upstream.first_byte_timeout):
                response = await self.session().post(url, data=body, headers=send_headers)
                if response.status >= 300:
                    try:
                        raw = await response.content.read(MAX_ERROR_BODY)
                    finally:
                        response.release()
                    raise from_upstream(response.status, raw, upstream=self.name, retry_after=response.headers.get("retry-after"))
        return response

    async def get(self, url: str, *, timeout: float = 10.0) -> tuple[int, bytes]:
        with upstream_errors(self.name):
            async with asyncio.timeout(timeout):
                async with self.session().get(url, headers=self.headers) as response:
                    return response.status, await response.read()
