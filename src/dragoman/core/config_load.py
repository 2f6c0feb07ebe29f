"""A configuration loaded (TOML file or dict) and checked, every problem named at once.

The structs (`core.config`) say what each key holds; `config_sift` checks each key against
them so one run reports all of a file's mistakes; the checks here say what the types cannot
(ranges, URLs, files that must exist, keys that must not be shared).
"""

from __future__ import annotations

import os
import re
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

import msgspec

from dragoman.core import limit_settings
from dragoman.core.config import CacheRouting, Config, ConfigError, UpstreamConfig, api_keys_enabled
from dragoman.core.config_sift import readable, sift


def from_dict(data: dict[str, Any]) -> Config:
    """The configuration `data` describes, or a ConfigError naming every problem in it."""
    upstreams = data.get("upstreams")
    if isinstance(upstreams, dict):  # the protocol picks the upstream's keys; unsaid, it is openai
        data = {**data, "upstreams": {name: {"protocol": "openai", **u} if isinstance(u, dict) else u
                                      for name, u in upstreams.items()}}  # fmt: skip
    problems: list[str] = []
    kept = sift(data, Config, "", problems)
    try:
        config = msgspec.convert(kept or {}, Config)
    except msgspec.ValidationError as error:  # sift let through what msgspec refuses: say that much
        raise ConfigError([*problems, readable(error)]) from None
    _check(config, problems)
    if problems:
        raise ConfigError(problems)
    return config


def _check(config: Config, problems: list[str]) -> None:
    """What the types cannot say, every problem appended to `problems`."""
    server = config.server
    tenants = {*server.tenants, *server.tenants_env, *server.tenants_file}
    if api_keys_enabled(config):  # a tenant may be named by keys made at run time
        tenants |= set(config.limits.tenants)
    if (problem := limit_settings.check(config.limits, tenants)) is not None:
        problems.append(problem)
    _check_server(config, problems)
    for name, upstream in config.upstreams.items():
        _check_upstream(f"upstreams.{name}", upstream, problems)
    for index, model in enumerate(config.models):
        if model.upstream not in config.upstreams:
            known = ", ".join(sorted(config.upstreams)) or "none defined"
            problems.append(f"models.{index}.upstream: unknown upstream {model.upstream!r} (known: {known})")
        for key in ("context_window", "max_output_tokens"):
            if getattr(model, key) is not None and getattr(model, key) < 1:
                problems.append(f"models.{index}.{key}: must be a positive number of tokens, got {getattr(model, key)}")
        if model.price is not None and min(msgspec.structs.astuple(model.price)) < 0:
            problems.append(f"models.{index}.price: prices are 0 or more USD per million tokens")
        if not model.reasoning_efforts:
            problems.append(f"models.{index}.reasoning_efforts: at least one effort is needed")
    for key in ("max_bytes", "max_total_bytes", "max_files"):
        if getattr(config.files, key) <= 0:
            problems.append(f"files.{key}: must be positive, got {getattr(config.files, key)}")
    for key in (
        "max_concurrent",
        "max_requests",
        "max_queued_requests",
        "max_batches",
        "max_stored_bytes",
        "expire_after",
        "retain_for",
    ):
        if getattr(config.batches, key) <= 0:
            problems.append(f"batches.{key}: must be positive, got {getattr(config.batches, key)}")
        elif key in ("expire_after", "retain_for") and getattr(config.batches, key) > 366 * 24 * 3600:
            problems.append(f"batches.{key}: at most a year of seconds (31622400), got {getattr(config.batches, key)}")
    _check_usage(config, problems)
    if config.safeguards.timeout <= 0:
        problems.append(f"safeguards.timeout: must be a positive number of seconds, got {config.safeguards.timeout}")
    if config.safeguards.transcript_chars < 1000:
        problems.append(f"safeguards.transcript_chars: at least 1000, got {config.safeguards.transcript_chars}")
    _check_server_tools(config, problems)
    default = config.server.default_model
    if default and config.models and not any(default == m.name or default in m.aliases for m in config.models):
        problems.append(f"server.default_model: {default!r} is not a configured model name")


def _check_usage(config: Config, problems: list[str]) -> None:
    usage = config.usage
    if not 0 < usage.flush_interval <= 1:
        problems.append(f"usage.flush_interval: must be more than 0 and at most 1 second, got {usage.flush_interval}")
    if not usage.statement_timeout > 0:
        problems.append(f"usage.statement_timeout: must be more than 0 seconds, got {usage.statement_timeout}")
    if usage.retain_days is not None and usage.retain_days < 1:
        problems.append(
            f"usage.retain_days: at least 1 day (leave it out to keep every record), got {usage.retain_days}"
        )
    url = usage.database_url
    if url is not None and not url.startswith(("postgresql://", "postgres://")):  # never quoted: it may hold a password
        problems.append("usage.database_url: must be a postgresql:// URL")
    clients = set(config.server.api_keys) | {key for keys in config.server.tenants.values() for key in keys}
    for where, admins in (("usage.admin_keys", usage.admin_keys), ("admin.keys", config.admin.keys)):
        if clients & set(admins):  # never print the key
            problems.append(f"{where}: a key is also a client key (server.api_keys or tenants); use separate keys")
    if not 0 < config.admin.poll_interval <= 2:
        problems.append(f"admin.poll_interval: more than 0 and at most 2 seconds, got {config.admin.poll_interval}")
    if not 0 < config.console.session_hours <= 24 * 30:
        problems.append(f"console.session_hours: more than 0 and at most 720, got {config.console.session_hours}")


def _check_server_tools(config: Config, problems: list[str]) -> None:
    search = config.web_search
    if search is not None:
        if search.provider == "searxng" and not search.url:
            problems.append("web_search.url: SearXNG's base URL is required (e.g. http://127.0.0.1:8888)")
        elif search.url and (problem := _url_problem(search.url)) is not None:
            problems.append(f"web_search.url: {problem}")
        if not 1 <= search.max_results <= 20:
            problems.append(f"web_search.max_results: 1 to 20, got {search.max_results}")
        if search.timeout <= 0:
            problems.append(f"web_search.timeout: must be positive, got {search.timeout}")
    if config.web_fetch is not None and config.web_fetch.max_content_tokens < 1:
        problems.append(f"web_fetch.max_content_tokens: must be positive, got {config.web_fetch.max_content_tokens}")
    if config.mcp is not None and config.mcp.timeout <= 0:
        problems.append(f"mcp.timeout: must be positive, got {config.mcp.timeout}")


def _check_server(config: Config, problems: list[str]) -> None:
    server = config.server
    seen: dict[str, str] = {}
    for tenant, keys in server.tenants.items():
        for key in keys:
            if not key.strip():
                problems.append(f"server.tenants.{tenant}: an empty key")
            elif key in seen and seen[key] != tenant:  # never print the key itself
                problems.append(
                    f"server.tenants.{tenant}: a key is also listed in tenant {seen[key]!r}; a key belongs to one tenant"
                )
            seen[key] = tenant
    if not 0 < server.port < 65536:
        problems.append(f"server.port: must be 1 to 65535, got {server.port}")
    for key in ("max_request_bytes", "max_connections", "fetch_max_bytes", "fetch_timeout", "fetch_total_timeout",
                "fetch_max_held_bytes"):  # fmt: skip
        if getattr(server, key) <= 0:
            problems.append(f"server.{key}: must be positive, got {getattr(server, key)}")
    if server.shutdown_grace < 0:
        problems.append(f"server.shutdown_grace: must be 0 or more seconds, got {server.shutdown_grace}")
    if server.keepalive_interval <= 0:
        problems.append(
            f"server.keepalive_interval: must be a positive number of seconds, got {server.keepalive_interval}"
        )
    budgets = server.effort_budgets
    if len(budgets) != 2 or not 0 < budgets[0] < budgets[1]:
        problems.append(
            f"server.effort_budgets: two increasing positive numbers (low's and medium's upper budgets), got {budgets}"
        )


def _check_upstream(where: str, upstream: UpstreamConfig, problems: list[str]) -> None:
    for key, url in [("url", upstream.url)] + [("replicas", r) for r in upstream.replicas]:
        if not url.startswith(("http://", "https://")):
            problems.append(f"{where}.{key}: must start with http:// or https://, got {url!r}")
        elif (problem := _url_problem(url)) is not None:
            problems.append(f"{where}.{key}: {problem}")
    for key in ("ca_bundle", "client_cert", "client_key"):
        path = getattr(upstream, key)
        if path and not os.path.isfile(os.path.expanduser(path)):
            problems.append(f"{where}.{key}: no such file: {path}")
    if upstream.proxy is not None and not re.match(r"http://[^/?#]+(/|$)", upstream.proxy):
        problems.append(f"{where}.proxy: must be an http:// URL (https:// proxies are not supported)")
    for header, value in upstream.headers.items():
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", header) or re.search(r"[\r\n\0]", value):
            problems.append(f"{where}.headers.{header}: not a valid header name, or a value with a line break")
    for key in ("connect_timeout", "first_byte_timeout", "idle_timeout", "load_metrics_interval"):
        if getattr(upstream, key) <= 0:
            problems.append(f"{where}.{key}: must be a positive number of seconds")
    if upstream.max_concurrent is not None and upstream.max_concurrent < 1:  # 0 would hold every request forever
        problems.append(
            f"{where}.max_concurrent: must be 1 or more (leave it out for no limit), got {upstream.max_concurrent}"
        )
    for key in ("max_queue", "max_retries", "retry_budget"):
        if getattr(upstream, key) < 0:
            problems.append(f"{where}.{key}: must be 0 or more, got {getattr(upstream, key)}")
    _check_cache_routing(f"{where}.cache_routing", upstream.cache_routing, problems)


def _check_cache_routing(where: str, routing: CacheRouting, problems: list[str]) -> None:
    for key in ("block_bytes", "max_blocks", "max_age", "balance_rel", "spread", "shared_spread"):
        if getattr(routing, key) <= 0:
            problems.append(f"{where}.{key}: must be positive, got {getattr(routing, key)}")
    for key in ("load_tokens", "queue_tokens", "kv_tokens", "home_tokens", "balance_abs"):
        if getattr(routing, key) < 0:
            problems.append(f"{where}.{key}: must be 0 or more, got {getattr(routing, key)}")
    if not 0 <= routing.kv_high < 1:
        problems.append(f"{where}.kv_high: must be from 0 to less than 1 (a used fraction), got {routing.kv_high}")


def _url_problem(url: str) -> str | None:
    """Why the upstream client cannot connect to `url`, if it cannot. Never quotes it: it may hold a password."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # a port that is not a number, or out of range, is a ValueError here
    except ValueError as error:
        return f"not a valid URL: {error}"
    if parts.query or parts.fragment or "@" in parts.netloc:
        return ("a URL without a query, fragment or user:password@ is needed "
                "(keys go in api_key or api_key_env, other headers in headers)")  # fmt: skip
    if not parts.hostname or port == 0:
        return "a URL with a host (and a port from 1 to 65535, if any) is needed"
    return None


def load(path: str | Path) -> Config:
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: not UTF-8 text (byte {error.start})") from None
    except OSError as error:  # a directory, no permission to read it
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    try:
        return from_dict(data)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
