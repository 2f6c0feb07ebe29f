"""Admitting a request under its key's or tenant's limits, and settling it at its end.

    admit ─▶ concurrency slot (queued, bounded) ─▶ store.take (all buckets or none) ─▶ Admission
    Admission.settle(outcome) ─▶ the real input and output tokens, store.adjust, slot freed

Requests count 1 when admitted, and are given back when the request never reached an upstream
(it was unreachable) or the gateway itself failed it (`core.errors.unsent`). Input tokens (as Anthropic counts them: no cache reads)
are known only from the upstream's usage: a request is admitted while the input bucket
is not empty, and charged its input at the end. Output tokens are reserved from
`max_tokens` at the start, and the unused part refunded at the end. `count_tokens`
counts as a request and uses no tokens.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from dragoman.calls.types import Call, Outcome, max_tokens
from dragoman.core.errors import RateLimited
from dragoman.core.limit_settings import BUDGETS, RATES, LimitsConfig, LimitSet
from dragoman.limits.slots import Concurrency, Slots
from dragoman.limits.store import LocalStore, Store, Taken, Want, kept_until

MINUTE = 60.0
_INPUT, _OUTPUT, _TOKENS = (f"anthropic-ratelimit-{kind}" for kind in ("input-tokens", "output-tokens", "tokens"))
_NAMES = {prefix: (prefix + "-limit", prefix + "-remaining", prefix + "-reset")
          for prefix in (f"anthropic-ratelimit-{kind}" for kind in ("requests", "input-tokens", "output-tokens", "tokens"))}  # fmt: skip
DIMENSIONS = (  # (config key, its headers' prefix, what a want of it costs)
    ("requests_per_minute", "anthropic-ratelimit-requests", "request"),
    ("input_tokens_per_minute", _INPUT, "input"),
    ("output_tokens_per_minute", _OUTPUT, "output"),
)
BATCH_WAIT_MAX = 60.0  # seconds a batch request sleeps before it asks its buckets again


class LimitReached(RateLimited):
    """A 429 that carries the limits' headers along with `retry-after`."""

    def __init__(self, message: str, *, retry_after: str | None, extra: dict[str, str],
                 should_retry: bool | None = None) -> None:  # fmt: skip
        super().__init__(message, retry_after=retry_after, should_retry=should_retry)
        self.extra_headers = extra


@dataclass(frozen=True, slots=True)
class _Rule:
    """One bucket a subject's requests draw on, fixed by the configuration."""

    kind: str  # request, input, output, budget
    header: str | None  # its headers' prefix (anthropic-ratelimit-requests, ...); None for budgets
    key: str  # the bucket's key, without a budget's window
    capacity: int
    source: str  # the configuration key that set it: named in a 429's message
    window: str | None = None  # day or month, for budgets
    want: Want | None = None  # what each request asks of it, where that is always the same (requests, input)
    limit: str = ""  # the capacity, as its header gives it


@dataclass(frozen=True, slots=True)
class Extra:
    """A bucket a caller adds to a request's own (a key's money budget, `keys.money`): taken
    in the same round trip as the limits, refused as it says, settled as it computes."""

    want: Want
    refusal: Callable[[], LimitReached]
    settle: Callable[[Outcome], float]  # the delta at the request's end (a refund > 0)


@dataclass(frozen=True, slots=True)
class _Plan:
    rules: tuple[_Rule, ...]
    slots: tuple[tuple[str, int, str], ...]  # (key, max_concurrent, source)
    who: str  # for messages: "key key_…" or "tenant team-a"
    reserves: bool  # whether an output-token limit applies: only then is max_tokens read


_STAMPS: dict[int, str] = {}  # whole seconds -> RFC 3339: a reply's headers format a few, mostly the same


def rfc3339(moment: float) -> str:
    second = math.ceil(moment)
    stamp = _STAMPS.get(second)
    if stamp is None:
        if len(_STAMPS) > 4096:
            _STAMPS.clear()
        stamp = _STAMPS[second] = datetime.datetime.fromtimestamp(second, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return stamp


def window_end(window: str, now: float) -> tuple[str, float]:
    """The budget window holding `now` (UTC): its name and when it ends."""
    day = datetime.datetime.fromtimestamp(now, datetime.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if window == "day":
        return day.strftime("%Y-%m-%d"), (day + datetime.timedelta(days=1)).timestamp()
    first = day.replace(day=1)
    following = (first + datetime.timedelta(days=32)).replace(day=1)
    return first.strftime("%Y-%m"), following.timestamp()


class Admission:
    """What one admitted request took, for its reply's headers and its settlement."""

    __slots__ = ("_gate", "_wants", "_rules", "_levels", "_slots", "_reserved", "_estimate", "_counts", "_now",
                 "_extras")  # fmt: skip

    def __init__(self, gate: Limits, wants: list[Want], rules: list[_Rule], taken: Taken, slots: list[tuple[str, str]],
                 reserved: int, estimate: int, counts: bool, extras: tuple[Extra, ...] = ()) -> None:  # fmt: skip
        self._gate, self._wants, self._rules, self._levels = gate, wants, rules, taken.levels[: len(rules)]
        self._extras = extras
        self._slots, self._reserved, self._estimate, self._counts = slots, reserved, estimate, counts
        self._now = time.time()

    def headers(self) -> dict[str, str]:
        """Anthropic's `anthropic-ratelimit-*` headers for the limits that apply: per kind
        the bucket nearest to empty; `tokens` the nearer of input and output."""
        tightest: dict[str, tuple[float, _Rule]] = {}
        for rule, level in zip(self._rules, self._levels, strict=True):
            header = rule.header
            if header is not None and (header not in tightest or level < tightest[header][0]):
                tightest[header] = (level, rule)
        input_, output = tightest.get(_INPUT), tightest.get(_OUTPUT)
        if input_ is not None or output is not None:
            tightest[_TOKENS] = input_ if output is None or (input_ is not None and input_[0] < output[0]) else output  # type: ignore[assignment]
        headers = {}
        now = self._now
        for prefix, (level, rule) in tightest.items():
            names = _NAMES[prefix]
            headers[names[0]] = rule.limit
            headers[names[1]] = str(int(level)) if level > 0 else "0"
            headers[names[2]] = rfc3339(now + (rule.capacity - level) * MINUTE / rule.capacity)
        return headers

    def settle(self, outcome: Outcome) -> None:
        """Charge the request's real tokens and free its slots; once, at its end however it ended."""
        for key, lease in self._slots:
            self._gate.concurrency.release(key, lease)
        self._slots = []
        if not self._counts:
            return
        served = outcome.status == 200
        used_in = outcome.input_tokens if outcome.input_tokens is not None else (self._estimate if served else 0)
        used_in += outcome.cache_creation_tokens or 0  # Anthropic counts prompt-cache writes as input; reads not
        # A stream cut short has the count its path noted when it was abandoned: what the upstream
        # reported by then, else an estimate of what reached the client. None: nothing was known.
        if outcome.output_tokens is None:
            used_out = self._reserved if served else 0
        else:
            used_out = outcome.output_tokens
        changes = [(extra.want, extra.settle(outcome)) for extra in self._extras]
        for rule, want in zip(self._rules, self._wants[: len(self._rules)], strict=True):
            if rule.kind == "request" and outcome.unsent:  # the gateway's to fail: the request given back
                changes.append((want, 1.0))
            elif rule.kind == "input" and used_in:
                changes.append((want, -float(used_in)))
            elif rule.kind == "output" and self._reserved != used_out:
                changes.append((want, float(self._reserved - used_out)))
            elif rule.kind == "budget" and used_in + used_out:
                changes.append((want, -float(used_in + used_out)))
        self._counts = False
        self._gate.store.adjust(changes)


class Limits:
    """The configured limits, their store, and the concurrency slots of this process."""

    def __init__(self, config: LimitsConfig, store: Store, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time, concurrency: Slots | None = None) -> None:  # fmt: skip
        self.config = config
        self.store = store
        self.concurrency: Slots = concurrency or Concurrency()
        self._clock = clock
        self._plans: dict[tuple[str | None, str | None, str, str, LimitSet | None], _Plan] = {}
        self.refused = Counter("dragoman_rate_limited", "Requests refused by a limit of [limits]", ["limit"],
                               registry=registry) if registry is not None else None  # fmt: skip

    async def admit(self, key_id: str | None, tenant: str | None, call: Call, endpoint: str,
                    own: LimitSet | None = None, extras: tuple[Extra, ...] = ()) -> Admission:  # fmt: skip
        """Admitted under every limit that applies (`own`: the key's own, on top of its tenant's;
        `extras`: buckets the caller adds), or LimitReached (429) naming the limit."""
        plan = self._plan(key_id, tenant, call.model, call.upstream_model, own)
        batch = endpoint == "batch"
        held: list[tuple[str, str]] = []
        try:
            for key, limit, source in plan.slots:
                lease = await self.concurrency.acquire(key, limit, None if batch else self.config.queue_timeout)
                if lease is None:
                    self._count(source)
                    raise LimitReached(f"{source}: {plan.who} has {limit} requests in progress, its limit; none ended "
                                       f"within {self.config.queue_timeout:g} s", retry_after="1", extra={})  # fmt: skip
                held.append((key, lease))
            counts = endpoint != "count_tokens"
            reserved = max_tokens(call) if counts and plan.reserves else 0
            wants, rules = self._wants(plan, reserved)
            wants += [extra.want for extra in extras]
            while True:
                taken = await self.store.take(wants) if wants else Taken(True, [])
                if taken.admitted:
                    break
                if taken.refused >= len(rules):
                    self._count("budget")
                    raise extras[taken.refused - len(rules)].refusal()
                rule = rules[taken.refused]
                if not batch or rule.kind == "budget":
                    raise self._refusal(plan, rules, wants, taken)
                await asyncio.sleep(min(taken.wait, BATCH_WAIT_MAX))  # a batch has a day: it waits its turn
        except BaseException:
            for key, lease in held:
                self.concurrency.release(key, lease)
            raise
        return Admission(self, wants, rules, taken, held, reserved, len(call.body) // 4, counts, extras)

    def _wants(self, plan: _Plan, reserved: int) -> tuple[list[Want], list[_Rule]]:
        wants, rules = [], []
        now = self._clock()
        for rule in plan.rules:
            if rule.want is not None:
                wants.append(rule.want)
            elif rule.kind == "budget":
                assert rule.window is not None
                name, end = window_end(rule.window, now)
                wants.append(Want(f"{rule.key}:{name}", rule.capacity, 0.0, 0.0, 1.0, kept_until(end, now)))
            else:
                cost = 1.0 if rule.kind == "request" else float(reserved) if rule.kind == "output" else 0.0
                need = min(cost, rule.capacity) if rule.kind != "input" else 1.0
                wants.append(Want(rule.key, rule.capacity, rule.capacity / MINUTE, cost, need, MINUTE))
            rules.append(rule)
        return wants, rules

    def _refusal(self, plan: _Plan, rules: list[_Rule], wants: list[Want], taken: Taken) -> LimitReached:
        rule = rules[taken.refused]
        self._count(rule.source)
        if rule.kind == "budget":
            assert rule.window is not None
            _, end = window_end(rule.window, self._clock())
            return LimitReached(f"{rule.source}: {plan.who} has used its budget of {rule.capacity} tokens per "
                                f"{rule.window}; it resets at {rfc3339(end)}", retry_after=str(math.ceil(end - self._clock())),
                                extra={}, should_retry=False)  # fmt: skip
        seconds = max(1, math.ceil(taken.wait))
        admission = Admission(self, wants, rules, taken, [], 0, 0, False)
        what = {"request": "requests", "input": "input tokens", "output": "output tokens"}[rule.kind]
        return LimitReached(f"{rule.source}: {plan.who} is over its rate limit of {rule.capacity} {what} per minute; "
                            f"retry after {seconds} s", retry_after=str(seconds), extra=admission.headers())  # fmt: skip

    def charge_used(self, window: str, key_id: str | None, tenant: str | None, model: str, upstream_model: str,
                    tokens: int) -> None:  # fmt: skip
        """Charge `tokens` used earlier in this `window` (day or month) to the budgets they count
        against, as their requests' settlements did: at start, from the usage ledger."""
        now = self._clock()
        name, end = window_end(window, now)
        changes = [(Want(f"{rule.key}:{name}", rule.capacity, 0.0, 0.0, 1.0, kept_until(end, now)), -float(tokens))
                   for rule in self._plan(key_id, tenant, model, upstream_model).rules
                   if rule.kind == "budget" and rule.window == window]  # fmt: skip
        if changes:
            self.store.adjust(changes)

    async def close(self) -> None:
        await self.concurrency.close()
        await self.store.close()

    def _count(self, limit: str) -> None:
        if self.refused is not None:
            self.refused.labels(limit.rsplit(".", 1)[-1]).inc()

    def _plan(self, key_id: str | None, tenant: str | None, model: str, upstream_model: str,
              own: LimitSet | None = None) -> _Plan:  # fmt: skip
        cache = (key_id, tenant, model, upstream_model, own)
        plan = self._plans.get(cache)
        if plan is None:
            if len(self._plans) > 100_000:  # keys are bounded by the configuration; models may not be
                self._plans.clear()
            plan = self._plans[cache] = _make_plan(self.config, key_id, tenant, model, upstream_model, own)
        return plan


def _make_plan(config: LimitsConfig, key_id: str | None, tenant: str | None, model: str, upstream_model: str,
               key_limits: LimitSet | None = None) -> _Plan:  # fmt: skip
    """The buckets and slots of one subject (tenant, key or everyone) for one model, and of
    the key itself when it has limits of its own (`key_limits`, or `limits.keys`)."""
    table = config.tenants.get(tenant) if tenant is not None else None
    if tenant is not None:
        subject, who = f"t:{tenant}", f"tenant {tenant}"
    else:
        subject, who = (f"k:{key_id}", f"key {key_id}") if key_id else ("all", "everyone")
    # (scope, its limits as (value, the key that set it) by name)
    own = f"limits.tenants.{tenant}" if table is not None else "limits"
    scopes = [("*", _values(table, own, config, "limits") if table is not None else _values(config, "limits"))]
    for name in dict.fromkeys((model, upstream_model)):
        if table is not None and name in table.models:
            scopes.append((name, _values(table.models[name], f"{own}.models.{name}")))
            break
        if name in config.models:
            scopes.append((name, _values(config.models[name], f"limits.models.{name}")))
            break
    mine = config.keys.get(key_id) if key_id is not None and key_limits is None else key_limits
    if mine is not None and not mine.empty:
        # the key's own limits, on top of its tenant's (or, without a tenant, in place of [limits]'s)
        where = f"limits.keys.{key_id}" if key_limits is None else f"api_keys.{key_id}.limits"
        if tenant is None:
            scopes[0] = ("*", _values(mine, where, config, "limits"))
        else:
            scopes.append(("*", _values(mine, where)))
            who = f"key {key_id} of tenant {tenant}"
    rules: list[_Rule] = []
    slots: list[tuple[str, int, str]] = []
    for index, (scope, values) in enumerate(scopes):
        own_scope = mine is not None and not mine.empty and tenant is not None and index == len(scopes) - 1
        prefix = (
            f"{{k:{key_id}}}:{scope}:" if own_scope else f"{{{subject}}}:{scope}:"
        )  # {t:team-a}:*: or {k:key_…}:model:
        for name, header, kind in DIMENSIONS:
            if name in values:
                capacity, source = values[name]
                cost, need = (1.0, 1.0) if kind == "request" else (0.0, 1.0)
                want = (
                    Want(prefix + kind, capacity, capacity / MINUTE, cost, need, MINUTE) if kind != "output" else None
                )
                rules.append(_Rule(kind, header, prefix + kind, capacity, source, want=want, limit=str(capacity)))
        for window in ("day", "month"):
            if f"tokens_per_{window}" in values:
                rules.append(_Rule("budget", None, prefix + window, *values[f"tokens_per_{window}"], window=window))
        if "max_concurrent" in values:
            slots.append((prefix + "slots", *values["max_concurrent"]))
    return _Plan(tuple(rules), tuple(slots), who, any(rule.kind == "output" for rule in rules))


def _values(own: LimitSet, path: str, base: LimitSet | None = None, base_path: str = "") -> dict[str, tuple[int, str]]:
    """The limits set in `own`, else in `base`, each with the configuration key that set it."""
    values = {}
    for name in (*RATES, *BUDGETS, "max_concurrent"):
        if getattr(own, name) is not None:
            values[name] = (getattr(own, name), f"{path}.{name}")
        elif base is not None and getattr(base, name) is not None:
            values[name] = (getattr(base, name), f"{base_path}.{name}")
    return values


def build(
    config: LimitsConfig,
    registry: CollectorRegistry | None = None,
    *,
    cls: type[Limits] | None = None,
    redis_retry_after: float | None = None,
) -> Limits | None:
    """The gateway's limits, or None when none are configured (`cls`: a subclass, built always;
    `redis_retry_after`: seconds after a Redis failure before it is asked again, if not the default)."""
    if not config.enabled and cls is None:
        return None
    cls = cls or Limits
    store: Store
    if config.redis_url:
        from dragoman.limits.outages import outage_counter
        from dragoman.limits.redis_slots import SharedConcurrency
        from dragoman.limits.redis_store import RETRY_AFTER, RedisStore

        errors = Counter("dragoman_limits_store_errors", "Redis failures met by the limits (fail_open served on)",
                         registry=registry) if registry is not None else None  # fmt: skip
        store = RedisStore(config.redis_url, prefix=config.redis_prefix, timeout=config.redis_timeout,
                           fail_open=config.on_redis_error == "fail_open",
                           on_error=errors.inc if errors is not None else lambda: None,
                           on_outage=outage_counter(registry, config.on_redis_error),
                           retry_after=RETRY_AFTER if redis_retry_after is None else redis_retry_after,
                           credit=config.redis_credit)  # fmt: skip
        return cls(config, store, registry, concurrency=SharedConcurrency(store))
    return cls(config, LocalStore(), registry)
