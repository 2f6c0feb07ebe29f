"""What the URL fetches of one request may take together, and of all requests in a process.

A request of a few hundred bytes can name many URLs, each of up to `fetch_max_bytes`: so
its fetches share one `Budget`, whatever the kind (images, documents) and path. Each
distinct URL is fetched once, however often the request names it; its bytes count once
for each place it fills, since each place is sent on. Past `max_request_bytes` together
(what the request could have held itself) the request is a 400. The bytes fetched and
held by all requests in flight are bounded by `fetch_max_held_bytes` per gateway (its
`Held`, in `backends.shared.Shared`): past
it a request is answered 529, as the PDFs waiting to be read are (`core.offload`), and
the SDKs retry it. A request holds its bytes until its backend has its answer (for a
stream: until its head). All of a request's fetches, the waits for one of its
`PARALLEL_FETCHES` places included, end within one deadline, `fetch_total_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from dragoman.core.config import ServerConfig
from dragoman.core.errors import InvalidRequest, Overloaded

MAX_DOCUMENTS = 100  # URL documents (and, apart, URL images) fetched for one request
PARALLEL_FETCHES = 4  # of one request's fetches, running at once


class Held:
    """The bytes fetched and held by one gateway's requests in flight."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class Budget:
    """The fetches of one request. `release()` it when the request is done with them."""

    __slots__ = ("_server", "_all", "_left", "_uses", "_sizes", "bytes", "held", "_slots", "_deadline", "fetched")

    def __init__(self, server: ServerConfig, held: Held) -> None:
        self._server = server
        self._all = held  # what every request of the gateway holds
        self._left = {"document": MAX_DOCUMENTS, "image": MAX_DOCUMENTS}
        self._uses: dict[tuple[str, str], int] = {}  # the places each URL fills, by kind (dicts: made per request)
        self._sizes: dict[tuple[str, str], int] = {}  # the bytes fetched from each URL, by kind
        self.bytes = server.max_request_bytes  # what its fetches may still add to the request
        self.held = 0  # of the gateway's `Held`
        self._slots: asyncio.Semaphore | None = None
        self._deadline: float | None = None
        self.fetched: dict[str, Any] = {}  # what was fetched already, by URL, for paths that fetch one by one

    def count(self, where: str, url: str, kind: str = "document") -> None:
        """One more place (at `where` in the request) filled from `url`."""
        self._left[kind] -= 1
        if self._left[kind] < 0:
            raise InvalidRequest(f"{where}.source: at most {MAX_DOCUMENTS} {kind}s are fetched by URL for one request")
        self._uses[kind, url] = self._uses.get((kind, url), 0) + 1

    def take(self, size: int, url: str, kind: str = "document", places: int | None = None) -> None:
        """`size` more bytes fetched from `url`, counted for each place it fills (or `places`)."""
        if places is None:  # fetched now
            self._sizes[kind, url] = self._sizes.get((kind, url), 0) + size
        size *= max(1, self._uses.get((kind, url), 0)) if places is None else places
        self.bytes -= size
        if self.bytes < 0:
            raise InvalidRequest(f"{kind} URL {url!r}: the images and documents fetched for this request together "
                                 f"pass server.max_request_bytes ({self._server.max_request_bytes} bytes)")  # fmt: skip
        if self._all.bytes + size > self._server.fetch_max_held_bytes:
            raise Overloaded(f"the images and documents fetched by URL for the requests in flight hold "
                             f"server.fetch_max_held_bytes ({self._server.fetch_max_held_bytes} bytes); "
                             f"send it again later", retry_after="1")  # fmt: skip
        self._all.bytes += size
        self.held += size

    def size(self, url: str, kind: str = "document") -> int:
        """The bytes fetched from `url`."""
        return self._sizes.get((kind, url), 0)

    def __enter__(self) -> Budget:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        """Give back what the request held."""
        self._all.bytes -= self.held
        self.held = 0

    @contextlib.asynccontextmanager
    async def turn(self, url: str, kind: str = "document") -> AsyncIterator[None]:
        """One fetch: one of the request's places to fetch in, within its deadline."""
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self._server.fetch_total_timeout
            self._slots = asyncio.Semaphore(PARALLEL_FETCHES)
        assert self._slots is not None
        try:
            async with asyncio.timeout_at(self._deadline), self._slots:
                yield
        except TimeoutError:
            raise InvalidRequest(f"{kind} URL {url!r}: not fetched in time: all the fetches of one request must end "
                                 f"within server.fetch_total_timeout ({self._server.fetch_total_timeout:g} s)") from None  # fmt: skip
