"""One access line for everything a client does, not only the Messages endpoints: what
Claude Code and the SDKs send first (`HEAD /`, the model list), Batches, Files, token
counts, and requests for no endpoint. Ids, never contents or keys."""

from __future__ import annotations

import json
import logging
from typing import Any

import anthropic
import httpx
import pytest

from dragoman.server.auth import key_id
from tests.support.fakes import Reply
from tests.support.servers import GatewayServer

KEY = "sk-never-logged"
USER = [{"role": "user", "content": "the secret question"}]


def _logged(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    lines = [r.getMessage() for r in caplog.records if r.name == "dragoman.access"]
    assert not [line for line in lines if "secret" in line or KEY in line], lines
    return [json.loads(line) for line in lines]


def test_every_endpoint_a_client_uses_gets_its_line(gateway: GatewayServer, caplog: pytest.LogCaptureFixture) -> None:
    gateway.wait_discovered()
    with (
        anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0) as client,
        caplog.at_level(logging.INFO, logger="dragoman.access"),
    ):
        assert httpx.head(gateway.url + "/").status_code == 200  # Claude Code's first request
        client.models.list()
        client.models.retrieve("test-model")
        client.messages.count_tokens(model="test-model", messages=USER)  # type: ignore[arg-type]
        uploaded = client.beta.files.upload(file=("secret.txt", b"the secret content", "text/plain"))
        client.beta.files.list()
        client.beta.files.delete(uploaded.id)
        batch = client.messages.batches.create(
            requests=[{"custom_id": "a", "params": {"model": "test-model", "max_tokens": 5, "messages": USER}}]  # type: ignore[list-item]
        )
        client.messages.batches.retrieve(batch.id)
        client.messages.batches.list()
        with pytest.raises(anthropic.NotFoundError):
            client.messages.batches.retrieve("msgbatch_nope")
        assert httpx.get(gateway.url + "/v1/nothing-here").status_code == 404
        for probe in ("/health", "/metrics"):  # the infrastructure's, many a minute: no line
            assert httpx.get(gateway.url + probe).status_code == 200
    logged = [e for e in _logged(caplog) if e["endpoint"] != "batch"]  # the batch's request runs when it runs
    seen = [(e["endpoint"], e.get("method"), e["status"]) for e in logged]
    assert seen == [
        ("root", "HEAD", 200),
        ("models", "GET", 200),
        ("model", "GET", 200),
        ("count_tokens", None, 200),
        ("files.upload", "POST", 200),
        ("files.list", "GET", 200),
        ("files.delete", "DELETE", 200),
        ("batches.create", "POST", 200),
        ("batches.retrieve", "GET", 200),
        ("batches.list", "GET", 200),
        ("batches.retrieve", "GET", 404),
        ("unknown", "GET", 404),
    ], seen
    assert all(e["request_id"].startswith("req_") and "duration_ms" in e for e in logged)
    by_endpoint = {(e["endpoint"], e["status"]): e for e in logged}
    assert by_endpoint[("files.delete", 200)]["file_id"] == uploaded.id
    assert by_endpoint[("batches.retrieve", 200)]["batch_id"] == batch.id
    assert by_endpoint[("batches.retrieve", 404)]["error"] == "not_found_error"
    assert by_endpoint[("model", 200)]["model_id"] == "test-model"
    assert by_endpoint[("unknown", 404)]["url_path"] == "/v1/nothing-here"


def test_a_known_key_is_named_by_its_id_and_tenant(make_gateway, caplog: pytest.LogCaptureFixture) -> None:
    gateway = make_gateway(server={"tenants": {"team-a": [KEY]}})
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        assert httpx.get(gateway.url + "/v1/files", headers={"x-api-key": KEY}).status_code == 200
        assert httpx.get(gateway.url + "/v1/files", headers={"x-api-key": "sk-someone-else"}).status_code == 401
    known, unknown = _logged(caplog)
    assert known["key_id"] == key_id(KEY) and known["tenant"] == "team-a"
    assert unknown["status"] == 401 and "key_id" not in unknown and "someone" not in json.dumps(unknown)


UPSTREAM_KEY = "sk-upstream-never-logged-4242"


def test_an_error_s_line_says_why_without_keys_or_contents(
    make_gateway, upstream, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = make_gateway(server={"api_keys": [KEY]}, upstream={"api_key": UPSTREAM_KEY})
    gateway.wait_discovered()
    long_name = "m" * 5000
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        with anthropic.Anthropic(base_url=gateway.url, api_key="sk-a-wrong-key-1234", max_retries=0) as stranger:
            with pytest.raises(anthropic.AuthenticationError):
                stranger.messages.create(model="test-model", max_tokens=5, messages=USER)  # type: ignore[arg-type]
        with anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0) as client:
            with pytest.raises(anthropic.BadRequestError):
                client.messages.create(model="test-model", max_tokens=-1, messages=USER)  # type: ignore[arg-type]
            with pytest.raises(anthropic.NotFoundError):
                client.messages.create(model=long_name, max_tokens=5, messages=USER)  # type: ignore[arg-type]
            upstream.queue(Reply(status=500, body={"error": {"message": f"bad key {UPSTREAM_KEY}", "type": "x"}}))
            with pytest.raises(anthropic.InternalServerError):
                client.messages.create(model="test-model", max_tokens=5, messages=USER)  # type: ignore[arg-type]
            with pytest.raises(anthropic.NotFoundError):
                client.messages.batches.retrieve("msgbatch_nope")
    lines = [r.getMessage() for r in caplog.records if r.name == "dragoman.access"]
    assert not [line for line in lines if "sk-a-wrong" in line or UPSTREAM_KEY in line or "secret" in line], lines
    refused, invalid, unknown, failed, missing = (json.loads(line) for line in lines)
    assert refused["status"] == 401 and refused["error"] == "authentication_error" and refused["error_message"]
    assert invalid["status"] == 400 and "max_tokens" in invalid["error_message"]
    assert unknown["status"] == 404 and "mmmm" in unknown["error_message"]
    assert len(unknown["error_message"]) < 300 and unknown["error_message"].endswith("chars)")  # capped
    assert failed["status"] == 502 and "bad key [redacted]" in failed["error_message"]
    assert missing["endpoint"] == "batches.retrieve" and "msgbatch_nope" in missing["error_message"]
    assert not [line for line in lines if "error_message" in line and '"status":200' in line]
