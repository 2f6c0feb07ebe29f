"""[[routes]] and fallbacks checked at start-up (when the gateway builds its route table):
every mistake is an error naming its key, never a rule silently skipped at run time
(claude-code-router v3's)."""

from __future__ import annotations

from typing import Any

import pytest

from dragoman.calls.types import Route
from dragoman.core.config import ConfigError
from dragoman.core.config_load import from_dict
from dragoman.routes.table import Routes

MODELS = [
    {"name": "main", "upstream": "a", "context_window": 100_000, "aliases": ["claude-*", "big"]},
    {"name": "small", "upstream": "a", "context_window": 8_000},
    {"name": "vl", "upstream": "a", "vision": True, "context_window": 32_000},
]


def load(routes: list[dict[str, Any]] | None = None, models: list[dict[str, Any]] | None = None, **more: Any):
    config = from_dict({"upstreams": {"a": {"url": "http://127.0.0.1:9/v1"}}, "models": models or MODELS,
                        "routes": routes or [], **more})  # fmt: skip
    Routes.build(config, _unused)
    return config


async def _unused(name: str) -> Route:
    raise AssertionError("nothing is resolved while the table is built")


def problem(**kw: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load(**kw)
    return str(caught.value)


def test_a_route_to_an_unknown_model_is_a_startup_error_naming_the_key():
    said = problem(routes=[{"name": "x", "model": "main"}, {"name": "side", "when": {"tools": 0}, "model": "tiny"}])
    assert said == "routes.1.model: 'tiny' is not a configured model (known: main, small, vl)"


def test_a_vision_route_to_a_text_model_is_a_startup_error():
    said = problem(routes=[{"name": "vision", "when": {"images": True}, "model": "small"}])
    assert said.startswith("routes.0.model: the route takes requests with images, but model 'small' has no vision")
    either = problem(routes=[{"name": "v", "when": {"any": [{"tools": 0}, {"images": True}]}, "model": "small"}])
    assert either.startswith("routes.0.model: the route takes requests with images")
    load(routes=[{"name": "vision", "when": {"images": True}, "model": "vl"}])  # one with vision is fine


def test_a_long_context_route_to_a_model_without_the_window_is_a_startup_error():
    said = problem(routes=[{"name": "long", "when": {"input_tokens": {"gt": 60_000}}, "model": "vl"}])
    assert said.startswith("routes.0.model: the route takes prompts of more than 60000 tokens, but model 'vl' has a "
                           "context window of 32000")  # fmt: skip
    load(routes=[{"name": "long", "when": {"input_tokens": {"gt": 60_000}}, "model": "main"}])


@pytest.mark.parametrize(
    ("when", "said"),
    [
        ({"thinking": True}, "routes.0.when.thinking: expected { effort = [...] }"),
        ({"tools": "none"}, "routes.0.when.tools: expected a number or a comparison table"),
        ({"input_tokens": 5}, "routes.0.when.input_tokens: expected a comparison"),
        ({"input_tokens": {"over": 5}}, "routes.0.when.input_tokens.over: unknown comparison"),
        ({"model": 3}, "routes.0.when.model: expected a glob"),
        ({"images": "yes"}, "routes.0.when.images: expected true or false"),
        ({"colour": "red"}, "routes.0.when.colour: unknown condition"),
        ({"any": [{"tools": 0}, {"stream": 1}]}, "routes.0.when.any.1.stream: expected true or false"),
        ({"body": {"a": {"in": 3}}}, "routes.0.when.body.a.in: expected a list of values"),
    ],
)
def test_a_condition_that_cannot_hold_is_named(when, said):
    assert problem(routes=[{"name": "r", "when": when, "model": "main"}]).startswith(said)


def test_a_bad_condition_and_an_unknown_model_are_both_said():
    said = problem(routes=[{"name": "x", "when": {"colour": "red"}, "model": "nope"}])
    assert "routes.0.when.colour: unknown condition" in said and "routes.0.model: 'nope' is not a configured" in said


def test_actions_names_and_fallbacks_are_checked():
    assert problem(routes=[{"name": "r"}]).startswith("routes.0: give exactly one action")
    assert problem(routes=[{"name": "r", "model": "main", "respond": "count"}]).startswith("routes.0: give exactly one")
    twice = problem(routes=[{"name": "r", "model": "main"}, {"name": "r", "model": "small"}])
    assert twice == "routes.1.name: 'r' is the name of an earlier route too"
    models = [{**MODELS[0], "fallbacks": ["small", "nope"], "context_fallbacks": ["main"]}, *MODELS[1:]]
    said = problem(models=models)
    assert "models.0.fallbacks.1: 'nope' is not a configured model" in said
    assert "models.0.context_fallbacks.0: 'main' is the model itself" in said
    assert problem(fallbacks={"max_attempts": 0}) == "fallbacks.max_attempts: must be at least 1, got 0"


def test_routes_may_target_an_exact_alias():
    config = load(routes=[{"name": "r", "when": {"stream": True}, "model": "big", "sticky": "session"}])
    assert config.routes[0].model == "big" and config.routes[0].sticky == "session"
