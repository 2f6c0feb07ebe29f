"""What discovery makes of the upstreams' model lists: who serves a name two upstreams list,
and the warnings an operator gets about it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from dragoman.assembly.gateway import Gateway
from dragoman.calls.types import NoModelList, UpstreamModel
from dragoman.core.config_load import from_dict
from dragoman.core.errors import NotFound, UpstreamError


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


# -- a default model no upstream lists ---------------------------------------------------------


def test_a_name_sent_to_an_unlisted_default_model_is_a_404_naming_both(caplog):
    gateway = _gateway({"a": ["listed"]}, server={"default_model": "qwen-missing"})
    with caplog.at_level(logging.INFO, logger="dragoman"):
        _discover_all(gateway)
        _discover_all(gateway)  # a rediscovery: not said again
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "'qwen-missing'" in warnings[0] and "server.default_model" in warnings[0], warnings

    with pytest.raises(NotFound) as caught:
        gateway.router.resolve("claude-sonnet-4-5")
    message = caught.value.message
    assert message.startswith("model: 'claude-sonnet-4-5' ") and "default model 'qwen-missing'" in message
    assert "no upstream lists" in message and "available models: listed" in message
    assert (caught.value.status, caught.value.type) == (404, "not_found_error")
    with pytest.raises(NotFound) as caught:  # the default model's own name: as before
        gateway.router.resolve("qwen-missing")
    assert caught.value.message.startswith("model: 'qwen-missing' is not served here")


def test_a_listed_default_model_is_not_warned_about(caplog):
    gateway = _gateway({"a": ["listed"], "b": ["qwen"]}, server={"default_model": "qwen"})
    with caplog.at_level(logging.INFO, logger="dragoman"):
        _discover_all(gateway)
    assert _warnings(caplog) == []
    assert gateway.router.resolve("claude-sonnet-4-5").upstream_model == "qwen"


def test_a_default_model_on_an_upstream_not_read_yet_is_a_502_naming_both(caplog):
    gateway = _gateway({"a": ["listed"], "b": ["qwen"]}, server={"default_model": "qwen"})
    asyncio.run(gateway.discover_all(["a"]))  # b was down: its list is unknown
    assert not gateway.router.default_unlisted()  # it may be on b: no warning yet
    with pytest.raises(UpstreamError) as caught:
        gateway.router.resolve("claude-sonnet-4-5")
    message = caught.value.message
    assert (
        message.startswith("model: 'claude-sonnet-4-5' ")
        and "default model 'qwen'" in message
        and "upstream b" in message
    )


# -- an upstream without a model list ----------------------------------------------------------


class _Listless(_Listing):
    """A backend whose server has no `GET /models` (it answers 404)."""

    asked = 0

    async def list_models(self) -> list[UpstreamModel]:
        self.asked += 1
        raise NoModelList(self.name, 404, "http://127.0.0.1:9/v1/models")


def _gateway_with_listless(lists: dict[str, list[str] | None], server: dict[str, Any] | None = None) -> Gateway:
    gateway = _gateway({name: ids or [] for name, ids in lists.items()}, server)
    for name, ids in lists.items():
        if ids is None:
            gateway.backends[name] = _Listless(name)  # type: ignore[assignment]
    return gateway


def test_a_name_no_list_has_goes_to_the_one_upstream_without_a_list(caplog):
    gateway = _gateway_with_listless({"a": ["m1"], "b": None})
    with caplog.at_level(logging.INFO, logger="dragoman"):
        _discover_all(gateway)
        _discover_all(gateway)  # it will answer the same every time: said once
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith(
        "upstream b has no model list (GET http://127.0.0.1:9/v1/models answered 404)"
    ), warnings
    assert gateway.router.resolve("m1").upstream == "a"
    route = gateway.router.resolve(
        "qwen3-typo"
    )  # b judges it: its 404 is the client's, not a 502 retried again and again
    assert (route.upstream, route.upstream_model, route.listed) == ("b", "qwen3-typo", False)


def test_with_several_upstreams_without_a_list_an_unknown_name_is_a_404_saying_what_to_configure():
    gateway = _gateway_with_listless({"a": ["m1"], "b": None, "c": None})
    _discover_all(gateway)
    with pytest.raises(NotFound) as caught:
        gateway.router.resolve("qwen3")
    message = caught.value.message
    assert message.startswith("model: 'qwen3' is not listed by any upstream, and upstreams b, c have no model list")
    assert "[[models]]" in message and "available models: m1" in message
    assert gateway.router.resolve("m1").upstream == "a"


def test_an_upstream_without_a_list_does_not_take_names_while_another_list_is_unread():
    gateway = _gateway_with_listless({"a": ["m1"], "b": None})
    asyncio.run(gateway.discover_all(["b"]))  # a was down: the name may be a's
    with pytest.raises(UpstreamError) as caught:
        gateway.router.resolve("m1")
    assert "upstream a could not be read yet" in caught.value.message
    asyncio.run(gateway.discover_all(["a"]))
    assert gateway.router.resolve("m1").upstream == "a"
    assert gateway.router.resolve("other").upstream == "b"


def test_an_upstream_that_gets_a_model_list_serves_what_it_lists_and_no_longer_every_name():
    gateway = _gateway_with_listless({"a": ["m1"], "b": None})
    _discover_all(gateway)
    assert gateway.router.resolve("m2").upstream == "b"
    gateway.backends["b"] = _Listing("b", "m2")  # type: ignore[assignment]  # restarted on a server that lists
    _discover_all(gateway)
    assert gateway.router.resolve("m2").upstream == "b"
    with pytest.raises(NotFound):
        gateway.router.resolve("m3")


def test_an_upstream_without_a_list_is_not_asked_again_and_again():
    """It will answer the same: only a miss asks it again (as it asks every upstream then)."""
    gateway = _gateway_with_listless({"a": ["m1"], "b": None})
    gateway.timings.rediscover_after = 0.0
    _discover_all(gateway)
    listless = gateway.backends["b"]
    assert listless.asked == 1  # type: ignore[attr-defined]

    async def requests() -> None:
        for name in ("m1", "other", "m1"):
            await gateway.route(name)
            await asyncio.sleep(0)  # a background rediscovery, if one was started, runs now
        await gateway.discover_if_stale()  # as GET /v1/models does

    asyncio.run(requests())
    assert listless.asked == 1  # type: ignore[attr-defined]
