"""Which route a request takes: the first of `[[routes]]` whose conditions hold, else the
name's own model; then the model's fallbacks wrapped around it (`fallbacks.Attempts`).

Built once at start-up (`Routes.build`: None when nothing is configured, and the pipeline
then does what it always did). Stickiness (docs/routing.md, Sessions): a session that took a
sticky route keeps it; a sticky `input_tokens` route also holds when the session's last
reply reported more than its threshold; threshold routes only move up.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import msgspec
from prometheus_client import CollectorRegistry, Counter

from dragoman.calls.types import Call, Completed, Outcome, Route, Slots
from dragoman.core.capabilities import ModelCaps
from dragoman.core.config import Config, ConfigError
from dragoman.core.errors import GatewayError
from dragoman.protocol.anthropic import Envelope, MessagesRequest
from dragoman.routes.answer import CountAnswer, Counted
from dragoman.routes.conditions import When, compile_when
from dragoman.routes.fallbacks import Attempts, Cooldowns
from dragoman.routes.reading import Reader
from dragoman.routes.scan import following, scanner
from dragoman.routes.sessions import Held, Sessions
from dragoman.routes.settings import check, served_names
from dragoman.routes.shape import Shape, routed_envelope
from dragoman.routes.shared import Shared

MAX_PENDING = 100_000  # requests in flight whose session waits for their usage


@dataclass(frozen=True, slots=True)
class Compiled:
    name: str
    when: When
    model: str | None
    sticky: bool


def _reads_parts(config: Config) -> tuple[bool, bool]:
    """How the envelope reads the tools and system prompt: for their facts (True), when some
    route asks them, none counts (a count's body holds their bytes), no upstream places by cache
    (`upstream.placement` hashes their bytes, routing unset with replicas is cache-aware). When
    some route counts, a system prompt asked of is read as `reading.Split` (the second): its
    flag and a count's body from one pass. The tools are not: split into objects, then
    re-encoded, they would cost a request whose tools were seen (`memo.Memo`) about 5 µs more."""

    def keys(when: object) -> set[str]:
        if not isinstance(when, dict):
            return set()
        return {*when, *(k for option in when.get("any") or () for k in keys(option))}

    asked = set().union(*(keys(r.when) for r in config.routes))
    counts = bool(asked & {"input_tokens", "fits"}) or any(r.model is None for r in config.routes)
    placed = any(u.routing == "cache_aware" or (u.routing is None and u.replicas) for u in config.upstreams.values())
    if placed or not asked & {"tools", "server_tool", "subagent"}:
        return False, False
    return not counts, counts and "subagent" in asked


class Routes:
    """The route table and what it remembers (sessions, cool-downs) between requests."""

    def __init__(self, config: Config, resolve: Callable[[str], Awaitable[Route]],
                 registry: CollectorRegistry | None = None, slots: Mapping[str, Slots] | None = None) -> None:  # fmt: skip
        self._resolve = resolve
        self._slots = slots or {}  # each upstream's max_concurrent: a fallback to another upstream takes one
        self._routes = tuple(
            Compiled(r.name, compile_when(r.when, f"routes.{i}.when"), r.model, r.sticky == "session")
            for i, r in enumerate(config.routes)
        )
        self._counting = tuple(r for r in self._routes if r.model is not None)  # a count answer: Messages only
        # each route with its test, or None when only `_matches` can tell (a sticky route): looked up once
        self._tests = {endpoint: tuple((None if r.sticky else r.when.holds, r) for r in routes)
                       for endpoint, routes in (("messages", self._routes), ("count_tokens", self._counting))}  # fmt: skip
        self._scans = {endpoint: scanner([None if r.sticky else r.when for r in routes])
                       for endpoint, routes in (("messages", self._routes), ("count_tokens", self._counting))}  # fmt: skip
        self._sticky = any(r.sticky for r in self._routes)
        fields = {name for r in self._routes for name in r.when.fields}
        low, medium = [*config.server.effort_budgets, 2048, 8192][:2]
        self._reader = Reader.table((low, medium), {name for r in self._routes for name in r.when.headers})
        facts, split = _reads_parts(config)  # the tools' and system's facts in the envelope's own pass
        self.envelope = msgspec.json.Decoder(
            routed_envelope(fields, facts, split)
        )  # what the core reads of a passed-through body
        self._names = served_names(config.models)
        self._models = {(m.upstream, m.served_model): m for m in config.models}
        self._checking = frozenset(n for n, m in self._names.items() if m.checks_signatures)
        limits = config.limits  # its Redis, when configured, shares sessions and cool-downs between processes
        shared = Shared(limits.redis_url, limits.redis_prefix, limits.redis_timeout) if limits.redis_url else None
        self.sessions = Sessions(shared=shared if self._sticky else None)
        self.cooldowns = Cooldowns(config.fallbacks, shared)
        self._shared = shared
        self._chained = {name for m in config.models if m.fallbacks or m.context_fallbacks
                         for name in (m.name, *m.fallbacks, *m.context_fallbacks)}  # fmt: skip
        self._settings = config.fallbacks
        self._retry_budgets = {name: u.retry_budget for name, u in config.upstreams.items()}
        self._pending: OrderedDict[str, str] = OrderedDict()  # request id -> its session
        self.requests = Counter("dragoman_route_requests", "Requests by the route they took and the model that served them",
                                ["route", "model"], registry=registry)  # fmt: skip

    @classmethod
    def build(cls, config: Config, resolve: Callable[[str], Awaitable[Route]],
              registry: CollectorRegistry | None = None, slots: Mapping[str, Slots] | None = None) -> Routes | None:  # fmt: skip
        """The table, or None when no route and no fallback is configured; ConfigError naming
        every key at fault (an unknown model, a condition that cannot hold, ...)."""
        problems: list[str] = []
        check(config.routes, config.models, config.fallbacks, problems)
        if problems:
            raise ConfigError(problems)
        if not config.routes and not any(m.fallbacks or m.context_fallbacks for m in config.models):
            return None
        return cls(config, resolve, registry, slots)

    async def route(self, body: bytes, headers: Mapping[str, str], read: MessagesRequest | Envelope, endpoint: str,
                    outcome: Outcome) -> Route:  # fmt: skip
        """The route for one request (with its fallbacks), noted in `outcome` and its trace. `read` is
        what the core decoded of `body` (whole, or its envelope): what it holds is not read again."""
        model = read.model
        shape = Shape(model, headers, body, read, self._reader)
        session = shape.session if self._sticky else None
        if self._shared is not None and self._chained:
            self._shared.watch(self._chained, self.cooldowns.heard)  # once: the others' cool-downs, polled
        held = None if session is None else await self.sessions.fetch(session)
        if held is not None and held.last_input:
            self._climb(session, held)  # type: ignore[arg-type]
        base: list[Route] = []  # the name's own route, once resolved

        async def own() -> Route:
            if not base:
                base.append(await self._resolve(model))
            return base[0]

        chosen: Compiled | None = None
        kind = "messages" if endpoint == "messages" else "count_tokens"
        tests = self._tests[kind]
        at, verdict = self._scans[kind](shape)  # the first route not ruled out, without awaiting
        while at >= 0:
            route = tests[at][1]
            if verdict or await self._matches(route, shape, held, own, headers, endpoint):
                chosen = route
                break
            at, verdict = following(tests, shape, at + 1)
        if session is not None:
            self._note_pending(outcome.request_id, session)  # its reply's usage: the session's size
        if chosen is not None and chosen.sticky and session is not None:
            self.sessions.took(session, chosen.name, chosen.when.threshold)
        if chosen is None:
            mine = await own()
            if endpoint == "count_tokens" and shape.answer is not None:  # counted already: not again
                mine = dataclasses.replace(mine, backend=Counted(shape.answer, mine.backend))
            return self._wrapped(mine, None, shape, outcome, headers)
        outcome.route = chosen.name
        if outcome.trace is not None:
            outcome.trace.span.set_attribute("dragoman.route", chosen.name)
        if chosen.model is None:
            if shape.tokens is None:
                await self._count(shape, own, headers, endpoint)
            answer = CountAnswer(shape.tokens or 0, chosen.name)
            return Route(answer, "local", model, ModelCaps())
        return self._wrapped(await self._resolve(chosen.model), chosen.name, shape, outcome, headers)

    def _climb(self, session: str, held: Held) -> None:
        """A session whose last reply reported a prompt above a sticky threshold route's threshold
        takes that route (when the threshold is all it asks): sessions move up before any count."""
        for route in self._routes:
            when = route.when
            if route.sticky and when.threshold is not None and not when.tests and not when.anys \
                    and len(when.counted) == 1 and held.last_input > when.threshold:  # fmt: skip
                self.sessions.took(session, route.name, when.threshold)

    async def _matches(self, route: Compiled, shape: Shape, held: Held | None, own: Callable[[], Awaitable[Route]],
                       headers: Mapping[str, str], endpoint: str) -> bool:  # fmt: skip
        """Whether `route` takes the request: its session's hold first, then its conditions."""
        threshold = route.when.threshold
        larger = 0  # the session's last reply said its prompt was this large
        if route.sticky and held is not None:
            if threshold is not None and threshold < held.floor:
                return False  # a session moved past this threshold: only up
            if route.name in held.routes:
                return True
            larger = held.last_input if threshold is not None else 0
        verdict = route.when.holds(shape)
        if verdict is None or (larger and not verdict):
            if shape.tokens is None:
                await self._count(shape, own, headers, endpoint)
            counted = shape.tokens
            shape.tokens = max(counted or 0, larger)
            verdict = route.when.holds(shape)
            shape.tokens = counted
        return bool(verdict)

    async def _count(self, shape: Shape, own: Callable[[], Awaitable[Route]], headers: Mapping[str, str],
                     endpoint: str) -> None:  # fmt: skip
        """The input count `count_tokens` would answer for the name's own model (and its window, for `fits`);
        a `count_tokens` request's is that very answer (`shape.answer`), asked with the request's own body."""
        try:
            base = await own()
        except GatewayError:
            shape.tokens = shape.estimate()
            return
        shape.window = base.context_window
        passed = base.path == "passthrough"
        spliced = passed and endpoint != "count_tokens"  # the upstream's count takes no max_tokens
        body = shape.count_body() if spliced else shape.raw
        # its messages are the envelope's: the backend's URL-image check reuses their read, not reads the body
        call = Call(body=body, model=shape.model, upstream_model=base.upstream_model, headers=headers, request_id="",
                    envelope=shape.envelope if passed else None)  # fmt: skip
        try:
            reply = await base.backend.count_tokens(call, base)
            counted = msgspec.json.decode(reply.body).get("input_tokens") if isinstance(reply, Completed) else None
        except (GatewayError, msgspec.DecodeError, AttributeError):
            counted = None
        shape.tokens = counted if isinstance(counted, int) else shape.estimate()
        if isinstance(counted, int) and endpoint == "count_tokens" and reply.status == 200:  # type: ignore[union-attr]
            shape.answer = reply

    def _wrapped(self, route: Route, name: str | None, shape: Shape, outcome: Outcome,
                 headers: Mapping[str, str]) -> Route:  # fmt: skip
        """`route` with its model's fallbacks and the route's header, or as it is when it has neither."""
        model = self._models.get((route.upstream, route.upstream_model))
        chain = list(model.fallbacks) if model else []
        context = list(model.context_fallbacks) if model else []
        if name is None and not chain and not context:
            return route
        attempts = Attempts(
            primary=route, primary_name=model.name if model else route.upstream_model, fallbacks=chain,
            context_fallbacks=context, resolve=self._resolve, shape=shape, cooldowns=self.cooldowns,
            settings=self._settings, retry_budget=self._retry_budgets.get(route.upstream, 0.0),
            header=name, windows={n: m.context_window for n, m in self._names.items()}, checking=self._checking,
            slots=self._slots,
        )  # fmt: skip
        return dataclasses.replace(route, backend=attempts)

    def _note_pending(self, request_id: str, session: str) -> None:
        self._pending[request_id] = session
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()

    def finished(self, outcome: Outcome, duration: float) -> None:
        """(A metrics sink.) The session's last prompt size, from the reply's usage; the route's counter."""
        if outcome.route:
            self.requests.labels(outcome.route, outcome.served_model or "unknown").inc()
        session = self._pending.pop(outcome.request_id, None)
        if session is not None and outcome.input_tokens is not None:
            prompt = outcome.input_tokens + (outcome.cache_read_tokens or 0) + (outcome.cache_creation_tokens or 0)
            self.sessions.replied(session, prompt)
