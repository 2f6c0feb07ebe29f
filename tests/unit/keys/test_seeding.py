"""Seeding a money budget from the ledger (real SQLite): what the ledger holds is charged once
per period and process, and a ledger that cannot be read delays no key (logged)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from dragoman.core.config import Price as PriceConfig
from dragoman.keys import money
from dragoman.keys.records import Budget, KeyRow
from dragoman.keys.ring import Keyring
from dragoman.keys.seeding import Seeder
from dragoman.limits.store import LocalStore
from dragoman.usage.sqlite import SqliteStore
from dragoman.usage.writer import UsageWriter
from tests.support.usage import usage_record

PRICES = money.Prices([("m", [], PriceConfig(input=1.0, output=1.0))])  # a token: 1000 nano-dollars
BUDGET = Budget(amount="1", period="day")  # 10,000,000 nano-dollars


def _row(version: int = 1) -> KeyRow:
    return KeyRow(id="key_a", digest="d", hint="h", name="a", budget=BUDGET, version=version)


def _spent(store: LocalStore) -> float:
    want = money.bucket("key_a", BUDGET, time.time())
    return money.SPAN - store.take_now([want]).levels[0]


def test_the_ledgers_spend_is_charged_once(tmp_path: Path) -> None:
    async def run() -> float:
        ledger = SqliteStore(tmp_path)
        await ledger.open()
        record = usage_record("r1", time.time() - 1)  # 1 input and 1 output token
        await ledger.write([msgspec.structs.replace(record, key_id="key_a")])
        limits = SimpleNamespace(store=LocalStore())
        seeder = Seeder(limits, PRICES, UsageWriter(ledger))  # type: ignore[arg-type]
        ring = Keyring()
        ring.before_apply = seeder.seed
        await ring.receive([_row()])
        await ring.receive([_row(version=2)])  # a change to the key: not charged again
        await ledger.close()
        assert ring.by_id["key_a"].version == 2
        return _spent(limits.store)

    assert asyncio.run(run()) == 2000.0


def test_a_ledger_that_cannot_be_read_delays_no_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> Keyring:
        seeder = Seeder(SimpleNamespace(store=LocalStore()), PRICES, UsageWriter(SqliteStore(tmp_path)))  # type: ignore[arg-type]
        ring = Keyring()
        ring.before_apply = seeder.seed  # the ledger never opened: its reads fail
        await ring.receive([_row()])
        return ring

    assert "key_a" in asyncio.run(run()).by_id
    assert "1 money budgets start this period unspent" in caplog.text
