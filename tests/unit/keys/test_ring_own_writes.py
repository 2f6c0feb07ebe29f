"""A process's own change, applied to its keyring at once, does not hide another process's
earlier change it has not read yet (real SQLite, two stores and two keyrings on one file)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dragoman.keys.connections import Sqlite
from dragoman.keys.records import KeyRow, digest, hint, key_id, new_secret
from dragoman.keys.ring import Keyring
from dragoman.keys.store import KeyStore


def _row(store: KeyStore, secret: str, name: str) -> KeyRow:
    return KeyRow(id=key_id(secret), digest=digest(store.salt, secret), hint=hint(secret), name=name,
                  created_at=1.0, updated_at=1.0)  # fmt: skip


def test_an_own_write_does_not_skip_anothers_unread_change(tmp_path: Path) -> None:
    async def run() -> None:
        one, two = KeyStore(Sqlite(tmp_path / "usage.sqlite3")), KeyStore(Sqlite(tmp_path / "usage.sqlite3"))
        await one.open()
        await two.open()
        ring = Keyring(store=one)
        await ring.refresh()
        theirs, mine = new_secret("client"), new_secret("client")
        await two.insert(_row(two, theirs, "made on the other process"), actor=None)
        await ring.receive([await one.insert(_row(one, mine, "made here"), actor=None)])  # as the Admin API does
        await ring.refresh()  # the next poll
        assert ring.lookup(mine) is not None and ring.lookup(theirs) is not None
        await one.close()
        await two.close()

    asyncio.run(run())
