"""Operations: replicas and failover, back-pressure, metrics, the request log, health."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from dragoman.assembly.gateway import Timings
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream
from tests.support.waiting import eventually

VALID = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "a secret question"}]}


def test_a_dead_replica_is_skipped(make_gateway, upstream, dead_port):
    dead = f"http://127.0.0.1:{dead_port}/v1"
    gateway = make_gateway(
        url=dead, upstream={"replicas": [upstream.url], "max_retries": 2}, server={"default_model": "test-model"}
    )
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    for _ in range(4):  # round robin would hit the dead one at least once
        assert client.messages.create(**VALID).content[0].text == "Hello!"
    assert len(upstream.requests) == 4


def test_connection_refused_without_replicas_is_a_clear_error(make_gateway, dead_port):
    gateway = make_gateway(
        url=f"http://127.0.0.1:{dead_port}/v1", upstream={"max_retries": 1}, server={"default_model": "x"}
    )
    response = httpx.post(gateway.url + "/v1/messages", json=VALID)
    assert response.status_code == 502
    body = response.json()
    assert body["error"]["type"] == "api_error"
    assert "unreachable" in body["error"]["message"]


def test_retry_after_beyond_the_budget_is_passed_to_the_client(make_gateway, upstream):
    gateway = make_gateway(upstream={"max_retries": 2, "retry_budget": 1.0})
    upstream.json_reply({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "30"})
    response = httpx.post(gateway.url + "/v1/messages", json=VALID)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "30"
    assert len(upstream.requests) == 1  # no pointless wait inside the gateway


def _busy(status: int = 503) -> Reply:
    return Reply(status=status, body={"error": {"message": "busy"}}, headers={"retry-after": "30"})


@pytest.fixture
def busy() -> Iterator[FakeUpstream]:
    """An instance that answers every request 503 with `retry-after: 30`."""
    fake = FakeUpstream().start()
    fake.responder = lambda body: _busy()
    yield fake
    fake.stop()


def test_a_replicas_retry_after_sends_the_request_to_another_at_once(make_gateway, upstream, busy):
    gateway = make_gateway(
        url=busy.url, upstream={"replicas": [upstream.url], "max_retries": 2}, server={"default_model": "test-model"}
    )
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0, timeout=5)
    upstream.responder = lambda body: Reply(chunks=text_stream("Hi", "!")) if body.get("stream") else None
    for _ in range(5):  # round robin would give the busy one half of them
        assert client.messages.create(**VALID).content[0].text == "Hello!"
        with client.messages.stream(**VALID) as stream:
            assert stream.get_final_text() == "Hi!"
    assert len(busy.requests) <= 1  # passed over for its retry-after's 30 s
    assert len(upstream.requests) == 10


def test_a_single_instances_retry_after_beyond_the_budget_still_reaches_the_client(make_gateway, busy):
    gateway = make_gateway(url=busy.url, upstream={"max_retries": 2}, server={"default_model": "test-model"})
    for _ in range(2):
        response = httpx.post(gateway.url + "/v1/messages", json=VALID, timeout=5)
        assert response.status_code == 529 and response.headers["retry-after"] == "30"
    assert len(busy.requests) == 2  # neither waited for nor retried


def test_when_every_replica_is_passed_over_the_retry_after_reaches_the_client(make_gateway, upstream, busy):
    upstream.responder = lambda body: _busy(429)
    gateway = make_gateway(
        url=busy.url, upstream={"replicas": [upstream.url], "max_retries": 2}, server={"default_model": "test-model"}
    )
    response = httpx.post(gateway.url + "/v1/messages", json=VALID, timeout=5)
    assert response.headers["retry-after"] == "30" and response.status_code in (429, 529)
    assert len(busy.requests) == len(upstream.requests) == 1  # the other asked at once; then neither is free
    response = httpx.post(gateway.url + "/v1/messages", json=VALID, timeout=5)
    assert response.headers["retry-after"] == "30" and response.status_code in (429, 529)
    assert len(busy.requests) + len(upstream.requests) == 3


def test_past_the_concurrency_cap_and_queue_requests_get_529(make_gateway, upstream):
    gateway = make_gateway(upstream={"max_concurrent": 1, "max_queue": 1})
    for _ in range(3):
        upstream.queue(Reply(body=completion("slow"), hang=1.0))
    responses: list[httpx.Response] = []

    def send() -> None:
        responses.append(httpx.post(gateway.url + "/v1/messages", json=VALID, timeout=10))

    threads = [threading.Thread(target=send) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 529]  # one ran, one waited in the queue, one was turned away
    (rejected,) = [r for r in responses if r.status_code == 529]
    assert rejected.json()["error"]["type"] == "overloaded_error"
    assert rejected.headers["retry-after"] == "1"
    assert len(upstream.requests) == 2


def test_a_client_that_hangs_up_while_queued_leaves_the_queue_and_is_never_sent_upstream(make_gateway, upstream):
    gateway = make_gateway(upstream={"max_concurrent": 1, "max_queue": 1})
    upstream.queue(Reply(body=completion("first"), hang=1.5))
    upstream.queue(Reply(body=completion("third")))
    first = threading.Thread(target=lambda: httpx.post(gateway.url + "/v1/messages", json=VALID, timeout=10))
    first.start()
    eventually(lambda: upstream.requests, "the first holds the only slot")
    with pytest.raises(httpx.ReadTimeout):  # the second waits in the queue, then hangs up
        httpx.post(gateway.url + "/v1/messages", json=VALID, timeout=0.4)
    left = "dragoman_client_disconnects_total 1.0"
    eventually(lambda: left in httpx.get(gateway.url + "/metrics").text, "the gateway noticed the hang-up")

    third = httpx.post(gateway.url + "/v1/messages", json=VALID, timeout=10)  # queued, not turned away
    first.join()
    assert third.status_code == 200 and third.json()["content"][0]["text"] == "third"
    assert len(upstream.requests) == 2  # the one who left was never sent


def test_streams_hold_their_slot_until_the_end(make_gateway, upstream):
    gateway = make_gateway(upstream={"max_concurrent": 1, "max_queue": 0})
    resume = threading.Event()
    chunks = text_stream("a", "b")
    upstream.stream_reply([*chunks[:2], ("wait", resume), *chunks[2:]])
    try:
        with httpx.stream("POST", gateway.url + "/v1/messages", json={**VALID, "stream": True}) as response:
            events = response.iter_lines()
            assert next(line for line in events if "text_delta" in line)  # the stream is under way
            # While it runs it holds the only slot, and there is no queue: a second request is turned away.
            during = httpx.post(gateway.url + "/v1/messages", json=VALID)
            assert during.status_code == 529 and during.json()["error"]["type"] == "overloaded_error"
            resume.set()
            assert any("message_stop" in line for line in events)
    finally:
        resume.set()
    # The stream ended, so its slot is free again.
    assert httpx.post(gateway.url + "/v1/messages", json=VALID).status_code == 200


def test_metrics_count_requests_tokens_and_errors(gateway, upstream):
    upstream.json_reply(completion("hi", prompt=12, completion_tokens=3))
    httpx.post(gateway.url + "/v1/messages", json=VALID)
    upstream.stream_reply(text_stream("x", "y", prompt=9))
    with httpx.stream("POST", gateway.url + "/v1/messages", json={**VALID, "stream": True}) as response:
        response.read()
    httpx.post(gateway.url + "/v1/messages", json={**VALID, "max_tokens": "many"})
    text = httpx.get(gateway.url + "/metrics").text
    assert (
        'dragoman_requests_total{endpoint="messages",model="test-model",path="translate",status="200",upstream="default"} 2.0'
        in text
    )
    assert 'dragoman_tokens_total{direction="output",model="test-model"} 5.0' in text
    assert 'dragoman_tokens_total{direction="input",model="test-model"} 21.0' in text
    assert "dragoman_time_to_first_token_seconds_count" in text
    assert "dragoman_streams_in_flight 0.0" in text


def test_names_sent_on_to_an_upstream_whose_list_is_unknown_are_not_metrics_labels(make_gateway, caplog, dead_port):
    gateway = make_gateway(
        url=f"http://127.0.0.1:{dead_port}/v1", upstream={"max_retries": 0}
    )  # down: its list is unknown
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        for name in ("client-name-1", "client-name-2"):
            assert httpx.post(gateway.url + "/v1/messages", json={**VALID, "model": name}).status_code == 502
    text = httpx.get(gateway.url + "/metrics").text
    assert "client-name" not in text
    assert (
        'dragoman_requests_total{endpoint="messages",model="unlisted",path="translate",status="502",upstream="default"} 2.0'
        in text
    )
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"]
    assert [(e["model"], e["served_model"]) for e in logged] == [
        ("client-name-1", "client-name-1"),
        ("client-name-2", "client-name-2"),
    ]


def test_one_json_log_line_per_request_without_contents(gateway, upstream, caplog):
    upstream.json_reply(completion("the secret answer", prompt=12, completion_tokens=3))
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        httpx.post(gateway.url + "/v1/messages", json=VALID, headers={"x-api-key": "sk-very-secret"})
    lines = [r.getMessage() for r in caplog.records if r.name == "dragoman.access"]
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["model"] == "test-model" and entry["status"] == 200 and entry["upstream"] == "default"
    assert entry["input_tokens"] == 12 and entry["output_tokens"] == 3
    assert entry["request_id"].startswith("req_")
    assert "secret" not in lines[0]


def test_health_and_ready(make_gateway, upstream, dead_port):
    gateway = make_gateway()
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok"}
    ready = httpx.get(gateway.url + "/ready")
    assert ready.status_code == 200 and ready.json()["upstreams"] == ["default"]
    down = make_gateway(url=f"http://127.0.0.1:{dead_port}/v1")
    assert httpx.get(down.url + "/ready").status_code == 503


def test_an_upstream_without_a_model_list_is_ready(make_gateway, upstream):
    """A hosted server without `GET /models` (404) answers: it is up, and it serves."""
    upstream.no_model_list = True
    gateway = make_gateway()
    ready = httpx.get(gateway.url + "/ready")
    assert ready.status_code == 200 and ready.json()["upstreams"] == ["default"]
    client = anthropic.Anthropic(base_url=gateway.url, api_key="test-key", max_retries=0)
    assert client.messages.create(model="any-name", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]).content
    assert [r["model"] for r in upstream.requests] == ["any-name"]


def test_a_replica_that_never_answers_leaves_the_upstream_ready(make_gateway, upstream):
    each_its_own_round = Timings(ready_reuse=0.0)
    with socket.socket() as silent:  # connections are accepted (by the kernel), never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        gateway = make_gateway(url=url, upstream={"replicas": [upstream.url]}, server={"default_model": "test-model"},
                               timings=each_its_own_round)  # fmt: skip
        for _ in range(3):  # round robin: some probes ask the silent instance first
            ready = httpx.get(gateway.url + "/ready", timeout=10)
            assert ready.status_code == 200 and ready.json()["upstreams"] == ["default"]


def test_a_discovery_that_times_out_says_so_in_the_log(make_gateway, caplog):
    with (
        socket.socket() as silent,
        caplog.at_level(logging.WARNING, logger="dragoman"),
    ):  # accepted by the kernel, never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        make_gateway(url=f"http://127.0.0.1:{silent.getsockname()[1]}/v1", timings=Timings(discovery_timeout=0.2))
        eventually(lambda: any("model discovery" in r.getMessage() for r in caplog.records), "discovery's warning")
    lines = [r.getMessage() for r in caplog.records if "model discovery" in r.getMessage()]
    assert lines == ["model discovery on upstream default failed: no answer within 0.2 s"]


@pytest.mark.parametrize("starting", [True, False], ids=["one-answers-503", "none-answers"])
def test_discovery_logs_what_the_model_list_saw(gateway_from, monkeypatch, caplog, starting):
    """One instance hangs, the other answers its model list 503 (still starting): the log says
    503, not that nothing answered (discovery's own 5 s used to cut the model list's 10 s short).
    With no other instance, it is the model list's own limit that the log names."""
    from dragoman.upstream import client as http
    from dragoman.upstream import hedge

    monkeypatch.setattr(http, "MODEL_LIST_TIMEOUT", 0.5)  # raises if it is renamed
    monkeypatch.setattr(hedge, "HEDGE_AFTER", 0.05)
    other = FakeAnthropic().start()
    other.models_down = True
    with (
        socket.socket() as silent,
        caplog.at_level(logging.WARNING, logger="dragoman"),
    ):  # accepted by the kernel, never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        replicas = [other.url] if starting else []
        try:
            gateway_from(
                {
                    "upstreams": {
                        "n": {
                            "url": f"http://127.0.0.1:{silent.getsockname()[1]}",
                            "replicas": replicas,
                            "protocol": "anthropic",
                        }
                    }
                }
            )
            eventually(
                lambda: any("model discovery" in r.getMessage() for r in caplog.records),
                "discovery's warning",
                timeout=20,
            )
        finally:
            other.stop()
    lines = [r.getMessage() for r in caplog.records if "model discovery" in r.getMessage()]
    expected = (
        "upstream n answered 503 to GET /v1/models"
        if starting
        else "upstream n timed out (no instance answered within 0.5 s)"
    )
    assert lines == [f"model discovery on upstream n failed: {expected}"]


def test_a_replica_still_starting_leaves_the_upstream_ready(gateway_from, native):
    starting = FakeAnthropic().start()
    starting.models_down = True  # its model list answers 503
    try:
        gateway = gateway_from(
            {"upstreams": {"n": {"url": starting.url, "replicas": [native.url], "protocol": "anthropic"}}},
            timings=Timings(ready_reuse=0.0),  # each probe its own round
        )
        for _ in range(3):  # round robin: some probes ask the starting instance first
            ready = httpx.get(gateway.url + "/ready", timeout=10)
            assert ready.status_code == 200 and ready.json()["upstreams"] == ["n"]
    finally:
        starting.stop()


def test_ready_probes_are_shared_so_nobody_can_multiply_upstream_calls(gateway_from, native):
    # /ready is open to anyone, and each round asks every upstream its model list (an authenticated call)
    gateway = gateway_from(
        {"upstreams": {"native": {"url": native.url, "protocol": "anthropic"}}}, timings=Timings(ready_reuse=3600.0)
    )
    gateway.wait_discovered()
    before = native.model_lists
    answers: list[int] = []
    threads = [
        threading.Thread(target=lambda: answers.append(httpx.get(gateway.url + "/ready").status_code)) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    answers.append(httpx.get(gateway.url + "/ready").status_code)
    assert answers == [200] * 9
    assert native.model_lists == before + 1


def test_upstream_key_never_reaches_the_client(make_gateway):
    dead = FakeUpstream().start()
    url = dead.url
    dead.stop()
    gateway = make_gateway(url=url, upstream={"api_key": "sk-upstream-secret"}, server={"default_model": "m"})
    response = httpx.post(gateway.url + "/v1/messages", json=VALID)
    assert "sk-upstream-secret" not in response.text


def test_a_client_leaving_a_non_streaming_request_cancels_the_upstream_call(gateway, upstream):
    upstream.queue(Reply(body=completion("too late"), hang=3.0))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gateway.url + "/v1/messages", json=VALID, timeout=0.5)
    eventually(lambda: upstream.abandoned, "the upstream call was abandoned")
    assert upstream.abandoned == 1
    metrics = httpx.get(gateway.url + "/metrics").text
    assert "dragoman_client_disconnects_total 1.0" in metrics


def test_ollama_context_windows_come_from_api_show(make_gateway, upstream):
    upstream.models = [{"id": "qwen3:8b", "owned_by": "library"}, {"id": "llama3:8b", "owned_by": "library"}]
    upstream.show = {
        "qwen3:8b": {"model_info": {"qwen3.context_length": 40960}, "parameters": "num_ctx 8192\ntemperature 0.6"},
        "llama3:8b": {"model_info": {"llama.context_length": 8192}, "parameters": ""},
    }
    gateway = make_gateway()
    models = {m["id"]: m for m in httpx.get(gateway.url + "/v1/models").json()["data"]}
    assert models["qwen3:8b"]["max_input_tokens"] == 8192  # the num_ctx it runs with
    assert models["llama3:8b"]["max_input_tokens"] == 8192  # the trained length


def test_requests_go_through_the_configured_proxy(make_gateway, upstream):
    # The fake upstream doubles as a forward proxy: aiohttp sends it absolute-form
    # requests for a host that does not exist, which only a proxy can answer.
    proxy = upstream.url.removesuffix("/v1")
    gateway = make_gateway(
        url="http://model-host.invalid:8000/v1", upstream={"proxy": proxy}, server={"default_model": "test-model"}
    )
    response = httpx.post(gateway.url + "/v1/messages", json=VALID)
    assert response.status_code == 200, response.text
    assert len(upstream.requests) == 1


def test_extra_headers_and_the_upstream_key_go_upstream_not_the_clients_key(make_gateway, upstream):
    gateway = make_gateway(upstream={"headers": {"X-Tenant": "team-a"}, "api_key": "sk-upstream"})
    httpx.post(gateway.url + "/v1/messages", json=VALID, headers={"x-api-key": "sk-client"})
    sent = {k.lower(): v for k, v in upstream.headers[-1].items()}
    assert sent["x-tenant"] == "team-a"
    assert sent["authorization"] == "Bearer sk-upstream"
    assert "sk-client" not in str(sent)


def test_a_claude_wildcard_alias_is_listed_under_claude_model_ids(make_gateway, upstream):
    models = [
        {
            "name": "coder",
            "upstream": "default",
            "upstream_model": "test-model",
            "aliases": ["claude-*-haiku-*", "claude-sonnet-*"],
        }
    ]
    gateway = make_gateway(models=models)
    ids = [m["id"] for m in httpx.get(gateway.url + "/v1/models?limit=1000").json()["data"]]
    assert ids[0] == "coder"
    assert "claude-sonnet-4-5" in ids and "claude-sonnet-5-5" in ids
    assert not any(i.startswith("claude-opus") for i in ids)  # only what the aliases match
    one = httpx.get(gateway.url + "/v1/models/claude-sonnet-4-5").json()
    assert one["id"] == "claude-sonnet-4-5" and "test-model" in one["display_name"]


def test_a_client_leaving_a_stream_is_not_an_application_error(gateway, upstream):
    from tests.support.fakes import chunk

    errors: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                errors.append(record)

    handler = Collect()
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        upstream.stream_reply(
            [chunk({"role": "assistant", "content": ""}), chunk({"content": "a"}), ("sleep", 2), chunk({}, "stop")]
        )
        with httpx.stream("POST", gateway.url + "/v1/messages", json={**VALID, "stream": True}) as response:
            chunks = response.iter_bytes()
            next(chunks)
        eventually(lambda: upstream.disconnects, "the upstream saw the disconnect")
        # the gateway has finished with the request (anything it would log, it has logged)
        eventually(lambda: "dragoman_client_disconnects_total 1.0" in httpx.get(gateway.url + "/metrics").text)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert upstream.disconnects == 1
    assert errors == []


def test_claude_codes_warm_up_requests_are_answered(gateway):
    for path in ("/", "/api/hello"):
        assert httpx.head(gateway.url + path).status_code == 200


def test_a_huge_model_name_is_cut_short_in_the_access_log(gateway, upstream, caplog):
    """A 2 MB model name (served by the default model) is logged as 200 characters and its length."""
    name = "m" * 2_000_000
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        with pytest.raises(anthropic.NotFoundError):
            client.messages.create(**{**VALID, "model": name})
    lines = [r.getMessage() for r in caplog.records if r.name == "dragoman.access"]
    assert len(lines) == 1 and len(lines[0]) < 1000
    assert json.loads(lines[0])["model"] == "m" * 200 + "...(2000000 chars)"


def test_a_hostile_upstreams_huge_model_ids_are_cut_short_in_the_log(make_gateway, upstream, caplog):
    upstream.models = [{"id": "x" * 1_000_000, "object": "model", "owned_by": "vllm"}]
    with caplog.at_level(logging.INFO, logger="dragoman"):
        make_gateway().wait_discovered()
    lines = [r.getMessage() for r in caplog.records if "serves:" in r.getMessage()]
    assert len(lines) == 1 and len(lines[0]) < 1000 and "(1000000 chars)" in lines[0]
