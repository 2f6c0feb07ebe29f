"""Closing the key store while the keyring's poll is in a thread: the poll's task is
cancelled, its SQLite call goes on in the thread, and the connection is closed only once
that call is done (closing it under the call crashed the process)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dragoman.keys.connections import Sqlite
from dragoman.keys.ring import Keyring
from dragoman.keys.store import KeyStore


def test_closing_while_the_poll_reads_does_not_crash(tmp_path: Path) -> None:
    async def run() -> None:
        for round_ in range(30):
            ring = Keyring(store=KeyStore(Sqlite(tmp_path / "usage.sqlite3")), poll_interval=0.001)
            ring.start()
            await asyncio.sleep(0.001 * (round_ % 7))
            await ring.close()

    asyncio.run(run())
