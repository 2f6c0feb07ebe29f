"""The core decodes a /v1/messages body whole (once) only when every upstream
translates; with a passthrough or a still-undecided `auto` upstream it decodes the
routing envelope, and the body is forwarded or decoded by the backend that serves it."""

from __future__ import annotations

from typing import Any

from dragoman.assembly.gateway import Gateway
from dragoman.core.config_load import from_dict


def gateway(upstreams: dict[str, Any]) -> Gateway:
    return Gateway(from_dict({"upstreams": upstreams}))


def test_only_translating_upstreams() -> None:
    assert gateway(
        {"a": {"url": "http://127.0.0.1:9/v1"}, "b": {"url": "http://127.0.0.1:8/v1", "protocol": "openai"}}
    ).translates_only


def test_a_passthrough_upstream_keeps_the_envelope() -> None:
    both = gateway({"a": {"url": "http://127.0.0.1:9/v1"}, "n": {"url": "http://127.0.0.1:8", "protocol": "anthropic"}})
    assert not both.translates_only


def test_an_auto_upstream_decides_once_probed() -> None:
    g = gateway({"x": {"url": "http://127.0.0.1:9", "protocol": "auto"}})
    assert not g.translates_only  # undecided: the envelope, and nothing cached
    auto = g.backends["x"]
    auto.chosen = auto._translate  # type: ignore[attr-defined]  # what a probe finding no /v1/messages does
    assert g.translates_only


def test_an_auto_upstream_probed_as_native_keeps_the_envelope() -> None:
    g = gateway({"x": {"url": "http://127.0.0.1:9", "protocol": "auto"}})
    auto = g.backends["x"]
    auto.chosen = auto._passthrough  # type: ignore[attr-defined]  # the probe found /v1/messages
    assert not g.translates_only
