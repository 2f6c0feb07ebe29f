"""Web search run by the gateway, through the official SDK over a real socket: a scripted
model that calls `web_search`, a fake search service, Anthropic's blocks back."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import ServerToolUseBlock, TextBlock, WebSearchToolResultBlock

from dragoman.core.config_load import from_dict
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream, web_search_call
from tests.support.search_fakes import FakeSearch, Result
from tests.support.servers import GatewayServer
from tests.support.usage import KEYS, report, team_config, wait_recorded
from tests.support.waiting import eventually

SEARCH_TOOL = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
ASK = [{"role": "user", "content": "Perform a web search for the query: dragoman gateway"}]


@pytest.fixture
def search() -> Iterator[FakeSearch]:
    fake = FakeSearch().start()
    yield fake
    fake.stop()


@pytest.fixture
def start(upstream: FakeUpstream) -> Iterator[Callable[..., GatewayServer]]:
    started: list[GatewayServer] = []

    def run(search: FakeSearch | None, **web_search: Any) -> GatewayServer:
        data: dict[str, Any] = {"server": {"keepalive_interval": web_search.pop("keepalive", 15.0)},
                                "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}}  # fmt: skip
        if search is not None:
            data["web_search"] = {"provider": search.kind, "url": search.url, "timeout": 5.0, **web_search}
        server = GatewayServer(from_dict(data)).start()
        started.append(server)
        return server

    yield run
    for server in started:
        server.stop()


def _client(server: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="test-key", max_retries=0)


def _create(client: anthropic.Anthropic, tool: dict | None = None, messages: list | None = None, **kw: Any) -> Any:
    return client.messages.create(model="test-model", max_tokens=200, messages=messages or ASK,
                                  tools=[tool or SEARCH_TOOL], **kw)  # fmt: skip


def _tool_messages(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


@pytest.mark.parametrize("kind", ["searxng", "brave", "tavily"])
def test_a_search_answers_with_anthropics_blocks(start, upstream, kind, monkeypatch):
    monkeypatch.setenv("SEARCH_KEY", "search-key")
    search = FakeSearch(kind).start()
    try:
        upstream.queue(web_search_call("dragoman gateway"), Reply(chunks=text_stream("Dragoman ", "translates.")))
        message = _create(_client(start(search, api_key_env="SEARCH_KEY")))
    finally:
        search.stop()
    use, result, text = message.content
    assert isinstance(use, ServerToolUseBlock) and use.name == "web_search" and use.id.startswith("srvtoolu_")
    assert use.input == {"query": "dragoman gateway"}
    assert isinstance(result, WebSearchToolResultBlock) and result.tool_use_id == use.id
    assert [(r.title, r.url) for r in result.content] == [
        ("Dragoman guide", "https://dragoman.example.org/guide"), ("Gateways compared", "https://news.example.com/gateways")
    ]  # fmt: skip
    assert result.content[0].page_age == "2026-11-02" and result.content[1].page_age is None
    assert all(r.encrypted_content and "Dragoman" not in r.encrypted_content for r in result.content)
    assert isinstance(text, TextBlock) and text.text == "Dragoman translates."
    assert message.stop_reason == "end_turn"
    assert message.usage.server_tool_use.web_search_requests == 1
    assert message.usage.server_tool_use.web_fetch_requests == 0
    assert message.usage.input_tokens == 30  # both model calls: 20 + 10
    asked = search.queries[0]
    assert (asked.get("q") or asked.get("query")) == "dragoman gateway"
    assert upstream.requests[0]["tools"][0]["function"]["name"] == "web_search"
    handed = _tool_messages(upstream.requests[1])
    assert len(handed) == 1 and "Dragoman translates the Messages API." in handed[0]
    assert "https://dragoman.example.org/guide" in handed[0]
    if kind != "searxng":  # the key read from SEARCH_KEY once, at start-up, reached the provider
        assert any("search-key" in value for value in search.headers[0].values())


def test_the_stream_folds_into_the_same_message_and_pings_while_searching(start, upstream, search):
    upstream.queue(web_search_call("dragoman gateway"), Reply(chunks=text_stream("Found ", "it.")))
    client = _client(start(search))
    with client.messages.stream(model="test-model", max_tokens=200, messages=ASK, tools=[SEARCH_TOOL]) as stream:
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["server_tool_use", "web_search_tool_result", "text"]
    assert isinstance(message.content[0], ServerToolUseBlock) and message.content[0].input == {
        "query": "dragoman gateway"
    }
    assert isinstance(message.content[1], WebSearchToolResultBlock) and len(message.content[1].content) == 2
    assert message.content[1].tool_use_id == message.content[0].id
    assert message.content[2].text == "Found it."
    assert message.usage.server_tool_use.web_search_requests == 1


def test_the_result_block_comes_whole_and_pings_keep_the_stream_alive(start, upstream, search):
    search.hold = threading.Event()
    upstream.queue(web_search_call("q"), Reply(chunks=text_stream("ok")))
    server = start(search, keepalive=0.05)
    body = {"model": "test-model", "max_tokens": 50, "messages": ASK, "tools": [SEARCH_TOOL], "stream": True}
    events = []
    with httpx.stream(
        "POST", f"{server.url}/v1/messages", json=body, headers={"x-api-key": "k"}, timeout=10
    ) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            events.append(event)
            if event["type"] == "ping" and search.held.is_set():
                search.hold.set()  # a ping came while the search was running: let it answer
    kinds = [e["type"] for e in events]
    starts = [i for i, e in enumerate(events) if e["type"] == "content_block_start"]
    result_at = next(i for i in starts if events[i]["content_block"]["type"] == "web_search_tool_result")
    assert "ping" in kinds[starts[0] : result_at]
    assert events[result_at + 1] == {"type": "content_block_stop", "index": 1}
    assert len(events[result_at]["content_block"]["content"]) == 2
    use = events[starts[0]]["content_block"]
    assert use["type"] == "server_tool_use" and use["input"] == {}
    deltas = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta" and e["index"] == 0]
    assert json.loads("".join(deltas)) == {"query": "q"}
    assert kinds.count("message_start") == 1 and kinds.count("message_delta") == 1
    final = next(e for e in events if e["type"] == "message_delta")
    assert final["usage"]["server_tool_use"] == {"web_search_requests": 1, "web_fetch_requests": 0}


@pytest.mark.parametrize("stream", [False, True])
def test_searches_past_max_uses_get_max_uses_exceeded(start, upstream, search, stream):
    upstream.queue(web_search_call("one", "c1"), web_search_call("two", "c2"), Reply(chunks=text_stream("done")))
    client = _client(start(search))
    tool = {**SEARCH_TOOL, "max_uses": 1}
    if stream:
        with client.messages.stream(model="test-model", max_tokens=99, messages=ASK, tools=[tool]) as events:
            message = events.get_final_message()
    else:
        message = _create(client, tool)
    kinds = [b.type for b in message.content]
    assert kinds == ["server_tool_use", "web_search_tool_result"] * 2 + ["text"]
    assert isinstance(message.content[1].content, list)
    assert message.content[3].content.type == "web_search_tool_result_error"
    assert message.content[3].content.error_code == "max_uses_exceeded"
    assert message.usage.server_tool_use.web_search_requests == 1
    assert len(search.queries) == 1
    assert "max_uses_exceeded" in _tool_messages(upstream.requests[2])[-1]


@pytest.mark.parametrize("status", [500, 429])
def test_a_failing_provider_is_an_error_in_band_never_a_5xx(start, upstream, search, status):
    search.status = status
    upstream.queue(web_search_call("q"), Reply(chunks=text_stream("sorry")))
    message = _create(_client(start(search)))
    error = message.content[1].content
    assert error.type == "web_search_tool_result_error"
    assert error.error_code == ("too_many_requests" if status == 429 else "unavailable")
    assert message.usage.server_tool_use.web_search_requests == 0
    assert message.content[2].text == "sorry"


def test_a_provider_that_is_down_is_unavailable(start, upstream, dead_port):
    down = FakeSearch()  # never started: its URL points at a port where nothing listens
    down.port = dead_port
    upstream.queue(web_search_call("q"), Reply(chunks=text_stream("sorry")))
    message = _create(_client(start(down)))
    assert message.content[1].content.error_code == "unavailable"


def test_domain_lists_filter_the_results(start, upstream):
    search = FakeSearch(results=[
        Result("https://example.org/a", "A", "a"), Result("https://docs.example.org/b", "B", "b"),
        Result("https://other.com/c", "C", "c"), Result("https://notexample.org/d", "D", "d"),
    ]).start()  # fmt: skip
    try:
        server = start(search)
        upstream.queue(
            web_search_call("q"), Reply(chunks=text_stream("a")), web_search_call("q"), Reply(chunks=text_stream("b"))
        )
        allowed = _create(_client(server), {**SEARCH_TOOL, "allowed_domains": ["example.org"]})
        blocked = _create(_client(server), {**SEARCH_TOOL, "blocked_domains": ["example.org"]})
    finally:
        search.stop()
    assert [r.url for r in allowed.content[1].content] == ["https://example.org/a", "https://docs.example.org/b"]
    assert [r.url for r in blocked.content[1].content] == ["https://other.com/c", "https://notexample.org/d"]
    assert search.queries[0]["q"] == "q site:example.org"


def test_both_domain_lists_or_an_empty_location_are_refused(start, upstream, search):
    client = _client(start(search))
    with pytest.raises(anthropic.BadRequestError, match=r"tools\.0: allowed_domains and blocked_domains"):
        _create(client, {**SEARCH_TOOL, "allowed_domains": ["a.org"], "blocked_domains": ["b.org"]})
    with pytest.raises(anthropic.BadRequestError, match=r"tools\.0\.user_location"):
        _create(client, {**SEARCH_TOOL, "user_location": {"type": "approximate"}})
    assert upstream.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_ten_rounds_pause_the_turn_and_the_client_continues_it(start, upstream, search, stream):
    upstream.responder = lambda body: web_search_call("again")
    client = _client(start(search))
    tool = {"type": "web_search_20250305", "name": "web_search"}
    if stream:
        with client.messages.stream(model="test-model", max_tokens=99, messages=ASK, tools=[tool]) as events:
            paused = events.get_final_message()
    else:
        paused = _create(client, tool)
    assert paused.stop_reason == "pause_turn"
    assert [b.type for b in paused.content] == ["server_tool_use", "web_search_tool_result"] * 10
    assert paused.usage.server_tool_use.web_search_requests == 10
    upstream.responder = None
    upstream.queue(Reply(chunks=text_stream("All found.")))
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in paused.content]}]
    resumed = _create(client, tool, messages=history)
    assert resumed.stop_reason == "end_turn" and [b.type for b in resumed.content] == ["text"]
    assert resumed.content[0].text == "All found."
    assert len(_tool_messages(upstream.requests[-1])) == 10


def test_results_sent_back_on_a_later_turn_are_shown_to_the_model_again(start, upstream, search):
    upstream.queue(web_search_call("dragoman"), Reply(chunks=text_stream("It is a gateway.")))
    client = _client(start(search))
    first = _create(client)
    upstream.queue(Reply(body=completion("Yes.")))  # no tools: the ordinary path, not streamed upstream
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": "Is it open source?"}]  # fmt: skip
    second = client.messages.create(model="test-model", max_tokens=99, messages=history)  # no tools this time
    assert second.content[0].text == "Yes."
    sent = upstream.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert sent[1]["tool_calls"][0]["function"]["name"] == "web_search"
    assert "Dragoman translates the Messages API." in sent[2]["content"]
    assert sent[3]["content"] == "It is a gateway."


def test_an_altered_encrypted_content_is_refused(start, upstream, search):
    upstream.queue(web_search_call("dragoman"), Reply(chunks=text_stream("ok")))
    client = _client(start(search))
    blocks = [b.model_dump(exclude_none=True) for b in _create(client).content]
    sealed = blocks[1]["content"][0]["encrypted_content"]
    blocks[1]["content"][0]["encrypted_content"] = sealed[:-4] + ("AAAA" if sealed[-4:] != "AAAA" else "BBBB")
    history = [*ASK, {"role": "assistant", "content": blocks}, {"role": "user", "content": "more?"}]
    calls = len(upstream.requests)
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.1\.content\.0\.encrypted_content"):
        client.messages.create(model="test-model", max_tokens=99, messages=history)
    assert len(upstream.requests) == calls


def test_another_replica_with_the_same_secret_reads_the_results(start, upstream, search, monkeypatch):
    monkeypatch.setenv("SEARCH_SECRET", "shared between replicas")
    upstream.queue(web_search_call("dragoman"), Reply(chunks=text_stream("ok")), Reply(body=completion("again")))
    first = _create(_client(start(search, secret_env="SEARCH_SECRET")))
    other = _client(start(search, secret_env="SEARCH_SECRET"))
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": "more?"}]  # fmt: skip
    assert other.messages.create(model="test-model", max_tokens=99, messages=history).content[0].text == "again"


def test_without_web_search_configured_the_tool_is_refused_as_before(start, upstream):
    client = _client(start(None))
    with pytest.raises(anthropic.BadRequestError) as refused:
        _create(client)
    assert "tools.0: server tool" in refused.value.message and "web_search_20250305" in refused.value.message


def test_searches_are_counted_in_the_usage_report_and_the_metric(upstream, search, gateway_from):
    config = team_config(upstream.url, {})
    config["web_search"] = {"provider": "searxng", "url": search.url}
    server = gateway_from(config)
    search_status = iter([200, 500])
    upstream.queue(
        web_search_call("a"), Reply(chunks=text_stream("x")), web_search_call("b"), Reply(chunks=text_stream("y"))
    )
    client = anthropic.Anthropic(base_url=server.url, api_key=KEYS["team-a"], max_retries=0)
    for _ in range(2):
        search.status = next(search_status)
        _create(client)
    wait_recorded(server, 2)
    text = httpx.get(server.url + "/metrics").text
    assert 'dragoman_server_tool_calls_total{outcome="ok",provider="searxng",tool="web_search"} 1.0' in text
    assert 'dragoman_server_tool_calls_total{outcome="unavailable",provider="searxng",tool="web_search"} 1.0' in text
    eventually(  # the writer flushes each second: poll the store
        lambda: sum(_searches(report(server.url))) >= 1, "the search counted in the usage report", timeout=10
    )
    assert _searches(report(server.url)) == [1]


def _searches(answer: dict) -> list[int]:
    return [r["server_tool_use"]["web_search_requests"] for bucket in answer["data"] for r in bucket["results"]]


def test_a_token_count_counts_the_search_tool_as_the_function_the_model_is_offered(start, upstream, search):
    client = _client(start(search))
    counted = client.messages.count_tokens(model="test-model", messages=ASK, tools=[SEARCH_TOOL])
    assert counted.input_tokens > 0
