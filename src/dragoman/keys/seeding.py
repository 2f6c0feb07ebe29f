"""A money budget's spend so far in its period, from the usage ledger, for a process that
has not counted that period yet: a restarted gateway does not hand a spent budget out again.

The keyring calls `Seeder.seed` with the rows it read, before it serves them: so a key's
first request in this process finds its bucket charged with what the ledger holds for it
(requests that began before that moment; later ones the bucket counts itself). The store
takes a seed only where it holds nothing for that bucket: with Redis, the first process to
see the period seeds it and every other counts on from there; without Redis, each process
seeds its own bucket and counts only its own requests on top (docs/team.md says the bound).
The ledger slow or away: the bucket starts unspent, logged; the keys are served all the same."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from dragoman.keys import cost, money
from dragoman.keys.records import KeyRow
from dragoman.limits.gate import Limits
from dragoman.limits.store import Want
from dragoman.usage.writer import UsageWriter

log = logging.getLogger("dragoman.keys")

SEED_TIMEOUT = 2.0  # seconds the ledger may take; past it the keys are served, their budgets unspent
MANY = 1000  # keys past which the ledger is read for every key rather than by a list of ids


class Seeder:
    def __init__(self, limits: Limits, prices: money.Prices, usage: UsageWriter) -> None:
        self._limits = limits  # its store read when seeding: a reload hands the old one over
        self._prices = prices
        self._usage = usage
        self._seeded: set[str] = set()  # buckets this process has seeded (or found counted)

    async def seed(self, rows: Iterable[KeyRow]) -> None:
        """Every budgeted key's bucket for the current period charged from the ledger, once."""
        now = time.time()
        todo: dict[str, list[tuple[str, Want]]] = {}  # period -> (key id, its bucket)
        for row in rows:
            if row.budget is None or row.status == "deleted":
                continue
            want = money.bucket(row.id, row.budget, now)
            if want.key not in self._seeded:
                todo.setdefault(row.budget.period, []).append((row.id, want))
        if not todo or not self._prices:
            return
        try:
            async with asyncio.timeout(SEED_TIMEOUT):
                if not await asyncio.shield(self._usage.flush()):  # this process's own records first (uncut)
                    raise ConnectionError("the usage store refused this process's records")
                for period, keys in todo.items():
                    await self._seed_period(period, keys, now)
        except Exception as error:  # noqa: BLE001 - the ledger or Redis away: serve, saying what it costs
            log.warning("keys: %d money budgets start this period unspent: their spend could not be read from the "
                        "usage ledger, or not written to the limits' store (%s: %s)", sum(map(len, todo.values())),
                        type(error).__name__, error)  # fmt: skip

    async def _seed_period(self, period: str, keys: list[tuple[str, Want]], now: float) -> None:
        _, start, _ = money.window(period, now)
        ids = [key for key, _ in keys]
        if len(ids) > MANY:
            every = await cost.spent_by_key(self._usage.store, self._prices, (), start, now)
            spent = {key: every.get(key, 0.0) for key in ids}
        else:
            spent = await cost.spent_by_key(self._usage.store, self._prices, ids, start, now)
        await self._limits.store.seed([(want, -spent[key]) for key, want in keys if spent[key] > 0])
        self._seeded.update(want.key for _, want in keys)
