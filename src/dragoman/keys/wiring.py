"""The keys' parts as the gateway assembles them: one call each."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from dragoman.core.config import Config, api_keys_enabled, data_dir, usage_database_url
from dragoman.keys import cost, enforce, money
from dragoman.keys.admin import KeyAdmin
from dragoman.keys.connections import Postgres, Sqlite
from dragoman.keys.records import Budget
from dragoman.keys.ring import Keyring
from dragoman.keys.seeding import Seeder
from dragoman.keys.store import KeyStore
from dragoman.limits.gate import Limits
from dragoman.usage.sqlite import FILE
from dragoman.usage.writer import UsageWriter


def store_for(config: Config) -> KeyStore:
    """Beside the usage records: `[usage] database_url`'s PostgreSQL, else the SQLite file."""
    url = usage_database_url(config)
    if url:
        return KeyStore(Postgres(url, config.usage.statement_timeout))
    directory = Path(config.usage.dir).expanduser() if config.usage.dir else data_dir("usage")
    return KeyStore(Sqlite(directory / FILE))


def keyring(config: Config, clients: frozenset[str], tenants: dict[str, str], admins: frozenset[str]) -> Keyring:
    store = store_for(config) if api_keys_enabled(config) else None
    return Keyring(clients, admins, tenants, store, config.admin.poll_interval)


def prices(config: Config) -> money.Prices:
    return money.Prices.of(config.models)


def limits(config: Config, ring: Keyring, registry: CollectorRegistry | None) -> Limits | None:
    return enforce.build(config, ring, registry)


def seeding(ring: Keyring, limits: Limits | None, usage: UsageWriter | None, config: Config) -> None:
    """Money budgets charged from the ledger when a process first counts their period."""
    if isinstance(limits, enforce.KeyedLimits) and usage is not None:
        ring.before_apply = Seeder(limits, prices(config), usage).seed


def admin(ring: Keyring, usage: UsageWriter | None, config: Config) -> KeyAdmin:
    table = prices(config)

    async def spent(key_id: str, budget: Budget) -> float | None:
        if usage is None or not await usage.flush():
            return None
        return await cost.spent(usage.store, table, key_id, budget)

    return KeyAdmin(ring, spent)
