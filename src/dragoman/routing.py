"""Model name -> Route: which backend serves it, under which upstream id, with what
capabilities. The one capability lookup of the gateway.

Order: a configured name, a configured alias (exact, then `*` wildcards), a model
the upstream itself lists (for upstreams without configured models), then the
default model. Anything else is a 404 that lists what is served.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from dragoman.backends.base import Backend, UpstreamModel
from dragoman.config import Config, ModelConfig
from dragoman.errors import NotFound
from dragoman.translate.request import ModelCaps


@dataclass(frozen=True, slots=True)
class Route:
    backend: Backend
    upstream: str
    upstream_model: str
    caps: ModelCaps
    context_window: int | None = None


class Router:
    def __init__(self, config: Config, backends: dict[str, Backend]) -> None:
        self._config = config
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
        configured = {m.upstream for m in config.models}
        self.discovering = [name for name in config.upstreams if name not in configured]
        self.discovered: dict[str, list[UpstreamModel]] = {}

    def _configured(self, name: str) -> ModelConfig | None:
        model = self._by_name.get(name)
        if model is None:
            for pattern, candidate in self._wildcards:
                if fnmatch.fnmatchcase(name, pattern):
                    return candidate
        return model

    def _route_configured(self, model: ModelConfig) -> Route:
        caps = ModelCaps(vision=model.vision, reasoning=bool(model.reasoning), max_output_tokens=model.max_output_tokens)
        return Route(self._backends[model.upstream], model.upstream, model.served_model, caps, model.context_window)

    def _route_discovered(self, name: str) -> Route | None:
        for upstream in self.discovering:
            for entry in self.discovered.get(upstream, ()):
                if entry.id == name:
                    return Route(self._backends[upstream], upstream, name, ModelCaps(), entry.context_window)
        return None

    def resolve(self, name: str) -> Route:
        model = self._configured(name)
        if model is not None:
            return self._route_configured(model)
        route = self._route_discovered(name)
        if route is not None:
            return route
        default = self._config.server.default_model
        if default and default != name:
            return self.resolve(default)
        if len(self.discovering) == 1 and not self.discovered.get(self.discovering[0]):
            # The upstream's list is not known (it was down): let the upstream judge the name.
            upstream = self.discovering[0]
            return Route(self._backends[upstream], upstream, name, ModelCaps())
        raise NotFound(f"model: {name!r} is not served here; available models: {', '.join(self.names()) or 'none'}")

    def names(self) -> list[str]:
        names = [m.name for m in self._config.models]
        for model in self._config.models:
            names.extend(a for a in model.aliases if "*" not in a and "?" not in a)
        for upstream in self.discovering:
            names.extend(entry.id for entry in self.discovered.get(upstream, ()))
        return list(dict.fromkeys(names))
