"""The gateway's runtime state: config, backends, router, and model discovery.

Discovery never blocks startup and never breaks a request: an upstream that is
down is asked again later, at most every `REDISCOVER_AFTER` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dragoman import __version__
from dragoman.assembly.backpressure import Limiter
from dragoman.assembly.observe import Metrics, capped
from dragoman.assembly.pipeline import Pipeline
from dragoman.assembly.request_trace import end_trace
from dragoman.assembly.routing import Router
from dragoman.assembly.settings import Settings, resolve
from dragoman.assembly.threads import ThreadStore
from dragoman.assembly.tracing import build_tracing
from dragoman.backends import build
from dragoman.backends.shared import Shared
from dragoman.batches.runs import BatchTimings
from dragoman.batches.service import Batches
from dragoman.calls.types import Backend, NoModelList, Route, UpstreamModel
from dragoman.core.capabilities import (
    REGISTRY_TIMEOUT,
    REGISTRY_URL,
    Registry,
    needs_refresh,
    refresh_registry,
    registry_path,
)
from dragoman.core.config import Config
from dragoman.core.errors import GatewayError, InvalidRequest, NotFound
from dragoman.core.owners import Owners
from dragoman.core.paging import list_param, page_of
from dragoman.files.store import FileStore
from dragoman.keys import wiring as keys
from dragoman.keys.admin import KeyAdmin
from dragoman.limits.outages import outage_counter
from dragoman.routes.table import Routes
from dragoman.safeguards.service import Safeguards
from dragoman.upstream.client import MODEL_LIST_TIMEOUT, PROBE_TIMEOUT, Waits
from dragoman.upstream.replicas import CoolDowns
from dragoman.usage.stores import writer_for
from dragoman.usage.writer import UsageWriter

log = logging.getLogger("dragoman")

REDISCOVER_AFTER = 10.0
REGISTRY_CHECK_EVERY = 3600.0  # the cache itself is refreshed once it is a day old
# A backstop only: a model list (MODEL_LIST_TIMEOUT) and the `auto` probe before it
# (PROBE_TIMEOUT) end in their own time with what they saw, and that is what is logged
# (one instance's 503 while another hangs, not "no answer").
DISCOVERY_TIMEOUT = PROBE_TIMEOUT + MODEL_LIST_TIMEOUT + 1.0
READY_REUSE = 1.0  # seconds a /ready round's answer is reused: the probe is open to anyone
EPOCH = "1970-01-01T00:00:00Z"


LIFECYCLES = frozenset({"active", "deprecated", "retired"})


@dataclass(slots=True)
class Timings:
    """How often a gateway asks its upstreams for their models (and models.dev for its registry),
    and for how long; a test sets its own on the gateway (`Gateway.timings`) instead of patching
    the module's defaults."""

    rediscover_after: float = REDISCOVER_AFTER
    discovery_timeout: float = DISCOVERY_TIMEOUT
    ready_reuse: float = READY_REUSE
    registry_url: str = REGISTRY_URL  # where models.dev's registry is fetched (a test's own server)
    registry_timeout: float = REGISTRY_TIMEOUT
    batches: BatchTimings = field(default_factory=BatchTimings)  # its batches' sweeps and rests
    cool_downs: CoolDowns = field(default_factory=CoolDowns)  # how long its backends pass a failed instance over
    waits: Waits = field(default_factory=Waits)  # how long their model lists and protocol probes wait
    redis_retry_after: float | None = None  # seconds its limits wait after a Redis failure; None: their default


async def with_tool_support(backend: Backend, models: list[UpstreamModel]) -> list[UpstreamModel]:
    """`models` with whether each chat template shows the model tools, where the backend can
    tell (backends/openai/tool_support.py); a backend without the check keeps its list."""
    probe = getattr(backend, "tool_support", None)
    if probe is None:
        return models
    try:
        return list(await probe(models))
    except GatewayError as error:  # the list stands without it
        log.info("upstream %s: whether its chat templates render tools is unknown (%s)", backend.name, error.message)
        return models


class Gateway:
    def __init__(
        self,
        config: Config,
        backends: dict[str, Backend] | None = None,
        metrics: Metrics | None = None,
        shared: Shared | None = None,
        settings: Settings | None = None,
        timings: Timings | None = None,
    ) -> None:
        """`settings`: `config` resolved (`assembly.settings.resolve`), or resolved here first;
        `timings`: other than the defaults (a test's)."""
        settings = settings or resolve(config)
        self.config = config = settings.config
        self.timings = timings or Timings()
        self.shared = shared or Shared(
            cool_downs=self.timings.cool_downs, waits=self.timings.waits
        )  # once process-global: keys to redact, ...
        self._clock = self.shared.clock
        self.metrics = metrics or Metrics()
        self.metrics.redactor = self.shared.redactor
        self.metrics.registry.register(self.shared.gauges)  # what each replica says of its load
        self.backends = backends if backends is not None else build(config, self.shared)
        self.registry_file = _registry_file(config)
        registry = Registry.load(self.registry_file) if self.registry_file else Registry()
        self.registry_missed = False  # the last refresh found models.dev out of reach (or failing)
        self.router = Router(config, self.backends, registry, settings.counters)
        self.api_keys = settings.api_keys
        self.tenants = settings.tenants
        self.admin_keys = settings.admin_keys
        self.keyring = keys.keyring(config, self.api_keys, self.tenants, self.admin_keys)  # every key, by digest
        self.limiters = {
            name: Limiter(name, upstream.max_concurrent, upstream.max_queue)
            for name, upstream in config.upstreams.items()
            if upstream.max_concurrent is not None
        }
        self._last_attempt: dict[str, float] = {}
        self._asked: set[str] = set()  # upstreams asked for their models at least once
        self._warned: set[str] = set()  # routing warnings logged and still true
        self._lock = asyncio.Lock()
        self._translates_only: bool | None = None
        self._background: asyncio.Future[None] | None = None
        self._readiness: asyncio.Future[list[str]] | None = None  # the latest /ready round
        self._ready_at = 0.0  # when it ended
        self.tracing = build_tracing(config.tracing, __version__)
        if self.tracing is not None:
            self.metrics.sinks.append(end_trace)
        self.owners = Owners(settings.owner_salt)  # read (or made) by resolve, where keys name owners
        self.files = FileStore(config.files, self.owners)
        self.threads = ThreadStore()
        self.limits = keys.limits(config, self.keyring, self.metrics.registry, self.timings.redis_retry_after)
        self.routes = Routes.build(config, self.route, self.metrics.registry, self.limiters)  # [[routes]], fallbacks
        if self.routes is not None:
            self.metrics.sinks.append(self.routes.finished)
        self.pipeline = self._pipeline(config)
        self.batches = Batches(self.pipeline, self.metrics, config.batches, self.owners, timings=self.timings.batches)
        self.usage = self._usage(config)
        self.key_admin = self._key_admin(config)

    def _pipeline(self, config: Config) -> Pipeline:
        return Pipeline(route=self.route, files=self.files, threads=self.threads, limiters=self.limiters,
                        max_request_bytes=config.server.max_request_bytes,
                        decode_whole=lambda: self.translates_only, tracing=self.tracing,
                        limits=self.limits, notice=config.server.tools_dropped_notice,
                        safeguards=Safeguards(config, self.route, self.metrics.record, self.limiters),
                        routes=self.routes)  # fmt: skip

    def _usage(self, config: Config) -> UsageWriter | None:
        """The usage writer, its records fed by the metrics' finish, when usage is on."""
        if not config.usage.enabled:
            return None
        usage = writer_for(config)
        self.keyring.outage = usage.outage  # the same database: one warning per outage
        self.metrics.open_sinks.append(usage.opened)
        self.metrics.sinks.append(usage.note)
        return usage

    def _key_admin(self, config: Config) -> KeyAdmin:
        """The Admin API's key operations; budgets charged from the ledger; both the Admin API
        and the reports counted when they refuse while the database is out."""
        keys.seeding(self.keyring, self.limits, self.usage, config)
        admin = keys.admin(self.keyring, self.usage, config)
        refused = outage_counter(self.metrics.registry, "answer_503", store="database")
        for guard in (admin.guard, *([self.usage.guard] if self.usage is not None else [])):
            guard.on_refused = lambda: refused("refused")
        return admin

    @property
    def translates_only(self) -> bool:
        """Every upstream is served by translation, so the core can decode a request whole
        at once instead of its routing envelope first and the rest again in the backend.
        Known for good once no `auto` upstream is still undecided."""
        if self._translates_only is None:
            paths = {backend.path for backend in self.backends.values()}
            if "undecided" in paths:
                return False
            self._translates_only = paths == {"translate"}
        return self._translates_only

    def rename_legacy_owners(self) -> None:
        """(At start-up, in a thread.) Owner directories of earlier versions get their salted
        names (see `core.owners`), before any request or batch run looks for them."""
        for root in (self.files.dir, self.batches.root):
            try:
                renamed = self.owners.rename_legacy_dirs(root)
            except OSError as error:
                log.warning("renaming the owner directories of %s stopped: %s", root, error)
                continue
            if renamed:
                log.info("renamed %d owner directories of %s to their salted names", renamed, root)

    async def close(self) -> None:
        """Background discovery and a /ready round still running are cancelled and awaited
        first: they use the backends closed here, and a task left pending is destroyed
        (and logged) when the event loop closes."""
        running = [task for task in (self._background, self._readiness) if task is not None and not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)
        await self.batches.close()
        if self.limits is not None:
            await self.limits.close()
        if self.routes is not None:
            await self.routes.close()
        await self.keyring.close()
        for backend in self.backends.values():
            await backend.close()
        if self.tracing is not None:
            await self.tracing.close()
        await self.shared.close()
        if self.usage is not None:
            await self.usage.close()  # last: every request before it has been recorded

    async def refresh_registry(self) -> None:
        if self.registry_file is not None and needs_refresh(self.registry_file):
            registry = await refresh_registry(
                self.registry_file, self.timings.registry_timeout, self.timings.registry_url
            )
            self.registry_missed = registry is None
            if registry is not None:
                self.router.registry = registry

    async def keep_registry_fresh(self) -> None:
        """Refresh the models.dev cache now and then, for a gateway that runs for weeks."""
        while True:
            await self.refresh_registry()
            await asyncio.sleep(REGISTRY_CHECK_EVERY)

    async def discover(self, upstream: str) -> None:
        self._last_attempt[upstream] = self._clock()
        try:
            async with asyncio.timeout(self.timings.discovery_timeout):
                models = await self.backends[upstream].list_models()
        except TimeoutError:  # its str() is empty
            log.warning("model discovery on upstream %s failed: no answer within %g s", upstream,
                        self.timings.discovery_timeout)  # fmt: skip
        except NoModelList as error:  # said once: it will answer the same at every rediscovery
            if self.router.set_listless(upstream):
                log.warning("%s: names that no other upstream lists go to it (a 404 instead when several upstreams "
                            "have no list: give their models [[models]] entries)", error.message)  # fmt: skip
        except GatewayError as error:
            log.warning("model discovery on upstream %s failed: %s", upstream, capped(error.message))
        else:
            self.router.set_discovered(upstream, models)
            log.info("upstream %s serves: %s", upstream, capped(", ".join(m.id for m in models)) or "no models")
            probed = await with_tool_support(self.backends[upstream], models)
            if probed != models and self.router.discovered.get(upstream) is models:  # not replaced meanwhile
                self.router.set_discovered(upstream, probed)
        self._asked.add(upstream)

    async def discover_all(self, upstreams: Iterable[str]) -> None:
        """Ask these upstreams at once; then judge the lists as a whole (a warning about two
        lists is due once both are in, not on a half-updated view)."""
        await asyncio.gather(*(self.discover(u) for u in upstreams))
        if len(self._asked) == len(self.backends):
            self._warn_about_routing()

    def _warn_about_routing(self) -> None:
        """Log what the model lists make surprising, once when it appears: not again at each
        rediscovery (every miss may ask), nor per request."""
        warnings = set()
        for model, (serving, others) in self.router.shadowed().items():
            warnings.add(f"model {model!r} is listed by more than one upstream: {serving} serves it (first in the "
                         f"configuration); its requests never reach {', '.join(others)}")  # fmt: skip
        for upstream, listed in self.router.discovered.items():
            for entry in listed:
                if entry.renders_tools is False:
                    warnings.add(f"upstream {upstream}: the chat template of model {entry.id!r} renders no tools: requests "
                                 "with tools reach the model without them (Claude Code only seems to work); serve a model "
                                 "whose template supports tool calls (docs/claude-code.md)")  # fmt: skip
        if self.router.default_unlisted():
            warnings.add(f"default model {self.config.server.default_model!r} (server.default_model) is not listed by any "
                         "upstream: a name nothing else serves (claude-*, say) gets 404 until an upstream lists it")  # fmt: skip
        for warning in sorted(warnings - self._warned):
            log.warning("%s", warning)
        self._warned = warnings

    async def discover_if_stale(self, *, even_if_known: bool = False) -> None:
        """Ask upstreams for their models again: those with no list yet (an upstream that
        was down at startup still tells its server kind and context windows once up), or,
        after a miss, those serving what they list (one may have been restarted with
        other models)."""
        now = self._clock()
        candidates = self.router.discovering if even_if_known else list(self.backends)
        stale = [
            u
            for u in candidates
            if (even_if_known or not self.router.answered(u))
            and now - self._last_attempt.get(u, -1e9) > self.timings.rediscover_after
        ]
        if stale:
            async with self._lock:
                await self.discover_all(stale)

    async def route(self, model: str) -> Route:
        known = sum(1 for name in self.backends if self.router.answered(name))
        if known < len(self.backends) and self._background is None:
            # Some upstream was down when last asked: ask again without holding this request.
            self._background = asyncio.ensure_future(self.discover_if_stale())
            self._background.add_done_callback(self._background_done)
        try:
            return self.router.resolve(model)
        except NotFound:
            await self.discover_if_stale(even_if_known=True)
            return self.router.resolve(model)

    def _background_done(self, future: asyncio.Future[None]) -> None:
        self._background = None
        if not future.cancelled() and future.exception() is not None:
            log.warning("background model discovery failed: %s", future.exception())

    async def reachable_upstreams(self) -> list[str]:
        """The upstreams that answer their model list. /ready is unauthenticated, and each
        round asks every upstream (an authenticated call to a hosted one): probes at the same
        moment share one round, and its answer is reused for `timings.ready_reuse` seconds, so that
        nobody can multiply calls to the upstreams by asking /ready."""
        latest = self._readiness
        if latest is None or (latest.done() and self._clock() - self._ready_at >= self.timings.ready_reuse):
            latest = self._readiness = asyncio.ensure_future(self._probe_upstreams())
        return list(await asyncio.shield(latest))  # a caller that leaves does not cancel the others' round

    async def _probe_upstreams(self) -> list[str]:
        async def probe(name: str) -> str | None:
            try:
                async with asyncio.timeout(self.timings.discovery_timeout):
                    await self.backends[name].list_models()
                return name
            except NoModelList:  # it answered: a server without a list is up all the same
                return name
            except (GatewayError, TimeoutError):
                return None

        try:
            results = await asyncio.gather(*(probe(n) for n in self.backends))
        finally:
            self._ready_at = self._clock()
        return [r for r in results if r]

    # -- models API ----------------------------------------------------------------

    def _info(self, name: str) -> dict[str, Any]:
        route = self.router.resolve(name)
        return {
            "type": "model",
            "id": name,
            "display_name": name if route.upstream_model == name else f"{name} ({route.upstream_model})",
            "created_at": EPOCH,
            "max_input_tokens": route.context_window,
            "max_tokens": route.caps.max_output_tokens,
            # What the API reports of Anthropic's own models: none of it applies here, but the
            # TypeScript SDK types every one as present, and lists filter on `lifecycle`.
            "capabilities": None,
            "lifecycle": "active",
            "deprecated_at": None,
            "retires_at": None,
            "line": None,
        }

    def model_info(self, name: str) -> dict[str, Any]:
        """Any name that /v1/messages serves, listed or not (a wildcard alias such as
        `claude-*`, or `default_model`), as Anthropic's API answers for its aliases."""
        return self._info(name)  # resolving an unserved name is the 404

    def models_page(self, query: Mapping[str, str]) -> dict[str, Any]:
        stages = set(list_param(query, "lifecycle"))
        if stages - LIFECYCLES:
            raise InvalidRequest(
                f"lifecycle: {sorted(stages - LIFECYCLES)[0]!r} is not one of active, deprecated, retired"
            )
        names = self.router.names() if not stages or "active" in stages else []  # every model served here is active
        return page_of(names, query, self._info, "model")


def _registry_file(config: Config) -> Path | None:
    """Where models.dev's registry is cached: none when `registry_cache` is "" (off)."""
    cache = config.server.registry_cache
    return None if cache == "" else Path(cache).expanduser() if cache else registry_path()
