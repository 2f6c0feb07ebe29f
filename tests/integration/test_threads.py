"""Message threads (`thread` on /v1/messages): the gateway holds the conversation, so the
official SDK's tool runner and threads, which send only each turn's new messages, work."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest
from anthropic import beta_tool

from tests.support.fake_anthropic import FakeAnthropic, NativeReply, message, text_events
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream
from tests.support.servers import GatewayServer

HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
WEATHER_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def _post(gateway: GatewayServer, body: dict[str, Any], key: str = "k") -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/messages", json=body, headers={**HEADERS, "x-api-key": key}, timeout=10)


def test_the_sdks_tool_runner_gets_the_whole_conversation_upstream(
    gateway: GatewayServer, upstream: FakeUpstream
) -> None:
    upstream.queue(
        Reply(body=completion(None, finish="tool_calls", tool_calls=[WEATHER_CALL])), Reply(body=completion("Sunny."))
    )

    @beta_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    client = anthropic.Anthropic(base_url=gateway.url, api_key="k")
    runner = client.beta.messages.tool_runner(
        model="test-model",
        max_tokens=100,
        system="Be brief.",
        tools=[get_weather],
        messages=[{"role": "user", "content": "Weather?"}],
    )
    replies = list(runner)

    assert [m.stop_reason for m in replies] == ["tool_use", "end_turn"]
    second = upstream.requests[1]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]  # system and history held
    assert second["messages"][0]["content"] == "Be brief."
    assert (
        second["messages"][2]["tool_calls"][0]["id"] == "call_1"
        and second["messages"][3]["content"] == "sunny in Paris"
    )
    assert [t["function"]["name"] for t in second["tools"]] == ["get_weather"]


def test_an_sdk_thread_remembers_earlier_turns_streamed_or_not(gateway: GatewayServer, upstream: FakeUpstream) -> None:
    upstream.queue(Reply(body=completion("Hello Alice.")))
    upstream.stream_reply(text_stream("You are ", "Alice."))
    upstream.queue(Reply(body=completion("Yes.")))
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k")
    thread = client.beta.messages.thread(model="test-model", max_tokens=50, system="You remember names.")

    thread.send({"role": "user", "content": "My name is Alice."})
    with thread.stream({"role": "user", "content": "What is my name?"}) as stream:
        streamed = stream.get_final_message()
    thread.send({"role": "user", "content": "Sure?"})

    assert [b.text for b in streamed.content if b.type == "text"] == ["You are Alice."]
    third = upstream.requests[2]["messages"]
    assert [(m["role"], m["content"]) for m in third] == [
        ("system", "You remember names."), ("user", "My name is Alice."), ("assistant", "Hello Alice."),
        ("user", "What is my name?"), ("assistant", "You are Alice."), ("user", "Sure?"),
    ]  # fmt: skip


def test_continuing_an_unknown_or_continued_reply_gets_the_error_codes_the_sdks_act_on(gateway: GatewayServer,
                                                                                       upstream: FakeUpstream) -> None:  # fmt: skip
    base = {"model": "test-model", "max_tokens": 20}
    unknown = _post(
        gateway,
        {
            **base,
            "messages": [{"role": "user", "content": "x"}],
            "thread": {"type": "continue", "previous_message_id": "msg_nope"},
        },
    )
    assert unknown.status_code == 404
    error = unknown.json()["error"]
    assert error["type"] == "not_found_error" and error["details"] == {"error_code": "thread_not_found"}
    assert "thread.previous_message_id" in error["message"]

    upstream.queue(Reply(body=completion("one")), Reply(body=completion("two")))
    first = _post(
        gateway, {**base, "messages": [{"role": "user", "content": "a"}], "thread": {"type": "create"}}
    ).json()
    follow = {
        **base,
        "messages": [{"role": "user", "content": "b"}],
        "thread": {"type": "continue", "previous_message_id": first["id"]},
    }
    assert _post(gateway, follow).status_code == 200
    again = _post(gateway, follow)
    assert again.status_code == 400
    assert again.json()["error"]["details"] == {"error_code": "thread_already_continued"}

    missing = _post(gateway, {**base, "messages": [], "thread": {"type": "continue"}})
    assert missing.status_code == 400 and "thread.previous_message_id" in missing.json()["error"]["message"]
    bad = _post(gateway, {**base, "messages": [], "thread": {"type": "resume"}})
    assert bad.status_code == 400 and "thread.type" in bad.json()["error"]["message"]


def test_changing_system_or_tools_on_a_continue_is_a_fingerprint_mismatch(
    gateway: GatewayServer, upstream: FakeUpstream
) -> None:
    upstream.queue(Reply(body=completion("one")))
    first = _post(gateway, {"model": "test-model", "max_tokens": 20, "system": "A", "messages": [{"role": "user", "content": "a"}],
                            "thread": {"type": "create"}}).json()  # fmt: skip
    changed = _post(gateway, {"model": "test-model", "max_tokens": 20, "system": "B", "messages": [{"role": "user", "content": "b"}],
                              "thread": {"type": "continue", "previous_message_id": first["id"]}})  # fmt: skip
    assert changed.status_code == 400
    assert changed.json()["error"]["details"] == {"error_code": "thread_fingerprint_mismatch"}
    assert changed.json()["error"]["message"].startswith("system:")


def test_a_failed_turn_leaves_its_thread_to_be_continued(gateway: GatewayServer, upstream: FakeUpstream) -> None:
    upstream.queue(
        Reply(body=completion("one")),
        Reply(status=500, body={"error": {"message": "boom"}}),
        Reply(body=completion("two")),
    )
    first = _post(gateway, {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "a"}],
                            "thread": {"type": "create"}}).json()  # fmt: skip
    follow = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "b"}],
              "thread": {"type": "continue", "previous_message_id": first["id"]}}  # fmt: skip
    assert _post(gateway, follow).status_code == 502
    assert _post(gateway, follow).status_code == 200  # neither continued nor in flight after the failure


def test_threads_belong_to_their_api_key(make_gateway: Any, upstream: FakeUpstream) -> None:
    gateway = make_gateway(server={"api_keys": ["alice", "bob"]})
    upstream.queue(Reply(body=completion("one")))
    first = _post(gateway, {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "a"}],
                            "thread": {"type": "create"}}, key="alice").json()  # fmt: skip
    other = _post(gateway, {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "b"}],
                            "thread": {"type": "continue", "previous_message_id": first["id"]}}, key="bob")  # fmt: skip
    assert other.status_code == 404 and other.json()["error"]["details"] == {"error_code": "thread_not_found"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_passthrough_sends_the_whole_conversation_and_never_the_thread_field(native: FakeAnthropic, gateway_from: Any,
                                                                            stream: bool) -> None:  # fmt: skip
    gateway = gateway_from({"upstreams": {"native": {"url": native.url, "protocol": "anthropic"}},
                            "models": [{"name": "native-model", "upstream": "native"}]})  # fmt: skip
    native.replies.append(
        NativeReply(events=text_events("Hi Alice")) if stream else NativeReply(body=message("Hi Alice"))
    )
    native.replies.append(NativeReply(body=message("Alice")))
    base = {"model": "native-model", "max_tokens": 20, "system": "Remember."}
    first = _post(
        gateway,
        {
            **base,
            "stream": stream,
            "messages": [{"role": "user", "content": "I am Alice"}],
            "thread": {"type": "create"},
        },
    )
    first_id = "msg_native"
    assert first.status_code == 200
    second = _post(gateway, {"model": "native-model", "max_tokens": 20, "messages": [{"role": "user", "content": "Who am I?"}],
                             "thread": {"type": "continue", "previous_message_id": first_id}})  # fmt: skip

    assert second.status_code == 200
    sent = [body for path, body, _ in native.requests if path == "/v1/messages"]
    assert all("thread" not in body for body in sent)
    assert sent[1]["system"] == "Remember."
    assert sent[1]["messages"] == [
        {"role": "user", "content": "I am Alice"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hi Alice"}]},
        {"role": "user", "content": "Who am I?"},
    ]
    assert json.loads(json.dumps(sent[1]))  # plain JSON


def _call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_tools_the_runner_adds_and_removes_mid_conversation_are_the_tools_offered(
    gateway: GatewayServer, upstream: FakeUpstream
) -> None:
    upstream.queue(
        Reply(body=completion(None, finish="tool_calls", tool_calls=[_call("add", {"a": 1, "b": 2}, "call_1")])),
        Reply(body=completion(None, finish="tool_calls", tool_calls=[_call("mul", {"a": 3, "b": 2}, "call_2")])),
        Reply(body=completion("done")),
    )

    @beta_tool
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        return str(a + b)

    @beta_tool
    def mul(a: int, b: int) -> str:
        """Multiply two numbers."""
        return str(a * b)

    client = anthropic.Anthropic(base_url=gateway.url, api_key="k")
    runner = client.beta.messages.tool_runner(
        model="test-model", max_tokens=100, tools=[add], messages=[{"role": "user", "content": "go"}]
    )
    replies = []
    for reply in runner:
        replies.append(reply)
        if len(replies) == 1:
            runner.add_tools(mul)  # sent as a tool_addition block in a system message
        if len(replies) == 2:
            runner.remove_tools("add")  # a tool_removal block

    assert [m.stop_reason for m in replies] == ["tool_use", "tool_use", "end_turn"]
    offered = [[t["function"]["name"] for t in body.get("tools", [])] for body in upstream.requests]
    assert offered == [["add"], ["add", "mul"], ["mul"]]
    assert [m["content"] for m in upstream.requests[2]["messages"] if m["role"] == "tool"] == ["3", "6"]
    assert all(
        "tool_addition" not in json.dumps(body) and "tool_removal" not in json.dumps(body) for body in upstream.requests
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_runners_compaction_summarizes_and_the_summary_replaces_the_history(gateway: GatewayServer, upstream: FakeUpstream,
                                                                                stream: bool) -> None:  # fmt: skip
    upstream.queue(
        Reply(body=completion(None, finish="tool_calls", tool_calls=[_call("add", {"a": 1, "b": 2}, "call_1")])),
        Reply(body=completion("The user asked to add 1 and 2; add returned 3.")),  # the summary
        Reply(body=completion("It is 3.")),
    )

    @beta_tool
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        return str(a + b)

    client = anthropic.Anthropic(base_url=gateway.url, api_key="k")
    runner = client.beta.messages.tool_runner(model="test-model", max_tokens=200, tools=[add], stream=stream,
                                              messages=[{"role": "user", "content": "Add 1 and 2."}])  # fmt: skip
    replies = []
    for item in runner:
        reply = item.get_final_message() if stream else item
        replies.append(reply)
        if len(replies) == 1:
            runner.compact_before_next_turn()

    assert [m.stop_reason for m in replies] == ["tool_use", "compaction", "end_turn"]
    compaction = replies[1].content[0]
    assert compaction.type == "compaction" and compaction.content == "The user asked to add 1 and 2; add returned 3."
    summarize = upstream.requests[1]
    assert "tools" not in summarize and summarize["messages"][-1]["role"] == "user"
    assert "summary" in summarize["messages"][-1]["content"]
    after = upstream.requests[2]["messages"]
    assert after[0]["role"] == "user" and after[0]["content"].endswith(
        "add returned 3."
    )  # the summary stands for the history
    assert not any(m.get("tool_calls") for m in after)


def test_a_continued_thread_is_held_to_max_request_bytes(make_gateway: Any, upstream: FakeUpstream) -> None:
    """Each turn fits, the conversation they make does not: a 413 naming the thread, nothing sent
    upstream, and the thread can still be continued with a smaller turn."""
    gateway = make_gateway(server={"max_request_bytes": 20_000})
    upstream.queue(Reply(body=completion("one")), Reply(body=completion("two")))
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    first = client.messages.create(model="test-model", max_tokens=20, messages=[{"role": "user", "content": "a" * 12_000}],
                                   extra_body={"thread": {"type": "create"}})  # fmt: skip
    follow = {"type": "continue", "previous_message_id": first.id}
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model="test-model", max_tokens=20, messages=[{"role": "user", "content": "b" * 12_000}],
                               extra_body={"thread": follow})  # fmt: skip
    assert caught.value.status_code == 413 and caught.value.body["error"]["type"] == "request_too_large"
    assert "thread" in caught.value.body["error"]["message"] and "server.max_request_bytes" in caught.value.message
    assert len(upstream.requests) == 1
    smaller = client.messages.create(model="test-model", max_tokens=20, messages=[{"role": "user", "content": "c"}],
                                     extra_body={"thread": follow})  # fmt: skip
    assert smaller.content[0].text == "two" and len(upstream.requests) == 2
