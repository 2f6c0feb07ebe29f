"""The start-up checks of `[[routes]]` and the models' fallbacks (the structs are
`core.route_settings`'). A route's `when` table is compiled here (`conditions.compile_when`),
so a mistake in it is a start-up error naming its key, never a rule silently skipped.
`routes.table.Routes.build` runs them when the gateway is built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dragoman.core.route_settings import FallbackSettings, RouteConfig
from dragoman.routes.conditions import ConditionError, compile_when


def served_names(models: Sequence[Any]) -> dict[str, Any]:
    """Each name a route may target (a model's name, or an exact alias), to its model."""
    names: dict[str, Any] = {}
    for model in models:
        names.setdefault(model.name, model)
        for alias in model.aliases:
            if "*" not in alias and "?" not in alias:
                names.setdefault(alias, model)
    return names


def check(
    routes: Sequence[RouteConfig], models: Sequence[Any], fallbacks: FallbackSettings, problems: list[str]
) -> None:
    """Append what is wrong with the routes and the models' fallbacks to `problems`, each as `key: why`."""
    names = served_names(models)
    known = ", ".join(m.name for m in models) or "none configured"
    seen: set[str] = set()
    for index, route in enumerate(routes):
        where = f"routes.{index}"
        if route.name in seen:
            problems.append(f"{where}.name: {route.name!r} is the name of an earlier route too")
        seen.add(route.name)
        if (route.model is None) == (route.respond is None):
            problems.append(f'{where}: give exactly one action, model = "<served name>" or respond = "count"')
        try:
            compiled = compile_when(route.when, f"{where}.when")
        except ConditionError as error:
            problems.append(str(error))
            compiled = compile_when({}, where)  # the target is still checked
        if route.model is None:
            continue
        target = names.get(route.model)
        if target is None:
            problems.append(f"{where}.model: {route.model!r} is not a configured model (known: {known})")
            continue
        if compiled.images and target.vision is not True:
            problems.append(f"{where}.model: the route takes requests with images, but model {route.model!r} has no "
                            "vision (set vision = true on it, or route images elsewhere)")  # fmt: skip
        if compiled.threshold is not None and (target.context_window or 0) <= compiled.threshold:
            window = target.context_window
            problems.append(f"{where}.model: the route takes prompts of more than {compiled.threshold} tokens, but "
                            f"model {route.model!r} has a context window of {window if window else 'unknown size'} "
                            "(set its context_window, or route them to a larger model)")  # fmt: skip
    _check_fallbacks(models, names, known, problems)
    for key in ("max_attempts", "cooldown_failures"):
        if getattr(fallbacks, key) < 1:
            problems.append(f"fallbacks.{key}: must be at least 1, got {getattr(fallbacks, key)}")
    for key in ("cooldown_window", "cooldown"):
        if getattr(fallbacks, key) < 0:
            problems.append(f"fallbacks.{key}: must not be negative, got {getattr(fallbacks, key)}")


def _check_fallbacks(models: Sequence[Any], names: dict[str, Any], known: str, problems: list[str]) -> None:
    for index, model in enumerate(models):
        for key in ("fallbacks", "context_fallbacks"):
            for at, name in enumerate(getattr(model, key)):
                target = names.get(name)
                if target is None:
                    problems.append(f"models.{index}.{key}.{at}: {name!r} is not a configured model (known: {known})")
                elif target is model:
                    problems.append(f"models.{index}.{key}.{at}: {name!r} is the model itself")
                elif key == "context_fallbacks" and not target.context_window:
                    problems.append(f"models.{index}.{key}.{at}: model {name!r} has no context_window: a context "
                                    "fallback must say how much it holds")  # fmt: skip
