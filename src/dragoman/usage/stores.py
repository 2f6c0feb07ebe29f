"""The store the configuration names: PostgreSQL from `[usage] database_url`, else SQLite."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from dragoman.core.config import Config, data_dir, usage_database_url
from dragoman.usage.journal import Journal
from dragoman.usage.postgres import PostgresStore
from dragoman.usage.records import UsageStore
from dragoman.usage.sqlite import FILE, SqliteStore
from dragoman.usage.writer import UsageWriter


def store_for(config: Config) -> UsageStore:
    url = usage_database_url(config)
    if url:
        return PostgresStore(url, config.usage.statement_timeout)
    return SqliteStore(_directory(config))


def writer_for(config: Config) -> UsageWriter:
    """The gateway's writer: the configured store, its journal, its timeouts."""
    usage = config.usage
    return UsageWriter(store_for(config), usage.flush_interval, usage.retain_days, journal_for(config),
                       usage.statement_timeout)  # fmt: skip


def journal_for(config: Config) -> Journal:
    """The local journal under the store (see `usage.journal`). With PostgreSQL, in a
    directory of the database's own (a digest of its URL), so that records left there are
    shipped only to the database they were meant for."""
    base = Path(config.usage.journal_dir).expanduser() if config.usage.journal_dir else _directory(config) / "journal"
    url = usage_database_url(config)
    return Journal(base / hashlib.sha256(url.encode()).hexdigest()[:16] if url else base)


def describe(config: Config) -> str:
    """Which store that is, for people: the SQLite file, or the PostgreSQL URL without its password."""
    url = usage_database_url(config)
    if not url:
        return f"SQLite {_directory(config) / FILE}"
    parts = urlsplit(url)
    host = parts.hostname or ""
    user = f"{parts.username}@" if parts.username else ""
    port = f":{parts.port}" if parts.port else ""
    return "PostgreSQL " + urlunsplit((parts.scheme, f"{user}{host}{port}", parts.path, "", ""))


def _directory(config: Config) -> Path:
    return Path(config.usage.dir).expanduser() if config.usage.dir else data_dir("usage")
