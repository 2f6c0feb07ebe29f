"""One gateway's background work in a serving process, from its start to its close.

At start, without Redis, the budgets (`tokens_per_day`, `tokens_per_month`) are charged with
what the usage ledger says this day and month used, so that a restart does not hand a spent
budget out again. The per-minute buckets start full, as a new process's always do.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time

from dragoman.assembly.gateway import Gateway
from dragoman.core.limit_settings import LimitsConfig
from dragoman.limits.store import LocalStore
from dragoman.usage.ledger import used_since
from dragoman.usage.stores import store_for

log = logging.getLogger("dragoman")

SEED_TIMEOUT = 10.0  # seconds the ledger may take at start; past it the budgets start unspent (logged)


class Running:
    """A gateway started (`start`) and, at the end, closed (`close`)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, *, seed: bool = True) -> None:
        """Before it serves: the owners' directories renamed, discovery begun, the batch keeper and
        usage writer started, and (`seed`) its in-process budgets charged from the ledger."""
        gateway = self.gateway
        await asyncio.to_thread(gateway.rename_legacy_owners)  # before any request looks for an owner's data
        self._tasks = [
            asyncio.create_task(gateway.discover_all(gateway.backends)),
            asyncio.create_task(gateway.keep_registry_fresh()),
            asyncio.create_task(gateway.files.adopt_flat()),  # files written flat by earlier versions
        ]
        await gateway.batches.start()
        if gateway.usage is not None:
            gateway.usage.start()
        gateway.keyring.start()
        if seed:
            await seed_budgets(gateway)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.gateway.close()


async def seed_budgets(gateway: Gateway) -> None:
    """The in-process budgets charged with this day's and month's use, from the usage ledger
    (with Redis the buckets outlive the process; without `[usage]` there is no ledger)."""
    limits = gateway.limits
    if limits is None or not isinstance(limits.store, LocalStore) or not gateway.config.usage.enabled:
        return
    if not _budgeted(limits.config):
        return
    store = store_for(gateway.config)
    now = time.time()
    try:
        async with asyncio.timeout(SEED_TIMEOUT):
            await store.open()
            try:
                for window in ("day", "month"):
                    for used in await used_since(store, window_start(window, now), now + 1):
                        limits.charge_used(
                            window, used.key_id, used.tenant, used.model, used.upstream_model, used.tokens
                        )
            finally:
                await store.close()
    except Exception as error:  # noqa: BLE001 - the ledger down: serve, saying what it costs
        log.warning(
            "the budgets start unspent: the usage ledger could not be read (%s: %s)", type(error).__name__, error
        )


def window_start(window: str, now: float) -> float:
    """The UTC midnight that began this day, or this month (`limits.gate.window_end`'s windows)."""
    day = datetime.datetime.fromtimestamp(now, datetime.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (day if window == "day" else day.replace(day=1)).timestamp()


def _budgeted(config: LimitsConfig) -> bool:
    tables = [config, *config.models.values()]
    for tenant in config.tenants.values():
        tables += [tenant, *tenant.models.values()]
    return any(t.tokens_per_day is not None or t.tokens_per_month is not None for t in tables)
