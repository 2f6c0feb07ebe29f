"""The configuration resolved once, before anything is built, with every problem reported together.

The file's own problems are all found by `core.config_load`; what the configuration names
outside it is found here, in one pass, and raised as one ConfigError listing each: the
environment variables (`*_env`, the `OTEL_*` ones), key files, the usage database's URL,
tokenizer and tiktoken files, the tracing packages, each upstream's headers, TLS files and
proxy, and the routes. `Gateway` resolves its configuration first, so `dragoman serve`,
`check` and `models` (and each worker, and each reload) report the same list.

What was read is kept (`Settings`) or written into the configuration (each upstream's key,
the usage database's URL, tracing's protocol and service name), so that nothing reads the
environment again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from dragoman.assembly.routing import Counter, load_counters
from dragoman.assembly.tracing import resolve_tracing
from dragoman.core.config import Config, ConfigError, api_keys_enabled
from dragoman.core.config_keys import key_tenants, server_api_keys, usage_admin_keys
from dragoman.core.redaction import Redactor
from dragoman.routes.settings import check as check_routes
from dragoman.upstream.client import HttpClient

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """A configuration, resolved: the environment's values written in, and what it names read."""

    config: Config
    api_keys: frozenset[str]  # the keys clients may present
    tenants: dict[str, str]  # each tenant key's tenant
    admin_keys: frozenset[str]
    counters: dict[str, Counter]  # each model's own token counter, by model name


def resolve(config: Config, environ: Mapping[str, str] = os.environ) -> Settings:
    """`config` resolved against `environ`; a ConfigError naming every problem found."""
    problems: list[str] = []
    tenants: dict[str, str] = _collect(problems, {}, lambda: key_tenants(config, environ))
    api_keys: frozenset[str] = _collect(problems, frozenset(), lambda: server_api_keys(config, tenants, environ))
    admin_keys = usage_admin_keys(config, environ)
    if api_keys & admin_keys:  # the file's own keys are checked as it loads: these came from variables or files
        problems.append("admin keys: a key is also a client key (server.api_keys, tenants, or their variables "
                        "and files); use separate keys")  # fmt: skip
    config = _with_environment(config, environ, problems)
    tracing, tracing_problems = resolve_tracing(config.tracing, environ)
    problems += tracing_problems
    counters: dict[str, Counter] = _collect(problems, {}, lambda: load_counters(config))
    for name, upstream in config.upstreams.items():  # its headers, TLS files and proxy: as building it checks them
        _collect(problems, None, lambda: HttpClient(name, upstream, upstream.api_key, redactor=Redactor()))  # noqa: B023
    check_routes(config.routes, config.models, config.fallbacks, problems)
    if problems:
        raise ConfigError(problems)
    return Settings(config=msgspec.structs.replace(config, tracing=tracing), api_keys=api_keys, tenants=tenants,
                    admin_keys=admin_keys, counters=counters)  # fmt: skip


def _collect(problems: list[str], instead: T, step: Callable[[], T]) -> T:
    """What `step` gives, or `instead` with its problems noted."""
    try:
        return step()
    except ConfigError as error:
        problems += error.problems
        return instead


def _with_environment(config: Config, environ: Mapping[str, str], problems: list[str]) -> Config:
    """`config` with each upstream's key and the usage database's URL read from their variables."""
    upstreams = {
        name: msgspec.structs.replace(
            upstream, api_key=environ.get(upstream.api_key_env) or upstream.api_key, api_key_env=None
        )  # fmt: skip
        if upstream.api_key_env
        else upstream
        for name, upstream in config.upstreams.items()
    }
    usage = config.usage
    variable = usage.database_url_env
    if variable:
        url = environ.get(variable) or usage.database_url
        if url and not url.startswith(("postgresql://", "postgres://")):  # never quoted: it may hold a password
            problems.append(
                f"usage.database_url_env: the environment variable {variable} must hold a postgresql:// URL"
            )
        elif not url and (usage.enabled or api_keys_enabled(config)):
            problems.append(f"usage.database_url_env: the environment variable {variable} is unset, and no "
                            "database_url is configured (records would go to SQLite in usage.dir instead)")  # fmt: skip
        usage = msgspec.structs.replace(usage, database_url=url, database_url_env=None)
    return msgspec.structs.replace(config, upstreams=upstreams, usage=usage)
