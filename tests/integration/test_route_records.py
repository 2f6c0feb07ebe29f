"""Where a request's route and the model that finally served it are recorded: the access
log, the usage record (SQLite), and the trace (the route on the request's span, each model's
attempt a sibling span under it)."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

from tests.support.fakes import FakeUpstream, Reply
from tests.support.model_fleet import USER, fleet_config, sdk
from tests.support.otlp import OtlpReceiver
from tests.support.waiting import eventually

CLIENT, SERVER = 3, 2  # SpanKind values in OTLP
SIDE = {"name": "side", "when": {"model": "claude-haiku-*"}, "model": "main"}


def failing(a: FakeUpstream) -> None:
    a.queue(Reply(status=503, body={"error": {"message": "busy", "code": 503}}))


def test_the_access_log_and_usage_record_name_the_route_and_the_model_that_served(fakes, gateway_from, tmp_path,
                                                                                   caplog):  # fmt: skip
    a, b = fakes
    config = fleet_config(a, b, routes=[SIDE], main={"fallbacks": ["backup"]})
    config["usage"] = {"dir": str(tmp_path), "flush_interval": 0.05}
    failing(a)
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        message = sdk(gateway_from(config)).messages.create(model="claude-haiku-4-5", max_tokens=20, messages=USER)
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"][-1]
    assert (logged["route"], logged["served_model"], logged["upstream"]) == ("side", "backup-b", "b")
    assert message.model == "claude-haiku-4-5"
    rows = _rows(tmp_path / "usage.sqlite3")
    assert rows == [("claude-haiku-4-5", "backup-b", "b", "side")]


def _rows(path: Path) -> list[tuple[str, ...]]:
    def rows() -> list[tuple[str, ...]]:
        if not path.exists():
            return []
        with sqlite3.connect(path) as db:
            try:
                return db.execute("SELECT model, upstream_model, upstream, route FROM usage_records").fetchall()
            except sqlite3.OperationalError:  # the table is being made
                return []

    return eventually(rows, "the usage record written", timeout=10)


def test_the_span_names_the_route_and_each_model_tried_is_a_sibling_attempt(fakes, gateway_from):
    a, b = fakes
    receiver = OtlpReceiver().start()
    try:
        config = fleet_config(a, b, routes=[SIDE], main={"fallbacks": ["backup"]})
        config["tracing"] = {"enabled": True, "endpoint": receiver.url, "metrics": False}
        failing(a)
        gateway = gateway_from(config)
        sdk(gateway).messages.create(model="claude-haiku-4-5", max_tokens=20, messages=USER)
        gateway.stop()
        spans = receiver.spans()
    finally:
        receiver.stop()
    server = [span for span in spans if span.kind == SERVER]
    assert len(server) == 1 and server[0].attributes["dragoman.route"] == "side"
    attempts = [span for span in spans if span.kind == CLIENT]
    assert len(attempts) == 2 and all(span.parent_span_id == server[0].span_id for span in attempts)
    assert [request["model"] for request in a.requests + b.requests] == ["main-a", "backup-b"]
