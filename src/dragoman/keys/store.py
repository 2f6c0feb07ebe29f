"""The keys' tables, their migrations, and every read and write of them.

Every change takes the next value of one version counter in its own transaction, and
writes it on the key's row: the counter's row lock (SQLite: the write lock) makes changes
commit in version order, so `changes(since)` misses none and a process that applies rows
only when their version is newer never puts an older state back. Deleted keys stay as
tombstones (status `deleted`) so that every process hears of the deletion."""

from __future__ import annotations

import secrets
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from dragoman.core.limit_settings import LimitSet
from dragoman.keys.connections import Conn, Database
from dragoman.keys.records import Budget, KeyRow

SCHEMA_TABLE = "dragoman_keys_schema"
MIGRATION_LOCK = zlib.crc32(b"dragoman keys migrations")
# (version, statements), the same for both dialects; append only.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [
        "CREATE TABLE dragoman_keys_state (id INTEGER PRIMARY KEY, version BIGINT NOT NULL, salt TEXT NOT NULL)",
        """CREATE TABLE dragoman_keys (
            id TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, hint TEXT NOT NULL, name TEXT NOT NULL,
            role TEXT NOT NULL, status TEXT NOT NULL, tenant TEXT, limits TEXT, models TEXT, budget TEXT,
            expires_at DOUBLE PRECISION, created_at DOUBLE PRECISION NOT NULL, created_by TEXT,
            updated_at DOUBLE PRECISION NOT NULL, updated_by TEXT, last_used_at DOUBLE PRECISION,
            version BIGINT NOT NULL)""",
        "CREATE INDEX dragoman_keys_version ON dragoman_keys (version)",
        "CREATE INDEX dragoman_keys_created ON dragoman_keys (created_at, id)",
        """CREATE TABLE dragoman_keys_audit (
            at DOUBLE PRECISION NOT NULL, actor TEXT, action TEXT NOT NULL, key_id TEXT NOT NULL, changes TEXT NOT NULL)""",
        "CREATE INDEX dragoman_keys_audit_key ON dragoman_keys_audit (key_id, at)",
    ]),
]  # fmt: skip
LATEST = MIGRATIONS[-1][0]
COLUMNS = tuple(KeyRow.__struct_fields__)
_JSON = {"limits": LimitSet, "models": list[str], "budget": Budget}
SELECT = f"SELECT {', '.join(COLUMNS)} FROM dragoman_keys"


class KeyStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.salt = b""

    async def open(self) -> None:
        """Connect, create or migrate the schema (one process at a time), read the salt."""
        await self.db.open()
        async with self.db.transaction() as conn:
            if self.db.dialect == "postgres":
                await conn.execute("SELECT pg_advisory_xact_lock(?)", MIGRATION_LOCK)
            time_type = "DOUBLE PRECISION"
            await conn.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (version INTEGER PRIMARY KEY, "
                               f"applied_at {time_type} NOT NULL)")  # fmt: skip
            current = (await conn.fetch(f"SELECT coalesce(max(version), 0) FROM {SCHEMA_TABLE}"))[0][0]
            if current > LATEST:
                raise RuntimeError(f"the key tables have schema version {current}; this dragoman knows up to {LATEST}")
            for version, statements in MIGRATIONS:
                if version > current:
                    for statement in statements:
                        await conn.execute(statement)
                    await conn.execute(f"INSERT INTO {SCHEMA_TABLE} (version, applied_at) VALUES (?, ?)",
                                       version, time.time())  # fmt: skip
            await conn.execute("INSERT INTO dragoman_keys_state (id, version, salt) VALUES (1, 0, ?) "
                               "ON CONFLICT (id) DO NOTHING", secrets.token_hex(32))  # fmt: skip
            self.salt = bytes.fromhex((await conn.fetch("SELECT salt FROM dragoman_keys_state WHERE id = 1"))[0][0])

    async def version(self) -> int:
        async with self.db.reading() as conn:
            return int((await conn.fetch("SELECT version FROM dragoman_keys_state WHERE id = 1"))[0][0])

    async def changes(self, since: int) -> list[KeyRow]:
        """Every key changed after version `since` (tombstones included), oldest change first."""
        async with self.db.reading() as conn:
            return [_row(r) for r in await conn.fetch(f"{SELECT} WHERE version > ? ORDER BY version", since)]

    async def get(self, key_id: str) -> KeyRow | None:
        async with self.db.reading() as conn:
            rows = await conn.fetch(f"{SELECT} WHERE id = ? AND status <> 'deleted'", key_id)
        return _row(rows[0]) if rows else None

    async def by_ids(self, ids: Iterable[str]) -> dict[str, KeyRow]:
        ids = list(ids)
        if not ids:
            return {}
        async with self.db.reading() as conn:
            rows = await conn.fetch(f"{SELECT} WHERE id IN ({', '.join('?' * len(ids))})", *ids)
        return {row.id: row for row in map(_row, rows)}

    async def listed(self, tenant: str | None = None) -> list[tuple[str, str, float | None]]:
        """(id, status, expires_at) of every key not deleted, newest first: the list's order."""
        where, args = "status <> 'deleted'", []
        if tenant is not None:
            where, args = where + " AND tenant = ?", [tenant]
        async with self.db.reading() as conn:
            rows = await conn.fetch(f"SELECT id, status, expires_at FROM dragoman_keys WHERE {where} "
                                    "ORDER BY created_at DESC, id DESC", *args)  # fmt: skip
        return [(r[0], r[1], r[2]) for r in rows]

    async def insert(self, row: KeyRow, actor: str | None) -> KeyRow:
        async with self.db.transaction() as conn:
            version = await _next_version(conn, self.db.dialect)
            row = msgspec.structs.replace(row, version=version)
            await conn.execute(f"INSERT INTO dragoman_keys ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                               *_values(row))  # fmt: skip
            await _audit(conn, row.created_at, actor, "create", row.id, _public(row))
        return row

    async def update(
        self, key_id: str, changes: dict[str, Any], actor: str | None, action: str = "update"
    ) -> KeyRow | None:
        """The key with `changes` applied (None: no such key); a field at a time, never the whole row."""
        now = time.time()
        async with self.db.transaction() as conn:
            version = await _next_version(conn, self.db.dialect)  # first: the lock that orders every change
            found = await conn.fetch("SELECT id FROM dragoman_keys WHERE id = ? AND status <> 'deleted'", key_id)
            if not found:
                return None
            fields = {**{k: _column(k, v) for k, v in changes.items()}, "updated_at": now, "updated_by": actor,
                      "version": version}  # fmt: skip
            await conn.execute(f"UPDATE dragoman_keys SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?",
                               *fields.values(), key_id)  # fmt: skip
            await _audit(conn, now, actor, action, key_id, changes)
            return _row((await conn.fetch(f"{SELECT} WHERE id = ?", key_id))[0])

    async def touch(self, used: dict[str, float]) -> None:
        """When keys were last used: no new version (nothing the request path reads changed)."""
        async with self.db.transaction() as conn:
            for key_id, at in used.items():
                await conn.execute("UPDATE dragoman_keys SET last_used_at = ? WHERE id = ? "
                                   "AND (last_used_at IS NULL OR last_used_at < ?)", at, key_id, at)  # fmt: skip

    async def audit(self, key_id: str) -> list[dict[str, Any]]:
        async with self.db.reading() as conn:
            rows = await conn.fetch("SELECT at, actor, action, changes FROM dragoman_keys_audit WHERE key_id = ? "
                                    "ORDER BY at", key_id)  # fmt: skip
        return [{"at": r[0], "actor": r[1], "action": r[2], "changes": msgspec.json.decode(r[3])} for r in rows]

    async def listen(self, woken: Callable[[], None]) -> None:
        await self.db.listen(CHANNEL, woken)

    async def close(self) -> None:
        await self.db.close()


CHANNEL = "dragoman_keys"  # PostgreSQL: a change is announced here when it commits


async def _next_version(conn: Conn, dialect: str) -> int:
    await conn.execute("UPDATE dragoman_keys_state SET version = version + 1 WHERE id = 1")
    if dialect == "postgres":
        await conn.execute(f"NOTIFY {CHANNEL}")  # delivered at commit, to every process LISTENing
    return int((await conn.fetch("SELECT version FROM dragoman_keys_state WHERE id = 1"))[0][0])


async def _audit(conn: Conn, at: float, actor: str | None, action: str, key_id: str, changes: dict[str, Any]) -> None:
    await conn.execute("INSERT INTO dragoman_keys_audit (at, actor, action, key_id, changes) VALUES (?, ?, ?, ?, ?)",
                       at, actor, action, key_id, msgspec.json.encode(changes).decode())  # fmt: skip


def _public(row: KeyRow) -> dict[str, Any]:
    """A row as the audit records it: never its digest."""
    data = msgspec.to_builtins(row)
    data.pop("digest", None)
    return data  # type: ignore[no-any-return]


def _column(name: str, value: Any) -> Any:
    if name in _JSON:
        return None if value is None else msgspec.json.encode(value).decode()
    return value


def _values(row: KeyRow) -> list[Any]:
    return [_column(name, getattr(row, name)) for name in COLUMNS]


def _row(values: tuple[Any, ...]) -> KeyRow:
    data = dict(zip(COLUMNS, values, strict=True))
    for name, kind in _JSON.items():
        if data[name] is not None:
            data[name] = msgspec.json.decode(data[name], type=kind)
    return KeyRow(**data)
