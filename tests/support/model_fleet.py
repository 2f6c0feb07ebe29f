"""Two scripted OpenAI upstreams and a native one behind one gateway, with several models
on them, for the route and fallback tests: which fake got a request (and under which
upstream name) says which model served it."""

from __future__ import annotations

from typing import Any

import anthropic

from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fakes import FakeUpstream, Reply
from tests.support.servers import GatewayServer

USER = [{"role": "user", "content": "Hello there"}]


def fleet_config(a: FakeUpstream, b: FakeUpstream, *, routes: list[dict[str, Any]] | None = None,
                 native: FakeAnthropic | None = None, main: dict[str, Any] | None = None,
                 fallbacks: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """`main` (aliases claude-*) on `a`; `small`, `long`, `vl` and `backup` on `b` under their
    own upstream names; `native-main` on the native fake when given. No retries: a failure is final."""
    upstreams: dict[str, Any] = {
        "a": {"url": a.url, "flavor": "vllm", "max_retries": 0},
        "b": {"url": b.url, "flavor": "vllm", "max_retries": 0},
    }
    models: list[dict[str, Any]] = [
        {"name": "main", "upstream": "a", "upstream_model": "main-a", "context_window": 100_000,
         "aliases": ["claude-*"], **(main or {})},
        {"name": "small", "upstream": "b", "upstream_model": "small-b", "context_window": 8_000},
        {"name": "long", "upstream": "b", "upstream_model": "long-b", "context_window": 1_000_000},
        {"name": "vl", "upstream": "b", "upstream_model": "vl-b", "context_window": 100_000, "vision": True},
        {"name": "backup", "upstream": "b", "upstream_model": "backup-b", "context_window": 100_000},
    ]  # fmt: skip
    if native is not None:
        upstreams["native"] = {"url": native.url + "/v1", "protocol": "anthropic", "max_retries": 0}
        models.append({"name": "native-main", "upstream": "native", "upstream_model": "native-model",
                       "context_window": 100_000, "fallbacks": ["backup"]})  # fmt: skip
    config: dict[str, Any] = {"upstreams": upstreams, "models": models, "routes": routes or []}
    if fallbacks is not None:
        config["fallbacks"] = fallbacks
    return config


def served(fake: FakeUpstream) -> list[str]:
    """The upstream model names `fake` was asked for, in order."""
    return [request["model"] for request in fake.requests]


def sdk(server: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="test-key", max_retries=0)


def model_in(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The `[[models]]` entry `name` of a fleet config, to change one setting of it."""
    return next(m for m in config["models"] if m["name"] == name)


def upstream_error(status: int, message: str = "boom", **headers: str) -> Reply:
    """An OpenAI-style error answer; `retry_after="0"` lets a retrying upstream try again at once."""
    sent = {name.replace("_", "-"): value for name, value in headers.items()}
    return Reply(status=status, body={"error": {"message": message, "type": "server_error", "code": status}},
                 headers=sent)  # fmt: skip
