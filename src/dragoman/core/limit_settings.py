"""The `[limits]` configuration: what each key (or tenant, or model) may use.

A leaf: `core.config` embeds `LimitsConfig` and `core.config_load` calls `check`; nothing
here reads the environment or opens anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from msgspec import Struct

RATES = ("requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute")
BUDGETS = ("tokens_per_day", "tokens_per_month")


class LimitSet(Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """One set of limits; a missing value is no limit (or, in a tenant's table, [limits]'s)."""

    requests_per_minute: int | None = None
    input_tokens_per_minute: int | None = None  # input as Anthropic counts it: cache reads excluded
    output_tokens_per_minute: int | None = None  # max_tokens reserved at the start, settled at the end
    max_concurrent: int | None = None  # requests at once; more wait up to queue_timeout, then 429
    tokens_per_day: int | None = None  # input + output per UTC day; past it, 429 until midnight UTC
    tokens_per_month: int | None = None  # the same per calendar month (UTC)

    @property
    def empty(self) -> bool:
        return all(getattr(self, n) is None for n in (*RATES, *BUDGETS, "max_concurrent"))


class TenantLimits(LimitSet, frozen=True):
    # Limits for one model (by the name clients ask for, or the upstream's name), on top of the others.
    models: dict[str, LimitSet] = {}


class LimitsConfig(TenantLimits, frozen=True):
    tenants: dict[str, TenantLimits] = {}  # by tenant of [server] tenants: shared by the tenant's keys
    keys: dict[str, LimitSet] = {}  # by key id (key_…, as logs name it): one key's own, on top of its tenant's
    queue_timeout: float = 10.0  # seconds a request waits for a max_concurrent slot before its 429
    redis_url: str | None = None  # buckets shared by every worker and replica; in-process otherwise
    redis_prefix: str = "dragoman:limits:"
    redis_timeout: float = 0.5  # seconds; a slower Redis counts as unreachable
    on_redis_error: Literal["fail_open", "fail_closed"] = "fail_open"
    redis_credit: int = 31  # requests a process may admit ahead per Redis round trip (limits/credit.py); 0: none

    @property
    def enabled(self) -> bool:
        return not (
            self.empty
            and not self.models
            and not self.keys
            and all(t.empty and not t.models for t in self.tenants.values())
        )


def check(limits: LimitsConfig, tenants: Iterable[str]) -> str | None:
    """What is wrong with `limits` (as `limits.<key>: why`), or None."""
    known = set(tenants)
    for name in limits.tenants:
        if name not in known:
            return f"limits.tenants.{name}: no such tenant in [server] tenants (known: {', '.join(sorted(known)) or 'none'})"
    tables: list[tuple[str, LimitSet]] = [("limits", limits)]
    tables += [(f"limits.models.{m}", s) for m, s in limits.models.items()]
    tables += [(f"limits.keys.{k}", s) for k, s in limits.keys.items()]
    for name, tenant in limits.tenants.items():
        tables.append((f"limits.tenants.{name}", tenant))
        tables += [(f"limits.tenants.{name}.models.{m}", s) for m, s in tenant.models.items()]
    for where, table in tables:
        for key in (*RATES, *BUDGETS, "max_concurrent"):
            value = getattr(table, key)
            if value is not None and value < 1:
                return f"{where}.{key}: must be 1 or more (leave it out for no limit), got {value}"
    if limits.queue_timeout < 0 or limits.redis_timeout <= 0:
        return "limits.queue_timeout / limits.redis_timeout: must be 0 or more / positive seconds"
    if not 0 <= limits.redis_credit <= 100:
        return f"limits.redis_credit: must be 0 (every request asks Redis) to 100, got {limits.redis_credit}"
    if limits.redis_url is not None and not limits.redis_url.startswith(("redis://", "rediss://", "unix://")):
        return "limits.redis_url: must start with redis://, rediss:// or unix://"
    return None
