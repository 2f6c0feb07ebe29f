"""Model name -> Route: which backend serves it, under which upstream id, with what
capabilities. The one capability lookup of the gateway.

Order: a configured name, a configured alias (exact, then `*` wildcards), a model
the upstream itself lists (for upstreams without configured models), then the
default model. Anything else goes to the one upstream without a model list, if there
is one, or is a 404 that lists what is served.
"""

from __future__ import annotations

import fnmatch

from dragoman.calls.types import Backend, Route, UpstreamModel
from dragoman.core.capabilities import Decision, ModelCaps, ReasoningCaps, Registry, decide
from dragoman.core.config import Config, ConfigError, ModelConfig
from dragoman.core.errors import NotFound, UpstreamError
from dragoman.tokens.tokenizer import LocalCounter, TiktokenCounter, TokenizerError

# Anthropic's model ids (as the official SDK lists them). A wildcard alias such as
# `claude-*` is listed in /v1/models under the ones it matches, so that clients which
# discover models by name (Claude Code keeps only ids starting with "claude") find it.
CLAUDE_MODEL_IDS = (
    "claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5", "claude-opus-5", "claude-sonnet-5",
    "claude-opus-4-8", "claude-opus-4-7", "claude-opus-4-6", "claude-sonnet-4-6",
    "claude-opus-4-5", "claude-opus-4-5-20251101", "claude-sonnet-4-5", "claude-sonnet-4-5-20250929",
    "claude-haiku-4-5", "claude-haiku-4-5-20251001",
)  # fmt: skip

MAX_CACHED_ROUTES = 4096  # names are chosen by clients: the cache must not grow without bound


# How to serve a name nothing serves (Claude Code's claude-* names): said in the 404 that refuses one.
SERVE_ANY_NAME = (
    "To serve any other name with one of them, start dragoman with --default-model NAME "
    '(server.default_model), or give the model aliases (wildcards such as "claude-*" work)'
)


Counter = LocalCounter | TiktokenCounter


def load_counters(config: Config) -> dict[str, Counter]:
    """Each model's own token counter (its tokenizer or tiktoken files); a ConfigError naming
    every model whose files cannot be loaded."""
    counters: dict[str, Counter] = {}
    problems = []
    for index, model in enumerate(config.models):
        try:
            if model.tokenizer:
                counters[model.name] = LocalCounter(model.tokenizer, model.chat_template)
            elif model.tiktoken_encoding or model.tiktoken_file:
                if not (model.tiktoken_encoding and model.tiktoken_file):
                    raise TokenizerError("tiktoken_encoding and tiktoken_file go together")
                counters[model.name] = TiktokenCounter(model.tiktoken_encoding, model.tiktoken_file)
        except TokenizerError as error:
            problems.append(f"models.{index}.{'tokenizer' if model.tokenizer else 'tiktoken_file'}: {error}")
    if problems:
        raise ConfigError(problems)
    return counters


class Router:
    def __init__(self, config: Config, backends: dict[str, Backend], registry: Registry | None = None,
                 counters: dict[str, Counter] | None = None) -> None:  # fmt: skip
        """`counters`: the models' token counters, loaded already (`load_counters`) or loaded here."""
        self._config = config
        self._registry = registry or Registry()
        self._backends = backends
        self._by_name: dict[str, ModelConfig] = {}
        self._wildcards: list[tuple[str, ModelConfig]] = []
        for model in config.models:
            self._by_name.setdefault(model.name, model)
            for alias in model.aliases:
                if "*" in alias or "?" in alias:
                    self._wildcards.append((alias, model))
                else:
                    self._by_name.setdefault(alias, model)
        self._counters = load_counters(config) if counters is None else counters
        configured = {m.upstream for m in config.models}
        # Upstreams without configured models serve every model they list.
        self.discovering = [name for name in config.upstreams if name not in configured]
        self._discovered: dict[str, list[UpstreamModel]] = {}
        self._listless: set[str] = set()  # upstreams that answered without a model list
        self._routes: dict[str, Route] = {}

    def _configured(self, name: str) -> ModelConfig | None:
        model = self._by_name.get(name)
        if model is None:
            for pattern, candidate in self._wildcards:
                if fnmatch.fnmatchcase(name, pattern):
                    return candidate
        return model

    def decision(self, upstream_model: str, configured: bool | None = None) -> Decision:
        return decide(upstream_model, configured, self.registry)

    def _reasoning(self, upstream_model: str, model: ModelConfig | None) -> ReasoningCaps:
        server = self._config.server
        strict = server.strict_thinking if model is None or model.strict_thinking is None else model.strict_thinking
        low, medium = (server.effort_budgets + [2048, 8192])[:2]
        return ReasoningCaps(
            reasoning=self.decision(upstream_model, model.reasoning if model else None).reasoning,
            efforts=tuple(model.reasoning_efforts) if model else ("low", "medium", "high"),
            thinking_off=model.thinking_off if model else None,
            strict=strict,
            low_max_budget=low,
            medium_max_budget=medium,
        )

    def _route_configured(self, model: ModelConfig) -> Route:
        caps = ModelCaps(
            vision=model.vision,
            reasoning=self._reasoning(model.served_model, model),
            reasoning_replay=model.reasoning_replay,
            max_output_tokens=model.max_output_tokens,
            drop_server_tools=None if model.server_tools is None else model.server_tools == "drop",
        )
        entry = self._discovered_entry(model.upstream, model.served_model)
        window = model.context_window or (entry.context_window if entry else None)
        return Route(
            self._backends[model.upstream],
            model.upstream,
            model.served_model,
            caps,
            window,
            self._counters.get(model.name),
            renders_tools=entry.renders_tools if entry else None,
        )

    def _discovered_entry(self, upstream: str, model_id: str) -> UpstreamModel | None:
        entries = self.discovered.get(upstream, ())
        for entry in entries:
            if entry.id == model_id:
                return entry
        # llama.cpp serves one model whatever the name asked for.
        return entries[0] if len(entries) == 1 and entries[0].owned_by == "llamacpp" else None

    def _route_upstream_model(
        self, upstream: str, name: str, entry: UpstreamModel | None = None, *, listed: bool = True
    ) -> Route:
        caps = ModelCaps(reasoning=self._reasoning(name, None))
        window, tools = (entry.context_window, entry.renders_tools) if entry else (None, None)
        return Route(self._backends[upstream], upstream, name, caps, window, listed=listed, renders_tools=tools)

    def _route_discovered(self, name: str) -> Route | None:
        for upstream in self.discovering:
            for entry in self.discovered.get(upstream, ()):
                if entry.id == name:
                    return self._route_upstream_model(upstream, name, entry)
        return None

    def resolve(self, name: str) -> Route:
        """The route for a model name (cached until the upstreams' lists change)."""
        route = self._routes.get(name)
        if route is None:
            route = self._resolve(name)
            if len(self._routes) < MAX_CACHED_ROUTES:
                self._routes[name] = route
        return route

    def _resolve(self, name: str) -> Route:
        model = self._configured(name)
        if model is not None:
            return self._route_configured(model)
        route = self._route_discovered(name)
        if route is not None:
            return route
        default = self._config.server.default_model
        if default and default != name:
            try:
                return self.resolve(default)
            except NotFound:  # the client never named the default model: say both names
                raise NotFound(f"model: {name!r} goes to the default model {default!r} (server.default_model), which no "
                               f"upstream lists; available models: {', '.join(self.names()) or 'none'}") from None  # fmt: skip
            except UpstreamError as error:
                raise UpstreamError(f"model: {name!r} goes to the default model {default!r} (server.default_model), "
                                    f"but {error.message.removeprefix('model: ')}") from None  # fmt: skip
        if len(self.discovering) == 1 and not self.discovered.get(self.discovering[0]):
            # The upstream's list is not known (it was down, or it has none): let the upstream judge the name.
            return self._route_upstream_model(self.discovering[0], name, listed=False)
        unlisted = [u for u in self.discovering if u not in self.discovered and u not in self._listless]
        if unlisted:  # the name may be one of theirs: a 502 the client retries, not a final 404
            raise UpstreamError(f"model: {name!r} is not among the models known here, and the model list of upstream "
                                f"{', '.join(unlisted)} could not be read yet (is it down?)")  # fmt: skip
        listless = [u for u in self.discovering if u in self._listless]
        if len(listless) == 1:  # every list is in and none has it: the one upstream without a list judges it
            return self._route_upstream_model(listless[0], name, listed=False)
        available = ", ".join(self.names()) or "none"
        if listless:  # which of them could it be? Guessing would send a typo to a random server
            raise NotFound(f"model: {name!r} is not listed by any upstream, and upstreams {', '.join(listless)} have no "
                           f"model list: give their models [[models]] entries; available models: {available}")  # fmt: skip
        raise NotFound(f"model: {name!r} is not served here; available models: {available}. {SERVE_ANY_NAME}")

    @property
    def discovered(self) -> dict[str, list[UpstreamModel]]:
        return self._discovered

    def set_discovered(self, upstream: str, models: list[UpstreamModel]) -> None:
        self._discovered[upstream] = models
        self._listless.discard(upstream)
        self._routes.clear()  # windows and served names may have changed

    def answered(self, upstream: str) -> bool:
        """Whether the upstream's models are known: a list with models in it, or no list at all."""
        return bool(self._discovered.get(upstream)) or upstream in self._listless

    def set_listless(self, upstream: str) -> bool:
        """Note an upstream that answered without a model list; whether that is news."""
        self._discovered.pop(upstream, None)
        if upstream in self._listless:
            return False
        self._listless.add(upstream)
        self._routes.clear()  # a name may now go to it (or no longer be a 502)
        return True

    def shadowed(self) -> dict[str, tuple[str, list[str]]]:
        """Model ids that several upstreams without `[[models]]` list: {id: (the upstream that
        serves it, the others, which get none of its requests)}. The first in configuration
        order serves it (step 4 of name resolution); an operator should know the others lose."""
        holders: dict[str, list[str]] = {}
        for upstream in self.discovering:
            for entry in self.discovered.get(upstream, ()):
                listed = holders.setdefault(entry.id, [])
                if upstream not in listed:
                    listed.append(upstream)
        return {model: (listed[0], listed[1:]) for model, listed in holders.items() if len(listed) > 1}

    def default_unlisted(self) -> bool:
        """Whether `server.default_model` names a model no upstream lists (judged only once every
        list is in: it may be on the upstream not read yet). Every name it should catch is a 404."""
        default = self._config.server.default_model
        if (
            not default
            or self._configured(default) is not None
            or any(u not in self.discovered for u in self.discovering)
        ):
            return False
        return self._route_discovered(default) is None

    @property
    def registry(self) -> Registry:
        return self._registry

    @registry.setter
    def registry(self, registry: Registry) -> None:
        self._registry = registry
        self._routes.clear()

    def names(self) -> list[str]:
        names = [m.name for m in self._config.models]
        for model in self._config.models:
            names.extend(a for a in model.aliases if "*" not in a and "?" not in a)
        for pattern, _ in self._wildcards:
            names.extend(n for n in CLAUDE_MODEL_IDS if fnmatch.fnmatchcase(n, pattern))
        for upstream in self.discovering:
            names.extend(entry.id for entry in self.discovered.get(upstream, ()))
        return list(dict.fromkeys(names))
