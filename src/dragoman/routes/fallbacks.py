"""Fallbacks from one model to another, before the first byte of content reaches the client.

`Attempts` is a backend wrapped around a route's own: it sends the request to the model, and
on a failure that calls for it (`classify`) to the next of its `fallbacks` (or, for a prompt
too long, its `context_fallbacks`), skipping models cooled down or lacking what the request
needs. A stream is watched by `gate.Gate` until its first content event: one place for both
paths, the boundary the replica retries keep. The rules are in docs/routing.md (Fallbacks).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Literal

from dragoman.calls.types import Call, Completed, Reply, Route, Slots, Streaming, UpstreamModel
from dragoman.core.error_mapping import from_upstream
from dragoman.core.errors import GatewayError
from dragoman.core.redaction import NO_KEYS
from dragoman.routes.gate import Gate
from dragoman.routes.settings import FallbackSettings
from dragoman.routes.shape import Shape
from dragoman.routes.shared import Shared
from dragoman.routes.signatures import without_thinking

Kind = Literal["fallback", "context", "misconfigured"]
ROUTE_HEADER = "x-dragoman-route"
_TOO_LONG = ("prompt is too long", "exceed context limit")


def classify(error: GatewayError) -> Kind | None:
    """What a failure calls for: another model, a larger one, another with a cool-down, or nothing."""
    if any(words in error.message for words in _TOO_LONG):
        return "context"
    if not error.is_upstream:
        return None  # the gateway's own refusal (the request is wrong): no model would do better
    if error.status == 404 or (error.status == 502 and error.should_retry is False):
        return "misconfigured"  # the upstream refused the gateway's key (401, 403: mapped to 502) or the model
    if error.status == 429 or error.status >= 500:
        return "fallback"
    return None


class Cooldowns:
    """Models passed over as targets for a while after failing: `cooldown_failures` within
    `cooldown_window` seconds, or at once when the upstream refused them (401, 403, 404)."""

    def __init__(self, settings: FallbackSettings, shared: Shared | None = None) -> None:
        self._settings = settings
        self._failures: dict[str, deque[float]] = {}
        self._until: dict[str, float] = {}
        self.shared = shared  # every process's failures count, and every one's cool-downs hold (Redis)

    def heard(self, model: str, seconds: float) -> None:
        """Another process cooled `model` down for `seconds` more (shared.Shared's poll)."""
        self._until[model] = max(self._until.get(model, 0.0), time.monotonic() + seconds)

    def cooled(self, model: str) -> bool:
        until = self._until.get(model)
        return until is not None and time.monotonic() < until

    def failed(self, model: str, *, at_once: bool = False) -> None:
        now, settings = time.monotonic(), self._settings
        failures = self._failures.setdefault(model, deque())
        failures.append(now)
        while failures and failures[0] < now - settings.cooldown_window:
            failures.popleft()
        if at_once or len(failures) >= settings.cooldown_failures:
            self._until[model] = now + settings.cooldown
            failures.clear()
        if self.shared is not None:
            self.shared.failed(model, at_once, settings.cooldown_failures, settings.cooldown_window, settings.cooldown)


class Once:
    """A slot's release, run once: by the first of its attempt given up and the request's end."""

    __slots__ = ("_release",)

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release

    def __call__(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


@dataclasses.dataclass(slots=True)
class Attempts:
    """A route's backend with its model's fallbacks (a Backend: the pipeline sees one)."""

    primary: Route
    primary_name: str
    fallbacks: list[str]
    context_fallbacks: list[str]
    resolve: Callable[[str], Awaitable[Route]]
    shape: Shape
    cooldowns: Cooldowns
    settings: FallbackSettings
    retry_budget: float
    header: str | None  # the route's name, for x-dragoman-route
    windows: dict[str, int | None]
    checking: frozenset[str] = frozenset()  # models whose upstream checks thinking signatures
    slots: Mapping[str, Slots] = dataclasses.field(default_factory=dict)  # each upstream's max_concurrent
    tried: list[str] = dataclasses.field(default_factory=list)
    current: str = ""
    deadline: float | None = None
    name: str = ""  # the primary backend's (a Backend's name)

    def __post_init__(self) -> None:
        self.name = self.primary.backend.name

    serving: Route | None = None  # the route of the latest attempt
    held: Once | None = None  # the slot the latest attempt took on another upstream, if any

    @property
    def path(self) -> str:
        """The path of the model that served (read once the reply is in), else the first's."""
        return (self.serving or self.primary).backend.path

    async def messages(self, call: Call, route: Route) -> Reply:
        self.deadline = time.monotonic() + self.retry_budget  # the request's one budget, from its first send
        name, target = self.primary_name, self.primary
        if self.cooldowns.cooled(name) and (self.fallbacks or self.context_fallbacks):
            following = await self._next_target(name, "fallback", failed=False)  # cooled: straight to the next
            if following is not None:
                name, target = following
        reply = await self.attempt(call, name, target)
        if isinstance(reply, Streaming):
            reply = Gate(self, call, reply).reply()
        if self.header is not None:
            reply.headers[ROUTE_HEADER] = self.header
        return reply

    async def attempt(self, call: Call, name: str, target: Route) -> Reply:
        """The reply of `name`, or of the models after it while each fails in a way that calls for one."""
        while True:
            self.tried.append(name)
            self.current, self.serving = name, target
            if call.outcome is not None:
                call.outcome.routed(target)
            try:
                reply = await self._sent(call, name, target)
            except GatewayError as error:
                following = await self.after(error)
                if following is None:
                    raise
                name, target = following
                continue
            refused = _refusal(reply, target)
            if refused is None:
                return reply
            following = await self.after(refused)
            if following is None:
                return reply  # the upstream's own answer, as it came
            self.let_go()
            name, target = following

    async def _sent(self, call: Call, name: str, target: Route) -> Reply:
        """`target`'s reply. On another upstream than the first model's, within one of its slots
        (the pipeline took the first's), held to the request's end; a full queue is a 529."""
        slots = None if target.upstream == self.primary.upstream else self.slots.get(target.upstream)
        if slots is None:
            return await target.backend.messages(self._call_for(call, name, target), target)
        await slots.acquire(queue=True)
        try:
            reply = await target.backend.messages(self._call_for(call, name, target), target)
        except BaseException:
            slots.release()
            raise
        self.held = Once(slots.release)
        if call.outcome is not None:
            call.outcome.finish.hold(self.held)  # a stream holds it to its last byte
        else:
            self.let_go()
        return reply

    def let_go(self) -> None:
        """The latest attempt is given up (its answer refused, its stream failed before content):
        its slot goes back now, not when the request ends."""
        held, self.held = self.held, None
        if held is not None:
            held()

    def _call_for(self, call: Call, name: str, target: Route) -> Call:
        """`call` as `target` gets it: its model's name, no thinking signed elsewhere when it checks, and
        for a fallback the request's retry budget (what the models before it waited is spent)."""
        fallback = len(self.tried) > 1
        call = dataclasses.replace(call, upstream_model=target.upstream_model,
                                   retry_deadline=self.deadline if fallback else call.retry_deadline)  # fmt: skip
        foreign = self.header is not None or name != self.primary_name  # a route or a fallback chose it
        if foreign and name in self.checking and target.path == "passthrough":
            body = without_thinking(call.body)
            if body is not None:
                call = dataclasses.replace(call, body=body, request=None, envelope=None)
        return call

    async def after(self, error: GatewayError) -> tuple[str, Route] | None:
        """The model to try after the current one failed with `error`, if any."""
        kind = classify(error)
        if kind is None:
            return None
        self.cooldowns.failed(self.current, at_once=kind == "misconfigured")
        if len(self.tried) >= self.settings.max_attempts:
            return None  # sent at once, as a retry to another replica: capped in number, not in time
        return await self._next_target(self.current, kind)

    async def _next_target(self, current: str, kind: Kind, *, failed: bool = True) -> tuple[str, Route] | None:
        names = self.context_fallbacks if kind == "context" else self.fallbacks
        for name in names:
            if name in self.tried or name == current or self.cooldowns.cooled(name):
                continue
            try:
                target = await self.resolve(name)
            except GatewayError:
                continue
            if self._fits(name, target, kind):
                return name, target
        return None

    def _fits(self, name: str, target: Route, kind: Kind) -> bool:
        """Whether `target` has what the request needs: vision, the window, its server tools."""
        shape = self.shape
        if target.caps.vision is False and shape.images:
            return False
        if shape.server_tools and target.path == "translate" and target.caps.drop_server_tools is not True:
            return False
        window = self.windows.get(name) or target.context_window
        if kind == "context":
            if window is None:
                return False
            if shape.tokens is not None:
                return shape.tokens + shape.max_tokens <= window
            return window > (self.primary.context_window or 0)
        return window is None or shape.tokens is None or shape.tokens <= window

    async def count_tokens(self, call: Call, route: Route) -> Reply:
        return await self.primary.backend.count_tokens(call, self.primary)

    async def list_models(self) -> list[UpstreamModel]:
        return await self.primary.backend.list_models()

    async def tool_support(self, models: list[UpstreamModel]) -> list[UpstreamModel]:
        return models

    async def close(self) -> None:
        pass  # the backends are the gateway's, closed by it


def _refusal(reply: Reply, target: Route) -> GatewayError | None:
    """A passed-through error answer (a Completed with the upstream's status) that calls for another model."""
    if not isinstance(reply, Completed) or reply.status < 400:
        return None
    error = from_upstream(reply.status, reply.body, upstream=target.upstream, redactor=NO_KEYS)  # as relayed
    return error if classify(error) is not None else None
