"""The store the configuration names: PostgreSQL from `[usage] database_url`, else SQLite."""

from __future__ import annotations

from pathlib import Path

from dragoman.core.config import Config, data_dir, usage_database_url
from dragoman.usage.journal import Journal
from dragoman.usage.postgres import PostgresStore
from dragoman.usage.records import UsageStore
from dragoman.usage.sqlite import SqliteStore


def store_for(config: Config) -> UsageStore:
    url = usage_database_url(config)
    if url:
        return PostgresStore(url)
    return SqliteStore(_directory(config))


def journal_for(config: Config) -> Journal:
    """The local journal under the store (see `usage.journal`)."""
    if config.usage.journal_dir:
        return Journal(Path(config.usage.journal_dir).expanduser())
    return Journal(_directory(config) / "journal")


def _directory(config: Config) -> Path:
    return Path(config.usage.dir).expanduser() if config.usage.dir else data_dir("usage")
