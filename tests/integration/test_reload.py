"""`dragoman serve` as a process: SIGHUP swaps a new configuration in without closing the port;
SIGTERM exits 0 once drained; budgets outlive a restart without Redis."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import anthropic
import pytest
from click.testing import CliRunner

from dragoman.cli import main
from tests.support.fakes import FakeUpstream, chunk, completion, usage_chunk
from tests.support.serve_process import Prober, Stderr, _start
from tests.support.waiting import eventually

USER: Any = [{"role": "user", "content": "Hi"}]
SWAPPED = "the new configuration serves new requests"


def _client(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


def _answers(url: str, key: str) -> int:
    """The status a key's request gets."""
    try:
        _client(url, key).messages.create(model="test-model", max_tokens=5, messages=USER)
    except anthropic.APIStatusError as error:
        return error.status_code
    return 200


def _stream_in_thread(url: str, key: str, events: list[Any]) -> threading.Thread:
    def read() -> None:
        with _client(url, key).messages.stream(model="test-model", max_tokens=20, messages=USER) as stream:
            for event in stream:
                events.append(event)

    reader = threading.Thread(target=read)
    reader.start()
    return reader


def _text(events: list[Any]) -> str:
    return "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")


def test_sighup_adds_a_key_while_a_stream_finishes_and_the_port_keeps_accepting(
    upstream: FakeUpstream, stop_later: Any, tmp_path: Path
) -> None:
    config = tmp_path / "dragoman.toml"
    config.write_text('[server]\napi_keys = ["key-a"]\n')
    go_on = threading.Event()
    upstream.stream_reply([chunk({"role": "assistant", "content": ""}), chunk({"content": "one "}), ("wait", go_on),
                           chunk({"content": "two"}), chunk({}, "stop"), usage_chunk(5, 2)])  # fmt: skip
    process, url = _start(upstream.url, "--config", str(config))
    stop_later(process)
    log = Stderr(process)
    events: list[Any] = []
    reader = _stream_in_thread(url, "key-a", events)
    eventually(lambda: "one" in _text(events), "the stream under way", timeout=10)
    assert _text(events) == "one "
    assert _answers(url, "key-b") == 401
    with Prober(int(url.rsplit(":", 1)[1])) as probe:
        config.write_text('[server]\napi_keys = ["key-a", "key-b"]\n')
        process.send_signal(signal.SIGHUP)
        log.wait_for(SWAPPED)
        assert _answers(url, "key-b") == 200  # the new key works, while the stream still waits
        assert reader.is_alive() and _text(events) == "one "
        go_on.set()
        reader.join(10)
    assert _text(events) == "one two" and events[-1].type == "message_stop"  # finished on the old gateway
    assert probe.refused == [] and probe.accepted > 0
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0, "".join(log.lines)
    assert not log.having("Traceback"), "".join(log.lines)
    # The old gateway was closed only after the stream: its usage writer recorded it.
    usage = json.loads(CliRunner().invoke(main, ["usage", "--json", "--since", "1h"]).stdout)
    assert (usage["total"]["requests"], usage["total"]["output_tokens"], usage["refused_requests"]) == (2, 2 + 5, 1)


def test_a_configuration_refused_on_sighup_leaves_the_old_one_serving(
    upstream: FakeUpstream, stop_later: Any, tmp_path: Path
) -> None:
    config = tmp_path / "dragoman.toml"
    config.write_text('[server]\napi_keys = ["key-a"]\n')
    process, url = _start(upstream.url, "--config", str(config))
    stop_later(process)
    log = Stderr(process)
    config.write_text('[server]\napi_keys = ["key-b"]\nshutdown_grace = "soon"\n')
    process.send_signal(signal.SIGHUP)
    (refused,) = log.wait_for("the new configuration is refused")
    assert "shutdown_grace" in refused and " ERROR " in refused
    assert _answers(url, "key-a") == 200 and _answers(url, "key-b") == 401
    config.write_text('[server]\napi_keys = ["key-b"]\n')  # fixed: the next SIGHUP takes it
    process.send_signal(signal.SIGHUP)
    log.wait_for(SWAPPED)
    assert _answers(url, "key-b") == 200 and _answers(url, "key-a") == 401
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0, "".join(log.lines)


@pytest.mark.parametrize("window", ["tokens_per_day", "tokens_per_month"])
def test_a_spent_budget_stays_spent_after_a_restart_without_redis(
    upstream: FakeUpstream, stop_later: Any, tmp_path: Path, window: str
) -> None:
    config = tmp_path / "dragoman.toml"
    config.write_text(f'[server]\napi_keys = ["key-a", "key-b"]\n\n[limits]\n{window} = 20\n')
    process, url = _start(upstream.url, "--config", str(config))
    stop_later(process)
    upstream.json_reply(completion("x", prompt=10, completion_tokens=15))  # 25 tokens: past the budget of 20
    assert _answers(url, "key-a") == 200
    assert _answers(url, "key-a") == 429
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
    process, url = _start(upstream.url, "--config", str(config))
    stop_later(process)
    assert _answers(url, "key-a") == 429  # still spent
    assert _answers(url, "key-b") == 200  # another key's budget is its own


def test_a_reload_keeps_what_the_limits_counted(upstream: FakeUpstream, stop_later: Any, tmp_path: Path) -> None:
    config = tmp_path / "dragoman.toml"
    limits = "\n[limits]\nrequests_per_minute = 1\n"  # a minute to refill: longer than the test
    config.write_text('[server]\napi_keys = ["key-a"]\n' + limits)
    process, url = _start(upstream.url, "--config", str(config))
    stop_later(process)
    log = Stderr(process)
    assert _answers(url, "key-a") == 200
    config.write_text('[server]\napi_keys = ["key-a", "key-b"]\n' + limits)
    process.send_signal(signal.SIGHUP)
    log.wait_for(SWAPPED)
    assert _answers(url, "key-a") == 429  # its bucket handed over, still empty
    assert _answers(url, "key-b") == 200
