"""The `[[routes]]` and `[fallbacks]` configuration (docs/routing.md).

A leaf like `limit_settings`: `core.config` embeds these structs. What a route's `when`
means, and the checks that need it (every condition, every target), are `dragoman.routes`',
run when the gateway is built at start-up (`routes.settings.check`).
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct


class RouteConfig(Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """One route: when its conditions hold (all of them; `any = [...]` for or), its action."""

    name: str
    when: dict[str, Any] = {}
    model: str | None = None  # a served name: a [[models]] name or one of its exact aliases
    respond: Literal["count"] | None = None  # answer a count probe here, with no upstream call
    sticky: Literal["session"] | None = None  # a session that took this route keeps it


class FallbackSettings(Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """How fallbacks between models are bounded (docs/routing.md, Fallbacks)."""

    max_attempts: int = 3  # models tried for one request, the first included
    cooldown_failures: int = 3  # failures of a model within cooldown_window that cool it down
    cooldown_window: float = 60.0  # seconds
    cooldown: float = 30.0  # seconds a cooled model is passed over as a target
