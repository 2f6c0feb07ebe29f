"""What a reader of the usage store (the reports), or an admin changing keys in the same
database, gets while it is down, slow or locked: a 503 `overloaded_error` with `retry-after`
(within the statement timeout, for reads), never a 500 or a hang. Logged once per outage."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dragoman.core.errors import GatewayError, StoreUnavailable

log = logging.getLogger("dragoman.usage")

T = TypeVar("T")
RETRY_AFTER = "5"  # seconds a client is told to wait


class Outage:
    """The database's outage as one process sees it. The usage writer and the keyring both
    find it (each retries every second); whichever does first logs it, and the last to see it
    back logs its end: one warning per outage per process, whoever noticed."""

    def __init__(self) -> None:
        self._parts: set[str] = set()
        self.told = False  # its start is logged (by a part, or by a reader that met it first)

    @property
    def down(self) -> bool:
        return bool(self._parts)

    def failed(self, part: str) -> bool:
        """`part` cannot reach the database; True if it is the first to say so (it logs)."""
        first = not self._parts and not self.told
        self._parts.add(part)
        self.told = True
        return first

    def answered(self, part: str) -> bool:
        """`part` reaches the database; True if the outage ends with it (it logs the end)."""
        if part not in self._parts:
            return False
        self._parts.discard(part)
        if self._parts:
            return False
        self.told = False
        return True


class ReadGuard:
    """Bounds each read by `timeout` seconds (the database's statement timeout, plus a
    second for its answer to arrive) and turns a store's failure into StoreUnavailable."""

    def __init__(self, timeout: float | None, outage: Callable[[], Outage], store: str = "usage") -> None:
        self.timeout = None if timeout is None else timeout + 1.0  # None: no bound (a write cut short is unknown)
        self._outage = outage  # the process's view: whoever meets the outage first logs it
        self._store = store
        self.on_refused: Callable[[], None] = lambda: None  # counts each 503 (dragoman_store_outage_requests)
        self.failing = False  # logged once per outage
        self._logged = False  # this guard told of the outage (no other part had)

    async def __call__(self, read: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout):
                result = await read
        except GatewayError:
            raise  # the client's mistake (a bad parameter), not the store's
        except Exception as error:  # noqa: BLE001 - any driver's failure, or the timeout
            outage = self._outage()
            if not self.failing and not outage.told:
                log.warning("the admin API cannot reach the database (%s: %s); answering 503 until it can",
                            type(error).__name__, error or "timed out")  # fmt: skip
                self._logged = outage.told = True
            self.failing = True
            raise self.refused() from None
        if self.failing:
            outage = self._outage()
            if self._logged and outage.told and not outage.down:  # its end, where its start was told, unless told
                log.info("the admin API reaches the database again")
                outage.told = False
            self.failing = self._logged = False
        return result

    def refused(self) -> StoreUnavailable:
        """The 503 a reader gets while the store is out, counted."""
        self.on_refused()
        return StoreUnavailable(f"the {self._store} store cannot be reached now; try again shortly",
                                retry_after=RETRY_AFTER)  # fmt: skip
