"""Backends by upstream protocol. `build` is the one place that knows the kinds."""

from __future__ import annotations

from typing import assert_never

from dragoman.backends.anthropic.backend import AnthropicBackend
from dragoman.backends.auto import AutoBackend
from dragoman.backends.openai.backend import OpenAIBackend
from dragoman.backends.shared import Shared
from dragoman.calls.types import Backend
from dragoman.core.config import AnthropicUpstream, AutoUpstream, Config, OpenAIUpstream


def build(config: Config, shared: Shared) -> dict[str, Backend]:
    """A backend for each upstream, all sharing `shared` (the gateway's, closed by it)."""
    backends: dict[str, Backend] = {}
    for name, upstream in config.upstreams.items():
        match upstream:
            case OpenAIUpstream():
                backends[name] = OpenAIBackend(name, upstream, config, shared)
            case AnthropicUpstream():
                backends[name] = AnthropicBackend(name, upstream, config, shared)
            case AutoUpstream():
                backends[name] = AutoBackend(name, upstream, config, shared)
            case _:
                assert_never(upstream)
    return backends
