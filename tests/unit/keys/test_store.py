"""The key store on real SQLite and real PostgreSQL: migrated by several processes at once,
changes read back in version order (tombstones too), only digests stored, an audit row
for every change; and the keyring, which never puts an older state back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from dragoman.core.limit_settings import LimitSet
from dragoman.keys.connections import Postgres, Sqlite
from dragoman.keys.records import KeyRow, digest, hint, key_id, new_secret
from dragoman.keys.ring import Keyring
from dragoman.keys.store import KeyStore
from tests.support.postgres import schema_url
from tests.support.waiting import eventually_async


@pytest.fixture(params=["sqlite", "postgres"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    if request.param == "sqlite":
        yield lambda: KeyStore(Sqlite(tmp_path / "usage.sqlite3"))
    else:
        with schema_url() as url:
            yield lambda: KeyStore(Postgres(url))


def _row(store: KeyStore, secret: str, name: str = "k") -> KeyRow:
    return KeyRow(id=key_id(secret), digest=digest(store.salt, secret), hint=hint(secret), name=name,
                  created_at=1.0, updated_at=1.0)  # fmt: skip


def test_processes_opening_at_once_migrate_once_and_share_one_salt(make) -> None:  # type: ignore[no-untyped-def]
    async def run() -> set[bytes]:
        stores = [make() for _ in range(4)]
        await asyncio.gather(*(s.open() for s in stores))
        salts = {s.salt for s in stores}
        for store in stores:
            await store.close()
        return salts

    salts = asyncio.run(run())
    assert len(salts) == 1 and len(next(iter(salts))) == 32


def test_changes_come_back_in_version_order_with_tombstones_and_an_audit(make) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        store = make()
        await store.open()
        secret = new_secret("client")
        row = await store.insert(_row(store, secret), actor="key_admin")
        other = await store.insert(_row(store, new_secret("client"), "other"), actor="key_admin")
        limited = await store.update(row.id, {"limits": LimitSet(requests_per_minute=5)}, actor="key_admin")
        assert (
            limited is not None
            and limited.limits == LimitSet(requests_per_minute=5)
            and limited.version > other.version
        )
        await store.update(other.id, {"status": "deleted"}, actor="key_admin", action="delete")
        changes = await store.changes(0)
        assert [c.version for c in changes] == sorted(c.version for c in changes) and len(changes) == 2
        assert {c.id: c.status for c in changes} == {row.id: "active", other.id: "deleted"}
        assert await store.get(other.id) is None and await store.update(other.id, {"name": "x"}, actor=None) is None
        assert await store.changes(await store.version()) == []
        assert [a["action"] for a in await store.audit(row.id)] == ["create", "update"]
        assert secret not in str(await store.audit(row.id)) and row.digest not in str(await store.audit(row.id))
        await store.touch({row.id: 50.0})
        await store.touch({row.id: 40.0})  # an older use never moves it back
        fresh = await store.get(row.id)
        assert fresh is not None and fresh.last_used_at == 50.0 and fresh.version == limited.version  # no new version
        await store.close()

    asyncio.run(run())


def test_the_keyring_looks_keys_up_by_digest_and_never_applies_an_older_version(make) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        store = make()
        ring = Keyring(["sk-config"], store=store)
        await store.open()
        secret = new_secret("client")
        made = await store.insert(_row(store, secret), actor=None)
        await ring.refresh()
        assert ring.lookup(secret).id == made.id and ring.lookup("sk-config").source == "config"  # type: ignore[union-attr]
        off = await store.update(made.id, {"status": "inactive"}, actor=None)
        assert off is not None
        ring.apply([off])
        ring.apply([made])  # an older state arriving late changes nothing
        assert ring.lookup(secret).status == "inactive"  # type: ignore[union-attr]
        gone = await store.update(made.id, {"status": "deleted"}, actor=None)
        await ring.refresh()
        assert gone is not None and ring.lookup(secret) is None and made.id not in ring.by_id
        assert ring.lookup("sk-nobody") is None
        await store.close()

    asyncio.run(run())


def test_with_postgresql_a_notify_wakes_the_keyring_before_its_poll() -> None:
    async def run(url: str) -> None:
        ring = Keyring(store=KeyStore(Postgres(url)), poll_interval=3600)  # its poll would come in an hour
        ring.start()
        writer = KeyStore(Postgres(url))
        await writer.open()
        await eventually_async(lambda: ring.listening, "the keyring listening")
        secret = new_secret("client")
        await writer.insert(_row(writer, secret), actor=None)
        await eventually_async(lambda: ring.lookup(secret) is not None, "the key, woken by NOTIFY", timeout=10)
        await writer.close()
        await ring.close()

    with schema_url() as url:
        asyncio.run(run(url))
