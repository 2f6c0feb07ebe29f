"""The keys a configuration names: its own, and those of the variables and files it points at.

Read once, by `assembly.settings.resolve`, against the environment it is handed: nothing
else reads a key variable or file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dragoman.core.config import Config, ConfigError


def server_api_keys(config: Config, tenants: Mapping[str, str], environ: Mapping[str, str]) -> frozenset[str]:
    """The keys clients may present (`tenants`: `key_tenants`'s). `api_keys_env` naming a variable that
    holds no key, with no other key configured, is a ConfigError: the gateway would otherwise run
    without authentication. Read once, by `assembly.settings.resolve`."""
    keys = set(config.server.api_keys) | set(tenants)
    if config.server.api_keys_file:
        keys.update(_file_keys("server.api_keys_file", config.server.api_keys_file))
    if config.server.api_keys_env:
        keys.update(_listed(environ.get(config.server.api_keys_env, "")))
        if not keys:
            raise ConfigError(f"server.api_keys_env: the environment variable {config.server.api_keys_env} is unset or holds "
                              "no key, and no other key is configured (the gateway would accept every client)")  # fmt: skip
    return frozenset(keys)


def key_tenants(config: Config, environ: Mapping[str, str]) -> dict[str, str]:
    """Each tenant key's tenant name (`server.tenants`, checked to name every key once), with the
    keys of `tenants_env` and `tenants_file`; every unreadable file named in one ConfigError."""
    tenants = {key: tenant for tenant, keys in config.server.tenants.items() for key in keys}
    for tenant, variable in config.server.tenants_env.items():
        tenants.update((key, tenant) for key in _listed(environ.get(variable, "")))
    problems = []
    for tenant, path in config.server.tenants_file.items():
        try:
            tenants.update((key, tenant) for key in _file_keys(f"server.tenants_file.{tenant}", path))
        except ConfigError as error:
            problems += error.problems
    if problems:
        raise ConfigError(problems)
    return tenants


def _listed(value: str) -> list[str]:
    """The keys of a comma-separated variable."""
    return [key.strip() for key in value.split(",") if key.strip()]


def _file_keys(where: str, path: str) -> list[str]:
    """The keys of a file, one a line (blank lines and `#` comments skipped)."""
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{where}: cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def usage_admin_keys(config: Config, environ: Mapping[str, str]) -> frozenset[str]:
    """The configured admin keys: `usage.admin_keys`, `admin.keys` and their `_env` variables."""
    keys = set(config.usage.admin_keys) | set(config.admin.keys)
    for variable in (config.usage.admin_keys_env, config.admin.keys_env):
        if variable:
            keys.update(_listed(environ.get(variable, "")))
    return frozenset(keys)
