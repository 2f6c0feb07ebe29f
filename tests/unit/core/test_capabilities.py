"""Which models reason: configuration, then the models.dev registry, then name
families; the registry's parsing, cache and (unreachable) refresh; and the
ReasoningCaps the router builds per route."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dragoman.assembly.routing import Router
from dragoman.core import capabilities
from dragoman.core.capabilities import (
    Decision,
    Registry,
    decide,
    needs_refresh,
    refresh_registry,
    registry_path,
)
from dragoman.core.config_load import from_dict

# A small registry shaped like https://models.dev/api.json: providers -> models -> flags.
MODELS_DEV = {
    "openai": {
        "id": "openai",
        "models": {
            "gpt-4o": {"id": "gpt-4o", "reasoning": False},
            "o3-mini": {"id": "o3-mini", "reasoning": True},
        },
    },
    "deepinfra": {
        "id": "deepinfra",
        "models": {
            "Qwen/Qwen3-235B-A22B": {"id": "Qwen/Qwen3-235B-A22B", "reasoning": True},
            "meta-llama/Llama-3.3-70B-Instruct": {"id": "meta-llama/Llama-3.3-70B-Instruct", "reasoning": False},
            "deepseek-ai/DeepSeek-R1:latest": {"id": "x", "reasoning": True},
            # A model whose name looks like a reasoning family but which the registry says is not.
            "acme/qwen3-lite": {"reasoning": False},
            "no-flag-model": {"id": "no-flag-model"},
            "string-flag-model": {"reasoning": "yes"},
        },
    },
    "ollama": {"models": {"some-thinking-model:latest": {"reasoning": False}}},
    # Malformed entries are skipped, not fatal.
    "broken": "not a provider",
    "broken2": {"models": ["not", "a", "dict"]},
    "broken3": {"models": {"m": "not a dict"}},
}


@pytest.fixture
def registry() -> Registry:
    return Registry.from_json(MODELS_DEV)


# -- registry parsing ---------------------------------------------------------------------


def test_registry_keys_are_the_last_path_segment_lower_cased_without_latest(registry):
    assert registry.flags == {
        "gpt-4o": False,
        "o3-mini": True,
        "qwen3-235b-a22b": True,
        "llama-3.3-70b-instruct": False,
        "deepseek-r1": True,
        "qwen3-lite": False,
        "some-thinking-model": False,
    }


@pytest.mark.parametrize(
    ("name", "listed"),
    [
        ("o3-mini", True),
        ("O3-MINI", True),
        ("gpt-4o", False),
        ("Qwen/Qwen3-235B-A22B", True),
        ("qwen3-235b-a22b", True),
        ("other-org/Qwen3-235B-A22B", True),  # any namespace: keyed by the last segment
        ("deepseek-r1:latest", True),
        ("deepseek-r1", True),
        ("meta-llama/Llama-3.3-70B-Instruct", False),
        ("no-flag-model", None),  # no boolean flag: not listed
        ("string-flag-model", None),
        ("unknown-model", None),
    ],
)
def test_registry_lookup(registry, name, listed):
    assert registry.lookup(name) is listed


def test_registry_first_provider_wins_for_a_shared_id():
    data = {"a": {"models": {"org/Shared": {"reasoning": True}}}, "b": {"models": {"shared": {"reasoning": False}}}}
    assert Registry.from_json(data).lookup("shared") is True


@pytest.mark.parametrize("data", [None, [], "text", 42, {}, {"p": None}, {"p": {"models": None}}])
def test_registry_from_unexpected_json_is_empty(data):
    assert Registry.from_json(data).flags == {}


def test_registry_load_round_trips_a_cache_file(tmp_path):
    path = tmp_path / "models.dev.json"
    path.write_text(json.dumps(MODELS_DEV))
    assert Registry.load(path).lookup("Qwen/Qwen3-235B-A22B") is True


@pytest.mark.parametrize(
    "content",
    [
        None,
        b"",
        b"{not json",
        b"\xff\xfe\x00garbage",
        b"[1, 2, 3]",
        b'"a string"',
        b'{"p": {"models": {"m": {"reasoning": tr',
    ],
    ids=["missing", "empty", "not-json", "not-utf8", "list", "string", "truncated"],
)
def test_registry_load_of_a_missing_or_corrupt_file_is_empty(tmp_path, content):
    path = tmp_path / "models.dev.json"
    if content is not None:
        path.write_bytes(content)
    registry = Registry.load(path)
    assert registry.flags == {}
    assert registry.lookup("o3-mini") is None


def test_registry_load_of_a_directory_is_empty(tmp_path):
    assert Registry.load(tmp_path).flags == {}


# -- name families ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reasoning"),
    [
        ("gpt-oss-20b", True),
        ("openai/gpt-oss-120b", True),
        ("gpt-oss:20b", True),
        ("o1", True),
        ("o3-mini", True),
        ("o4-mini", True),
        ("gpt-5", True),
        ("gpt-5-mini", True),
        ("deepseek-r1-distill-qwen-7b", True),
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", True),
        ("deepseek-reasoner", True),
        ("qwq-32b", True),
        ("Qwen/QwQ-32B", True),
        ("Qwen/Qwen3-8B", True),
        ("qwen3:8b", True),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", False),  # the -Instruct releases do not think
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", False),
        ("Qwen/Qwen3-VL-8B-Thinking", True),
        ("qwen3-30b-a3b", True),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", False),  # the non-thinking 2507 refresh
        ("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", False),
        ("Qwen/Qwen3-30B-A3B-Thinking-2507", True),
        ("some-model-thinking", True),
        ("ERNIE-4.5-Thinking", True),
        ("llama-3.1-8b", False),
        ("meta-llama/Llama-3.1-8B-Instruct", False),
        ("smollm2", False),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", False),
        ("gpt-4o", False),
        ("qwen2.5-7b-instruct", False),
        ("mistral-7b", False),
        ("test-model", False),
        ("foo3-mini", False),  # `o3` only as the name's start
    ],
)
def test_name_families(name, reasoning):
    decision = decide(name, None, Registry())
    assert decision.reasoning is reasoning, decision
    if reasoning:
        assert decision == Decision(True, "name matches a known reasoning family")
    else:
        assert decision == Decision(False, "unknown model: not reasoning")


# -- decision order ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "configured", "expected"),
    [
        # configuration wins over the registry and the name
        ("o3-mini", False, Decision(False, "set in the configuration")),
        ("gpt-4o", True, Decision(True, "set in the configuration")),
        ("llama-3.1-8b", True, Decision(True, "set in the configuration")),
        ("Qwen/Qwen3-8B", False, Decision(False, "set in the configuration")),
        # the registry wins over the name
        ("acme/qwen3-lite", None, Decision(False, "listed in the models.dev registry")),
        ("some-thinking-model:latest", None, Decision(False, "listed in the models.dev registry")),
        ("gpt-4o", None, Decision(False, "listed in the models.dev registry")),
        ("Qwen/Qwen3-235B-A22B", None, Decision(True, "listed in the models.dev registry")),
        # names only when neither says
        ("Qwen/Qwen3-8B", None, Decision(True, "name matches a known reasoning family")),
        ("llama-3.1-8b", None, Decision(False, "unknown model: not reasoning")),
    ],
)
def test_decision_order(registry, model, configured, expected):
    assert decide(model, configured, registry) == expected


def test_registry_can_make_an_unknown_name_reasoning():
    registry = Registry.from_json({"p": {"models": {"house-model-7b": {"reasoning": True}}}})
    assert decide("house-model-7b", None, registry) == Decision(True, "listed in the models.dev registry")
    assert decide("house-model-7b", None, Registry()).reasoning is False


# -- cache location and refresh -----------------------------------------------------------


def test_registry_path_honours_the_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAGOMAN_CACHE_DIR", str(tmp_path))
    assert registry_path() == tmp_path / "models.dev.json"
    monkeypatch.delenv("DRAGOMAN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert registry_path() == tmp_path / "xdg" / "dragoman" / "models.dev.json"


def test_needs_refresh(tmp_path):
    path = tmp_path / "models.dev.json"
    assert needs_refresh(path)  # missing
    path.write_text("{}")
    assert not needs_refresh(path)
    old = time.time() - capabilities.REFRESH_AFTER - 60
    os.utime(path, (old, old))
    assert needs_refresh(path)


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _silent_listener() -> socket.socket:
    """A loopback socket that accepts connections (kernel backlog) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener


@pytest.mark.parametrize(
    "existing", [None, "{}", json.dumps(MODELS_DEV)], ids=["no-cache", "empty-cache", "full-cache"]
)
def test_refresh_with_the_network_unreachable_returns_none_and_leaves_the_cache(monkeypatch, tmp_path, existing):
    url = f"http://127.0.0.1:{_closed_port()}/api.json"
    path = tmp_path / "cache" / "models.dev.json"
    if existing is not None:
        path.parent.mkdir()
        path.write_text(existing)
        old = time.time() - 10 * capabilities.REFRESH_AFTER
        os.utime(path, (old, old))
        before = path.stat().st_mtime
    result = asyncio.run(
        asyncio.wait_for(refresh_registry(path, timeout=60, url=url), 10)
    )  # refused at once: no wait for the timeout
    assert result is None
    if existing is None:
        assert not path.exists() and not path.with_suffix(".tmp").exists()
    else:
        assert path.read_text() == existing and path.stat().st_mtime == before
        assert not path.with_suffix(".tmp").exists()


def test_an_unreachable_registry_is_a_debug_line_not_an_info_one(monkeypatch, tmp_path, caplog):
    """Every start without internet finds models.dev out of reach: no news, so nothing at info."""
    url = f"http://127.0.0.1:{_closed_port()}/api.json"
    with caplog.at_level(logging.DEBUG, logger="dragoman.registry"):
        assert asyncio.run(asyncio.wait_for(refresh_registry(tmp_path / "models.dev.json", url=url), 10)) is None
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "dragoman.registry"]
    assert [level for level, _ in said] == [logging.DEBUG], said
    assert "models.dev registry not reached" in said[0][1]


def test_refresh_against_a_silent_server_gives_up_within_its_timeout(monkeypatch, tmp_path):
    listener = _silent_listener()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/api.json"
        path = tmp_path / "models.dev.json"
        assert (
            asyncio.run(asyncio.wait_for(refresh_registry(path, timeout=0.3, url=url), 10)) is None
        )  # None: its own timeout, not wait_for's
        assert not path.exists()
    finally:
        listener.close()


class _Registry:
    """A stdlib HTTP server on loopback standing in for models.dev: answers every GET
    with `status` and `body`, and counts the requests."""

    def __init__(self, body: bytes, status: int = 200) -> None:
        outer = self
        self.body, self.status, self.hits = body, status, 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.hits += 1
                self.send_response(outer.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/api.json"

    def __enter__(self) -> _Registry:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_refresh_from_a_reachable_registry_writes_the_cache(monkeypatch, tmp_path):
    path = tmp_path / "sub" / "models.dev.json"
    with _Registry(json.dumps(MODELS_DEV).encode()) as server:
        registry = asyncio.run(refresh_registry(path, timeout=2.0, url=server.url))
    assert server.hits == 1
    assert registry is not None and registry.lookup("Qwen/Qwen3-235B-A22B") is True
    assert json.loads(path.read_text()) == MODELS_DEV
    assert not path.with_suffix(".tmp").exists()
    assert not needs_refresh(path)
    assert Registry.load(path).flags == registry.flags


@pytest.mark.parametrize(
    ("status", "body"),
    [(500, b'{"error": "down"}'), (404, b"not found"), (200, b"{truncated"), (200, b"<html>captive portal</html>")],
    ids=["500", "404", "bad-json", "html"],
)
def test_refresh_that_gets_an_error_or_garbage_leaves_the_cache(monkeypatch, tmp_path, status, body):
    path = tmp_path / "models.dev.json"
    path.write_text(json.dumps(MODELS_DEV))
    with _Registry(body, status) as server:
        assert asyncio.run(refresh_registry(path, timeout=2.0, url=server.url)) is None
    assert server.hits == 1
    assert json.loads(path.read_text()) == MODELS_DEV
    assert not path.with_suffix(".tmp").exists()


# -- ReasoningCaps per route ----------------------------------------------------------------


def _router(models: list[dict], server: dict | None = None, registry: Registry | None = None) -> Router:
    config = from_dict({"server": server or {}, "upstreams": {"u": {"url": "http://127.0.0.1:1/v1"}}, "models": models})
    return Router(config, {"u": object()}, registry)  # type: ignore[dict-item]


def test_route_caps_come_from_the_model_config():
    router = _router(
        [
            {"name": "r", "upstream": "u", "upstream_model": "llama-3.1-8b", "reasoning": True, "reasoning_efforts": ["low", "high"],
             "thinking_off": "lowest_effort", "reasoning_replay": True},
            {"name": "plain", "upstream": "u", "upstream_model": "Qwen/Qwen3-8B", "reasoning": False},
        ],
        server={"effort_budgets": [1000, 3000]},
    )  # fmt: skip
    caps = router.resolve("r").caps
    assert caps.reasoning_replay is True
    r = caps.reasoning
    assert (r.reasoning, r.efforts, r.thinking_off, r.strict) == (True, ("low", "high"), "lowest_effort", False)
    assert (r.low_max_budget, r.medium_max_budget) == (1000, 3000)
    assert router.resolve("plain").caps.reasoning.reasoning is False


def test_route_caps_decide_by_registry_then_name_when_the_config_is_silent():
    registry = Registry.from_json(
        {"p": {"models": {"llama-3.1-8b": {"reasoning": True}, "qwen3-8b": {"reasoning": False}}}}
    )
    router = _router(
        [
            {"name": "a", "upstream": "u", "upstream_model": "llama-3.1-8b"},
            {"name": "b", "upstream": "u", "upstream_model": "Qwen/Qwen3-8B"},
            {"name": "c", "upstream": "u", "upstream_model": "gpt-oss-20b"},
            {"name": "d", "upstream": "u", "upstream_model": "smollm2"},
        ],
        registry=registry,
    )
    assert [router.resolve(n).caps.reasoning.reasoning for n in "abcd"] == [True, False, True, False]


@pytest.mark.parametrize(
    ("server_strict", "model_strict", "expected"),
    [(False, None, False), (True, None, True), (True, False, False), (False, True, True)],
)
def test_strict_thinking_per_model_overrides_the_server(server_strict, model_strict, expected):
    model = {"name": "m", "upstream": "u", "upstream_model": "llama-3.1-8b"}
    if model_strict is not None:
        model["strict_thinking"] = model_strict
    router = _router([model], server={"strict_thinking": server_strict})
    assert router.resolve("m").caps.reasoning.strict is expected
