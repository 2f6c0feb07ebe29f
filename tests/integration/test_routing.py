"""Cache-aware routing end to end: the official SDK over a real socket, scripted replicas.
Each conversation's turns reach one replica (where its prefix is cached), on the translating
and the passthrough path; round robin spreads them; the access log and /metrics say where
each request went and why; failover is unchanged (docs/routing.md)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import anthropic
import httpx
import pytest

from dragoman.translate.tool_ids import replica_tag_of, tagged, upstream_tool_id
from dragoman.upstream.placement import replica_tag
from tests.support import fake_anthropic
from tests.support.batches import results_of, wait_ended
from tests.support.fake_anthropic import FakeAnthropic, NativeReply, event, text_events
from tests.support.fakes import FakeUpstream, Reply, completion

SYSTEM = "You are a careful coding agent working in a repository. " * 100  # a few of routing's 4 KiB blocks
CONVERSATIONS = 6
TURNS = 3


@pytest.fixture
def second() -> Iterator[FakeUpstream]:
    fake = FakeUpstream().start()
    yield fake
    fake.stop()


def converse(client: anthropic.Anthropic, name: str, *, model: str = "test-model") -> None:
    """TURNS turns of one conversation, each repeating the ones before (as Claude Code does)."""
    messages: list[dict] = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"{name}: step {turn} " * 300})
        reply = client.messages.create(model=model, max_tokens=20, system=SYSTEM, messages=messages,
                                       extra_headers={"x-claude-code-session-id": name})  # fmt: skip
        messages.append({"role": "assistant", "content": reply.content[0].text})  # type: ignore[union-attr]


def _first_user_text(body: dict) -> str:
    for message in body["messages"]:
        if message["role"] == "user":
            content = message["content"]
            return content if isinstance(content, str) else content[0]["text"]
    raise AssertionError("no user message")


def replicas_of(name: str, *fakes: list[dict]) -> set[int]:
    """Which of the replicas (by position) served the conversation `name`."""
    return {i for i, requests in enumerate(fakes) for body in requests if _first_user_text(body).startswith(name)}


@pytest.fixture
def sdk() -> Iterator[Callable[[str], anthropic.Anthropic]]:
    """The official SDK's client for a gateway URL, closed at teardown (no socket left to the GC)."""
    clients: list[anthropic.Anthropic] = []

    def make(url: str) -> anthropic.Anthropic:
        clients.append(anthropic.Anthropic(base_url=url, api_key="k", max_retries=0))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


@pytest.mark.parametrize("routing", [None, "cache_aware", "round_robin"])
def test_a_translated_conversation_stays_on_one_replica_unless_routed_round_robin(
    make_gateway, upstream, second, routing, sdk
):
    settings = {"replicas": [second.url]} | ({"routing": routing} if routing else {})
    gateway = make_gateway(upstream=settings, server={"default_model": "test-model"})
    client = sdk(gateway.url)
    for index in range(CONVERSATIONS):
        converse(client, f"conversation-{index}")
    assert upstream.requests and second.requests  # both replicas took conversations
    spread = [replicas_of(f"conversation-{i}", upstream.requests, second.requests) for i in range(CONVERSATIONS)]
    if routing == "round_robin":
        assert all(len(served) == 2 for served in spread)  # three turns over two replicas in turn
    else:
        assert all(len(served) == 1 for served in spread), spread


def test_a_passed_through_conversation_stays_on_one_replica(gateway_from, sdk):
    fakes = [FakeAnthropic().start(), FakeAnthropic().start()]
    try:
        gateway = gateway_from({"server": {"default_model": "native-model"}, "upstreams": {"n": {
            "url": fakes[0].url, "replicas": [fakes[1].url], "protocol": "anthropic", "max_retries": 0}}})  # fmt: skip
        client = sdk(gateway.url)
        for index in range(CONVERSATIONS):
            converse(client, f"conversation-{index}", model="native-model")
        bodies = [[body for path, body, _ in fake.requests if path == "/v1/messages"] for fake in fakes]
        assert all(bodies)
        for index in range(CONVERSATIONS):
            assert len(replicas_of(f"conversation-{index}", *bodies)) == 1
    finally:
        for fake in fakes:
            fake.stop()


def test_the_log_and_metrics_say_which_replica_and_why(make_gateway, upstream, second, caplog, sdk):
    gateway = make_gateway(upstream={"replicas": [second.url]}, server={"default_model": "test-model"})
    client = sdk(gateway.url)
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        converse(client, "logged")
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"]
    assert len(lines) == TURNS
    assert len({line["replica"] for line in lines}) == 1
    assert lines[0]["replica"] in (upstream.url.removesuffix("/v1"), second.url.removesuffix("/v1"))
    assert lines[0]["routing"] == "home"  # nothing of it cached anywhere yet: its rendezvous home
    assert [line["routing"] for line in lines[1:]] == ["prefix", "prefix"]  # then where its prefix is
    assert lines[2]["prefix_match_tokens"] > lines[1]["prefix_match_tokens"] > 0
    metrics = httpx.get(gateway.url + "/metrics").text
    replica = lines[0]["replica"]
    assert f'dragoman_routing_decisions_total{{reason="prefix",replica="{replica}",upstream="default"}} 2.0' in metrics
    expected = [
        line for line in metrics.splitlines() if line.startswith("dragoman_routing_expected_cached_tokens_total")
    ]
    routed = [line for line in metrics.splitlines() if line.startswith("dragoman_routing_prompt_tokens_total")]
    assert float(expected[0].split()[-1]) == lines[1]["prefix_match_tokens"] + lines[2]["prefix_match_tokens"]
    assert 0 < float(expected[0].split()[-1]) < float(routed[0].split()[-1])
    assert "dragoman_routing_prefix_match_tokens_bucket" in metrics


def test_a_conversations_replica_that_refuses_is_failed_over_as_before(make_gateway, upstream, second, sdk):
    gateway = make_gateway(
        upstream={"replicas": [second.url], "max_retries": 2}, server={"default_model": "test-model"}
    )
    client = sdk(gateway.url)
    converse(client, "moving")
    home, other = (upstream, second) if upstream.requests else (second, upstream)
    assert len(home.requests) == TURNS and not other.requests
    home.stop()  # it goes away: refused connections
    converse(client, "moving")  # the SDK sees no error: each turn is retried on the other replica
    assert len(other.requests) == TURNS


TOOLS = [{"name": "read", "description": "Read a file of the repository. " * 40, "input_schema": {"type": "object"}}]


def _tool_calls(fake: FakeUpstream) -> Callable[[dict], Reply]:
    """Every answer a tool call, its id the replica's own (`call-<n>` counted per replica)."""

    def answer(body: dict) -> Reply:
        call = {"id": f"call-{len(fake.requests)}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        return Reply(body=completion(None, finish="tool_calls", tool_calls=[call]))

    return answer


def test_gateways_that_share_nothing_keep_a_conversation_where_its_tool_ids_say(make_gateway, upstream, second, sdk):
    """Three gateway processes behind a load balancer that spreads turns over them: each tool
    call's id names the replica that made it (docs/routing.md), each turn reaches one replica,
    and the replica gets its own ids back, untagged. (Which replica a gateway picks from the
    id: tests/unit/upstream/test_placement.py.)"""
    for fake in (upstream, second):
        fake.responder = _tool_calls(fake)
    clients = [sdk(make_gateway(upstream={"replicas": [second.url]}, server={"default_model": "test-model"}).url)
               for _ in range(3)]  # fmt: skip
    for index in range(CONVERSATIONS):
        name = f"conversation-{index}"
        messages: list[dict] = [{"role": "user", "content": f"{name}: begin " * 300}]
        for turn in range(TURNS + 2):
            before = len(upstream.requests)
            reply = clients[(index + turn) % 3].messages.create(
                model="test-model", max_tokens=20, system=SYSTEM, tools=TOOLS, messages=messages,
                extra_headers={"x-claude-code-session-id": name})  # fmt: skip
            call = reply.content[-1]
            answered = upstream if len(upstream.requests) > before else second
            assert call.type == "tool_use" and replica_tag_of(call.id) == replica_tag(answered.url.removesuffix("/v1"))
            messages += [{"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                       "content": f"{name} output {turn} " * 200}]}]  # fmt: skip
    spread = [replicas_of(f"conversation-{i}", upstream.requests, second.requests) for i in range(CONVERSATIONS)]
    assert all(len(served) == 1 for served in spread), spread
    sent_back = [m["tool_calls"][0]["id"] for body in upstream.requests + second.requests
                 for m in body["messages"] if m["role"] == "assistant"]  # fmt: skip
    assert sent_back and all(i.startswith("call-") for i in sent_back)


def _native_tool_calls(fakes: list[FakeAnthropic], refused: set[str]) -> None:
    """Every answer a tool call, its id the replica's own (`call-<replica>-<n>`), streamed or
    whole as asked; a conversation's first turn is refused (503, retry-after) by the first
    replica it reaches: the replica that makes its first tool call is not its home."""

    def responder(index: int) -> Callable[[dict], NativeReply]:
        def answer(body: dict) -> NativeReply:
            if "max_tokens" not in body:  # a count
                return NativeReply(body={"input_tokens": 5})
            name = _first_user_text(body).split(":")[0]
            if len(body["messages"]) == 1 and name not in refused:
                refused.add(name)
                error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
                return NativeReply(status=503, body=error, headers={"retry-after": "1"})
            use = {"type": "tool_use", "id": f"call-{index}-{len(fakes[index].requests)}", "name": "read", "input": {}}
            reply = fake_anthropic.message("") | {"content": [use], "stop_reason": "tool_use"}
            if not body.get("stream"):
                return NativeReply(body=reply)
            start = event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": use})
            events = text_events(model=reply["model"])
            return NativeReply(
                events=[events[0], start, events[3], events[4].replace(b"end_turn", b"tool_use"), events[5]]
            )

        return answer

    for index, fake in enumerate(fakes):
        fake.responder = responder(index)


def test_passed_through_tool_ids_take_the_next_turn_through_another_gateway_to_their_replica(gateway_from, sdk):
    """Two gateway processes that share nothing in front of two passthrough replicas: the turn
    after a tool call, sent through the other gateway, reaches the replica that made the call
    (its id says which: docs/routing.md), not the conversation's home, where it goes when the
    id says nothing; the replica gets its own id back, untagged."""
    fakes = [FakeAnthropic().start(), FakeAnthropic().start()]
    try:
        _native_tool_calls(fakes, set())
        upstream = {"url": fakes[0].url, "replicas": [fakes[1].url], "protocol": "anthropic", "max_retries": 1}
        one, other, control = (sdk(gateway_from({"server": {"default_model": "native-model"},
                                                 "upstreams": {"n": upstream}}).url) for _ in range(3))  # fmt: skip
        tags = [replica_tag(fake.url) for fake in fakes]
        ask = {"model": "native-model", "max_tokens": 20, "system": SYSTEM, "tools": TOOLS}
        messages: list[dict] = [{"role": "user", "content": "tagged: begin " * 300}]
        with one.messages.stream(messages=messages, **ask) as stream:  # type: ignore[arg-type]
            call = stream.get_final_message().content[-1]
        assert call.type == "tool_use"
        maker = tags.index(replica_tag_of(call.id))  # the replica that answered (the other refused)
        assert fakes[maker].requests and fakes[1 - maker].requests
        result = [{"type": "tool_result", "tool_use_id": call.id, "content": "output " * 200}]
        messages += [{"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
                     {"role": "user", "content": result}]  # fmt: skip
        before = [len(fake.requests) for fake in fakes]
        second = other.messages.create(messages=messages, **ask)  # type: ignore[arg-type]
        assert [len(fake.requests) - n for fake, n in zip(fakes, before, strict=True)] == [maker == 0, maker == 1]
        assert replica_tag_of(second.content[-1].id) == tags[maker]  # type: ignore[union-attr]
        sent = fakes[maker].requests[-1][1]["messages"]
        assert sent[1]["content"][0]["id"] == sent[2]["content"][0]["tool_use_id"] == upstream_tool_id(call.id)
        assert upstream_tool_id(call.id).startswith(f"call-{maker}-")
        other.messages.count_tokens(model="native-model", system=SYSTEM, tools=TOOLS, messages=messages)  # type: ignore[arg-type]
        counted = next(body for fake in fakes for path, body, _ in fake.requests if path.endswith("/count_tokens"))
        assert counted["messages"][2]["content"][0]["tool_use_id"] == upstream_tool_id(call.id)
        # Control: the same turn, its ids saying nothing, goes to its home, the replica that refused.
        plain = json.loads(json.dumps(messages).replace(call.id, upstream_tool_id(call.id)))
        before = [len(fake.requests) for fake in fakes]
        control.messages.create(messages=plain, **ask)  # type: ignore[arg-type]
        assert [len(fake.requests) - n for fake, n in zip(fakes, before, strict=True)] == [maker == 1, maker == 0]
    finally:
        for fake in fakes:
            fake.stop()


def test_a_batch_passed_through_sends_the_server_its_own_ids_and_tags_the_reply_s(gateway_from, sdk):
    """A batch's requests take the passthrough path's tags as interactive ones do: the turn
    after a tool call reaches the replica its id names, untagged, and the call in its result
    names the replica that made it."""
    fakes = [FakeAnthropic().start(), FakeAnthropic().start()]
    try:
        _native_tool_calls(fakes, {"batch"})  # none refused
        upstream = {"url": fakes[0].url, "replicas": [fakes[1].url], "protocol": "anthropic", "max_retries": 1}
        client = sdk(gateway_from({"server": {"default_model": "native-model"}, "upstreams": {"n": upstream}}).url)
        tags = [replica_tag(fake.url) for fake in fakes]
        for maker in (0, 1):
            own = f"call-{maker}-0"
            call = {"type": "tool_use", "id": tagged(own, tags[maker]), "name": "read", "input": {}}
            messages = [{"role": "user", "content": "batch: begin " * 300}, {"role": "assistant", "content": [call]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "x"}]}]  # fmt: skip
            params = {"model": "native-model", "max_tokens": 20, "system": SYSTEM, "tools": TOOLS, "messages": messages}
            before = [len(fake.requests) for fake in fakes]
            batch = client.messages.batches.create(requests=[{"custom_id": "one", "params": params}])  # type: ignore[list-item]
            wait_ended(client, batch.id)
            assert [len(fake.requests) - n for fake, n in zip(fakes, before, strict=True)] == [maker == 0, maker == 1]
            sent = fakes[maker].requests[-1][1]["messages"]
            assert sent[1]["content"][0]["id"] == sent[2]["content"][0]["tool_use_id"] == own
            result = results_of(client, batch.id)["one"]
            assert result.type == "succeeded"
            assert replica_tag_of(result.message.content[-1].id) == tags[maker]
    finally:
        for fake in fakes:
            fake.stop()
