"""The store the configuration names: PostgreSQL from `[usage] database_url`, else SQLite."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from dragoman.core.config import Config, data_dir, usage_database_url
from dragoman.usage.postgres import PostgresStore
from dragoman.usage.records import UsageStore
from dragoman.usage.sqlite import FILE, SqliteStore


def store_for(config: Config) -> UsageStore:
    url = usage_database_url(config)
    if url:
        return PostgresStore(url)
    return SqliteStore(_directory(config))


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
