"""Usage accounting end to end: the official SDK sends a mixed run through the gateway
(streams, non-streams, errors, disconnects, two tenants, two models), and the usage report
read back with an admin key equals the usage the SDK saw, request by request, summed.
Records go to a real PostgreSQL, each test in a schema of its own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from dragoman.server.auth import key_id
from tests.support.fake_anthropic import FakeAnthropic, NativeReply, message, text_events
from tests.support.fakes import FakeUpstream, completion, text_stream
from tests.support.postgres import pg_url  # noqa: F401 (fixture)
from tests.support.usage import ADMIN, KEYS, MODELS, report, team_config, wait_recorded

CUT_TEXT = "the first words of a longer answer"  # 34 bytes: 9 output tokens counted, message_start said 2


@pytest.fixture
def two_models(native: FakeAnthropic) -> Iterator[tuple[FakeUpstream, FakeAnthropic]]:
    fake = FakeUpstream(models=[{"id": "model-a", "object": "model", "owned_by": "vllm"}]).start()
    yield fake, native
    fake.stop()


def _script(upstreams: tuple[FakeUpstream, FakeAnthropic], model: str, n: int, kind: str) -> None:
    """The upstream's side of one request of the run."""
    openai, native = upstreams
    if model == "native-model":
        reply = {
            "whole": NativeReply(
                body=message(
                    "whole",
                    input_tokens=20 + n,
                    output_tokens=3 + n,
                    cache_creation_input_tokens=10 + n,
                    cache_creation={"ephemeral_5m_input_tokens": 6 + n, "ephemeral_1h_input_tokens": 4},
                )
            ),
            "stream": NativeReply(events=text_events("streamed", cache_creation_input_tokens=5)),  # (no breakdown)
            "error": NativeReply(status=500, body={"type": "error", "error": {"type": "api_error", "message": "boom"}}),
            "cut": NativeReply(events=[*text_events(CUT_TEXT)[:3], ("sleep", 30), *text_events()[3:]]),
        }[kind]
        native.replies.append(reply)
    elif kind == "whole":
        openai.json_reply(completion("whole", prompt=20 + n, completion_tokens=3 + n, cached=4))
    elif kind == "stream":
        openai.stream_reply(text_stream("a", "b", "c", prompt=30 + n))
    elif kind == "error":
        openai.json_reply({"error": {"message": "boom", "type": "server_error"}}, status=500)
    else:  # no answer yet when the client gives up
        openai.stream_reply(text_stream("late"), hang=30)


def run_mixed(upstreams: tuple[FakeUpstream, FakeAnthropic], url: str) -> tuple[Counter[tuple[str, str, str]], int]:
    """Every kind of request, for each tenant and model: the usage the SDK saw, summed by
    (key id, model, kind), and how many requests were sent."""
    seen: Counter[tuple[str, str, str]] = Counter()
    sent = 0

    def saw(key: str, model: str, usage: Any) -> None:
        kid = key_id(key)
        seen[(kid, model, "input")] += usage.input_tokens
        seen[(kid, model, "cache_read")] += usage.cache_read_input_tokens or 0
        seen[(kid, model, "output")] += usage.output_tokens
        hour = usage.cache_creation.ephemeral_1h_input_tokens if usage.cache_creation else 0
        seen[(kid, model, "cache_creation_5m")] += (usage.cache_creation_input_tokens or 0) - hour
        seen[(kid, model, "cache_creation_1h")] += hour

    for n, (key, model) in enumerate((k, m) for k in KEYS.values() for m in MODELS):
        client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
        ask = {"model": model, "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}
        _script(upstreams, model, n, "whole")
        saw(key, model, client.messages.create(**ask).usage)
        _script(upstreams, model, n, "stream")
        with client.messages.stream(**ask) as stream:
            saw(key, model, stream.get_final_message().usage)
        _script(upstreams, model, n, "error")
        with pytest.raises(anthropic.InternalServerError):
            client.messages.create(**ask)
        with pytest.raises(anthropic.BadRequestError):  # refused before the upstream
            client.messages.create(**ask, extra_body={"thread": 5})
        _script(upstreams, model, n, "cut")
        if model == "native-model":  # the client leaves after the first words: it saw message_start's usage,
            with client.messages.stream(**ask) as stream:  # and the text the gateway counts (4 bytes a token)
                for event in stream:
                    if event.type == "text":
                        usage = stream.current_message_snapshot.usage
                        relayed = -(-len(event.text.encode()) // 4)
                        saw(key, model, usage.model_copy(update={"output_tokens": max(usage.output_tokens, relayed)}))
                        break
        else:  # the client leaves before the reply began: it saw nothing
            with pytest.raises(anthropic.APITimeoutError):
                client.with_options(timeout=0.5).messages.create(**ask, stream=True)
        sent += 5
    return seen, sent


def reported(body: dict[str, Any]) -> Counter[tuple[str, str, str]]:
    sums: Counter[tuple[str, str, str]] = Counter()
    for bucket in body["data"]:
        for result in bucket["results"]:
            group = (result["api_key_id"], result["model"])
            sums[(*group, "input")] += result["uncached_input_tokens"]
            sums[(*group, "cache_read")] += result["cache_read_input_tokens"]
            sums[(*group, "output")] += result["output_tokens"]
            sums[(*group, "cache_creation_5m")] += result["cache_creation"]["ephemeral_5m_input_tokens"]
            sums[(*group, "cache_creation_1h")] += result["cache_creation"]["ephemeral_1h_input_tokens"]
    return sums


def test_report_equals_what_the_sdk_saw(two_models: Any, pg_url: str, gateway_from: Any) -> None:  # noqa: F811
    server = gateway_from(team_config(two_models[0].url, {"database_url": pg_url}, two_models[1].url))
    seen, sent = run_mixed(two_models, server.url)
    wait_recorded(server, sent)
    body = report(server.url, group_by=["api_key_id", "model"])
    assert reported(body) == +seen  # (+: zero sums dropped on both sides)
    kinds = ("cache_creation_5m", "cache_creation_1h")  # passed through: the upstream's cache writes
    assert all(seen[(key_id(key), "native-model", kind)] > 0 for key in KEYS.values() for kind in kinds)
    assert {r["api_key_id"] for b in body["data"] for r in b["results"]} == {key_id(k) for k in KEYS.values()}
    assert all(b["ending_at"] > b["starting_at"] for b in body["data"]) and body["has_more"] is False
    only = report(server.url, api_key_ids=[key_id(KEYS["team-a"])], models=["native-model"])  # filters
    results = [r for b in only["data"] for r in b["results"]]
    for field, kind in (("uncached_input_tokens", "input"), ("output_tokens", "output")):
        assert sum(r[field] for r in results) == seen[(key_id(KEYS["team-a"]), "native-model", kind)] > 0
    ungrouped = report(server.url)
    total = sum((r["uncached_input_tokens"] for b in ungrouped["data"] for r in b["results"]), 0)
    assert total == sum(v for (_, _, kind), v in seen.items() if kind == "input")
    assert all(r["api_key_id"] is None and r["model"] is None for b in ungrouped["data"] for r in b["results"])


def test_every_request_is_one_record(two_models: Any, pg_url: str, gateway_from: Any) -> None:  # noqa: F811
    """Errors and disconnects are records too, with their tenant, upstream and replica."""
    import asyncio

    import asyncpg

    server = gateway_from(team_config(two_models[0].url, {"database_url": pg_url}, two_models[1].url))
    _, sent = run_mixed(two_models, server.url)
    wait_recorded(server, sent)
    report(server.url)  # writes what is held

    async def rows() -> list[Any]:
        connection = await asyncpg.connect(pg_url)
        try:
            return list(await connection.fetch("SELECT * FROM usage_records"))
        finally:
            await connection.close()

    records = asyncio.run(rows())
    assert len(records) == sent
    assert Counter(r["tenant"] for r in records) == {"team-a": sent // 2, "team-b": sent // 2}
    kinds = Counter((r["model"], r["status"], r["error_type"], r["disconnected"]) for r in records)
    assert kinds == {
        ("model-a", 200, None, False): 4, ("model-a", 502, "api_error", False): 2, ("model-a", 499, None, True): 2,
        ("native-model", 200, None, False): 4, ("native-model", 500, "api_error", False): 2,
        ("native-model", 200, None, True): 2,
        ("", 400, "invalid_request_error", False): 4,  # refused before its model was read
    }  # fmt: skip
    routed = [r for r in records if r["status"] != 400]
    replicas = {"default": two_models[0].url.removesuffix("/v1"), "native": two_models[1].url}
    assert all(r["replica"] == replicas[r["upstream"]] for r in routed)
    assert {(r["upstream"], r["upstream_model"]) for r in routed} == {
        ("default", "model-a"),
        ("native", "native-model"),
    }
    assert sum(r["ttft"] is not None for r in records) == 6  # the streams that began, cut short or not
    assert all(r["duration"] > 0 for r in records)
    assert not any(KEYS["team-a"] in str(dict(r)) for r in records)  # the key's digest only


def test_the_report_is_for_admin_keys_only(upstream: FakeUpstream, gateway_from: Any) -> None:
    server = gateway_from(team_config(upstream.url, {}))  # SQLite in the data directory
    path = "/v1/organizations/usage_report/messages?starting_at=2026-01-01T00:00:00Z"
    for key, status, kind in ((None, 401, "authentication_error"), ("wrong", 401, "authentication_error"),
                              (KEYS["team-a"], 403, "permission_error")):  # fmt: skip
        answer = httpx.get(server.url + path, headers={"x-api-key": key} if key else {})
        assert (answer.status_code, answer.json()["error"]["type"]) == (status, kind)
    client = anthropic.Anthropic(base_url=server.url, api_key=ADMIN, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError, match="admin key"):
        client.messages.create(model="test-model", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    bad = httpx.get(server.url + path.replace("2026-01-01T00:00:00Z", "yesterday"), headers={"x-api-key": ADMIN})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("starting_at:")


def test_prometheus_counts_by_tenant_and_model(upstream: FakeUpstream, gateway_from: Any) -> None:
    server = gateway_from(team_config(upstream.url, {}))
    client = anthropic.Anthropic(base_url=server.url, api_key=KEYS["team-b"], max_retries=0)
    upstream.json_reply(completion("x", prompt=12, completion_tokens=7))
    client.messages.create(model="test-model", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    text = httpx.get(server.url + "/metrics").text
    assert 'dragoman_usage_requests_total{model="test-model",tenant="team-b"} 1.0' in text
    assert 'dragoman_usage_tokens_total{kind="output",model="test-model",tenant="team-b"} 7.0' in text


def test_without_admin_keys_or_accounting_nobody_reads_a_report(upstream: FakeUpstream, gateway_from: Any) -> None:
    path = "/v1/organizations/usage_report/messages?starting_at=2026-01-01T00:00:00Z"
    closed = gateway_from({"upstreams": {"default": {"url": upstream.url}}})
    answer = httpx.get(closed.url + path, headers={"x-api-key": "anything"})
    assert answer.status_code == 403 and "usage.admin_keys" in answer.json()["error"]["message"]
    off = gateway_from(team_config(upstream.url, {"enabled": False}))
    answer = httpx.get(off.url + path, headers={"x-api-key": ADMIN})
    assert answer.status_code == 404 and "usage.enabled" in answer.json()["error"]["message"]


def test_a_client_s_odd_model_name_holds_back_no_record(upstream: FakeUpstream, pg_url: str, gateway_from: Any) -> None:  # noqa: F811
    """PostgreSQL refuses NUL in text: a name with one is kept without it, not retried forever
    with every record after it."""
    server = gateway_from(team_config(upstream.url, {"database_url": pg_url}))
    client = anthropic.Anthropic(base_url=server.url, api_key=KEYS["team-a"], max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(
            model="no\x00such" + "x" * 5000, max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
        )
    upstream.json_reply(completion("x", prompt=12, completion_tokens=7))
    client.messages.create(model="test-model", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    wait_recorded(server, 2)
    body = report(server.url, group_by=["model"])
    models = {r["model"]: r["output_tokens"] for b in body["data"] for r in b["results"]}
    assert models == {"test-model": 7, "nosuch" + "x" * 249: 0}


def test_the_access_log_names_the_key_by_its_id(upstream: FakeUpstream, gateway_from: Any, caplog: Any) -> None:
    import json
    import logging

    server = gateway_from(team_config(upstream.url, {}))
    client = anthropic.Anthropic(base_url=server.url, api_key=KEYS["team-a"], max_retries=0)
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        client.messages.create(model="test-model", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
        wait_recorded(server, 1)
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"]
    assert (line["key_id"], line["tenant"]) == (key_id(KEYS["team-a"]), "team-a")
    assert KEYS["team-a"] not in caplog.text


def test_prompt_cache_writes_a_passthrough_upstream_reports_are_in_the_report(
    upstream: FakeUpstream, native: FakeAnthropic, gateway_from: Any
) -> None:
    """Streamed or not; Anthropic's breakdown by lifetime kept, a total without one counted as
    5-minute writes (Anthropic's default). Also a Prometheus usage kind."""
    server = gateway_from(team_config(upstream.url, {}, native.url))  # SQLite in the data directory
    breakdown = {"ephemeral_5m_input_tokens": 200, "ephemeral_1h_input_tokens": 1000}
    native.replies.append(
        NativeReply(events=text_events("a", cache_creation_input_tokens=1200, cache_creation=breakdown))
    )
    native.replies.append(NativeReply(body=message("b", cache_creation_input_tokens=300)))
    client = anthropic.Anthropic(base_url=server.url, api_key=KEYS["team-a"], max_retries=0)
    ask = {"model": "native-model", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}
    with client.messages.stream(**ask) as stream:
        assert stream.get_final_message().usage.cache_creation_input_tokens == 1200
    assert client.messages.create(**ask).usage.cache_creation_input_tokens == 300
    wait_recorded(server, 2)
    results = [r for b in report(server.url, group_by=["model"])["data"] for r in b["results"]]
    assert [(r["model"], r["cache_creation"]) for r in results] == [
        ("native-model", {"ephemeral_1h_input_tokens": 1000, "ephemeral_5m_input_tokens": 500})
    ]
    text = httpx.get(server.url + "/metrics").text
    assert 'dragoman_usage_tokens_total{kind="cache_creation",model="native-model",tenant="team-a"} 1500.0' in text


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ("starting_at=0001-01-01T00:00:00%2B14:00", "starting_at"),  # year 0 in UTC
        ("starting_at=2026-01-01T00:00:00Z&ending_at=9999-12-31T23:59:59-14:00", "ending_at"),  # year 10000 in UTC
        ("starting_at=2026-01-01T00:00:00Z&ending_at=9999-12-31T12:00:00Z", "ending_at"),  # its day would end in 10000
    ],
)
def test_a_time_out_of_range_is_a_400_naming_the_parameter_and_the_range(
    upstream: FakeUpstream, gateway_from: Any, params: str, named: str
) -> None:
    server = gateway_from(team_config(upstream.url, {}))
    answer = httpx.get(f"{server.url}/v1/organizations/usage_report/messages?{params}", headers={"x-api-key": ADMIN})
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
    message = answer.json()["error"]["message"]
    assert message.startswith(f"{named}:") and "from 0001-01-01T00:00:00Z to 9999-12-31T00:00:00Z" in message


def test_the_first_and_last_days_a_report_can_name_are_written_in_four_digit_years(
    upstream: FakeUpstream, gateway_from: Any
) -> None:
    server = gateway_from(team_config(upstream.url, {}))
    for start, end, bucket in (("0001-01-01T00:00:00Z", "0001-01-02T00:00:00Z", "0001-01-01T00:00:00Z"),
                               ("9999-12-30T05:00:00Z", "9999-12-31T00:00:00Z", "9999-12-30T00:00:00Z")):  # fmt: skip
        data = report(server.url, starting_at=start, ending_at=end)["data"]
        assert [(b["starting_at"], b["ending_at"]) for b in data] == [(bucket, end)]
