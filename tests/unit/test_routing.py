"""What discovery makes of the upstreams' model lists: who serves a name two upstreams list,
and the warnings an operator gets about it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from dragoman.backends.base import UpstreamModel
from dragoman.config import from_dict
from dragoman.gateway import Gateway


class _Listing:
    """A backend that only answers its model list."""

    path = "translate"

    def __init__(self, name: str, *ids: str) -> None:
        self.name = name
        self.ids = list(ids)

    async def list_models(self) -> list[UpstreamModel]:
        return [UpstreamModel(id=i) for i in self.ids]

    async def close(self) -> None:
        pass


def _gateway(lists: dict[str, list[str]], server: dict[str, Any] | None = None) -> Gateway:
    upstreams = {name: {"url": f"http://127.0.0.1:{9 + i}/v1"} for i, name in enumerate(lists)}
    config = from_dict({"server": {"registry_cache": "", **(server or {})}, "upstreams": upstreams})
    backends: Any = {name: _Listing(name, *ids) for name, ids in lists.items()}
    return Gateway(config, backends)


def _discover_all(gateway: Gateway) -> None:
    asyncio.run(gateway.discover_all(gateway.backends))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dragoman" and r.levelno == logging.WARNING]


def test_a_model_two_upstreams_list_goes_to_the_first_and_discovery_says_so_once(caplog):
    gateway = _gateway({"a": ["shared", "only-a"], "b": ["only-b", "shared"], "c": ["shared"]})
    with caplog.at_level(logging.INFO, logger="dragoman"):
        _discover_all(gateway)
        assert gateway.router.resolve("shared").upstream == "a"  # the rule is unchanged: first in the file
        assert gateway.router.shadowed() == {"shared": ("a", ["b", "c"])}
        warnings = _warnings(caplog)
        assert len(warnings) == 1, warnings
        assert "'shared'" in warnings[0] and "a serves it" in warnings[0] and "never reach b, c" in warnings[0]

        _discover_all(gateway)  # a rediscovery (after a miss, say) finds the same: no new warning
        for _ in range(3):
            gateway.router.resolve("shared")
        assert len(_warnings(caplog)) == 1

        gateway.backends["b"].ids = ["only-b"]  # type: ignore[attr-defined]
        gateway.backends["c"].ids = ["only-c"]  # type: ignore[attr-defined]
        _discover_all(gateway)  # resolved (no warning for the states between two answers)...
        assert len(_warnings(caplog)) == 1
        gateway.backends["b"].ids = ["shared"]  # type: ignore[attr-defined]
        _discover_all(gateway)  # ...and back: said again
    assert len(_warnings(caplog)) == 2
    assert _warnings(caplog)[1].endswith("never reach b")


def test_distinct_lists_shadow_nothing(caplog):
    gateway = _gateway({"a": ["m1"], "b": ["m2"]})
    with caplog.at_level(logging.INFO, logger="dragoman"):
        _discover_all(gateway)
    assert gateway.router.shadowed() == {}
    assert _warnings(caplog) == []
