"""No key is ever written anywhere: a run that makes, uses, refuses, changes and revokes
keys, and the greps of everything it left (logs at debug level, /metrics, the exported
traces, every answer the clients got, the database file itself)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.fakes import FakeUpstream
from tests.support.keys import ADMIN, admin, ask, create, keys_config, listing, retrieve, update
from tests.support.otlp import OtlpReceiver


def test_keys_appear_in_no_log_metric_trace_answer_or_file(
    upstream: FakeUpstream, gateway_from: Any, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    receiver = OtlpReceiver().start()
    usage_dir = tmp_path / "usage"
    server = gateway_from(keys_config(upstream.url, usage={"dir": str(usage_dir)}, server={"default_model": "test-model"},
                                      tracing={"enabled": True, "endpoint": receiver.url, "metrics_interval": 0.2}))  # fmt: skip
    url, seen = server.url, []
    made = create(url, name="alice", models=["test-*"], limits={"requests_per_minute": 1})
    secret = made["key"]
    seen += [str(retrieve(url, made["id"])), str(listing(url)), str(update(url, made["id"], name="alice2"))]
    ask(url, secret)
    for attempt in (lambda: ask(url, secret, model="other"), lambda: ask(url, secret), lambda: ask(url, secret),
                    lambda: ask(url, secret + "x"), lambda: ask(url, ADMIN),
                    lambda: admin(url, secret).get("/v1/organizations/api_keys", cast_to=object)):  # fmt: skip
        with pytest.raises(anthropic.APIStatusError) as refused:
            attempt()
        seen.append(refused.value.response.text + str(refused.value.response.headers))
    update(url, made["id"], status="archived")
    with pytest.raises(anthropic.AuthenticationError) as revoked:
        ask(url, secret)
    seen.append(revoked.value.response.text)
    seen.append(httpx.get(f"{url}/metrics").text)
    server.stop()
    receiver.stop()
    seen += [caplog.text, str(receiver.spans()), str(receiver.metric_names())]
    stored = b"".join(p.read_bytes() for p in usage_dir.iterdir() if p.is_file())
    assert stored and secret.encode() not in stored and ADMIN.encode() not in stored
    everything = "\n".join(seen)
    assert made["id"] in everything  # the key's id is what they name it by
    for key in (secret, ADMIN, secret[6:]):
        assert key not in everything
