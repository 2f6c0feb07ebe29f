"""What a response and its body need of the connection that carries them, and of the
pool it goes back to: the leaf of the transport, so that `connection`, `response`,
`body` and `pool` each import it and none imports another in a circle."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class Link(Protocol):
    """The connection, as the response reading from it sees it."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    response: Any  # the Response being read, or None when idle
    lost: bool

    @property
    def reusable(self) -> bool: ...

    def close(self) -> None: ...


class Returns(Protocol):
    """Where a connection goes once its response was read to the end."""

    def put_back(self, conn: Any) -> None: ...
