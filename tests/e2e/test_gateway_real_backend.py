"""The gateway in front of a real llama-server, through both paths, with the official SDK.

`translate` speaks Chat Completions to llama-server; `passthrough` forwards to its
own /v1/messages. The 135M model's words are not asserted, only what the gateway
promises: shapes, stop reasons, usage, counts, errors, cancellation.
"""

from __future__ import annotations

import json
import tempfile
import threading
import uuid
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from dragoman.core.config_load import from_dict
from dragoman_local.localmodel import DEFAULT_LOCAL_MODEL, LlamaServer
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually

MODEL = DEFAULT_LOCAL_MODEL
TIMEOUT = 120.0


def _gateway(
    server: LlamaServer, protocol: str, settings: dict[str, object] | None = None, **upstream: object
) -> GatewayServer:
    url = server.base_url + ("/v1" if protocol in ("openai", "auto") else "")
    config = from_dict(
        {
            "server": {"default_model": "served", **(settings or {})},
            "files": {"dir": tempfile.mkdtemp(prefix="dragoman-e2e-files-")},  # uploads never go to the home directory
            "upstreams": {"llama": {"url": url, "protocol": protocol, **upstream}},
            "models": [{"name": "served", "upstream": "llama", "upstream_model": MODEL, "aliases": ["claude-*"]}],
        }
    )
    return GatewayServer(config).start()


@pytest.fixture(scope="module", params=["openai", "anthropic"], ids=["translate", "passthrough"])
def path(request: pytest.FixtureRequest, llama_server: LlamaServer) -> Iterator[tuple[str, GatewayServer]]:
    gateway = _gateway(llama_server, request.param)
    yield request.param, gateway
    gateway.stop()


@pytest.fixture(scope="module")
def translate(llama_server: LlamaServer) -> Iterator[GatewayServer]:
    gateway = _gateway(llama_server, "openai")
    yield gateway
    gateway.stop()


def _client(gateway: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="any", max_retries=0, timeout=TIMEOUT)


def _ask(text: str, **options: object) -> dict:
    return {"model": "claude-haiku-4-5", "max_tokens": 40, "messages": [{"role": "user", "content": text}], **options}


def test_plain_answer(path):
    kind, gateway = path
    message = _client(gateway).messages.create(**_ask("Say hello."))
    assert message.model == "claude-haiku-4-5"
    assert message.content and message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens > 0
    if kind == "openai":  # the translating path promises Anthropic's id shape
        assert message.id.startswith("msg_")


def test_streamed_answer_matches_its_final_message(path):
    _, gateway = path
    with _client(gateway).messages.stream(**_ask("Tell me a short story.")) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text
    assert final.usage.output_tokens > 0


def test_the_null_fields_the_sdks_type_are_on_the_wire(path):
    """llama-server's own /v1/messages leaves out stop_details and container; the TypeScript
    SDK's finalMessage() then had them undefined where its types say null."""
    _, gateway = path
    nulls = {"stop_details": None, "container": None}
    reply = httpx.post(f"{gateway.url}/v1/messages", json=_ask("Say hello."), timeout=TIMEOUT).json()
    assert {name: reply.get(name, "absent") for name in (*nulls, "diagnostics")} == {**nulls, "diagnostics": None}
    with httpx.stream(
        "POST", f"{gateway.url}/v1/messages", json=_ask("Say hello.", stream=True), timeout=TIMEOUT
    ) as response:
        data = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]
    start, delta = data[0]["message"], next(d for d in data if d["type"] == "message_delta")["delta"]
    assert {name: start.get(name, "absent") for name in (*nulls, "diagnostics")} == {**nulls, "diagnostics": None}
    assert {name: delta.get(name, "absent") for name in nulls} == nulls


def test_a_reply_that_starts_with_an_emoji_streams_whole(path):
    # llama-server's own stream has no message_start when the first token is part of a
    # character; the SDK refuses such a stream unless the gateway puts one in.
    _, gateway = path
    with _client(gateway).messages.stream(
        **_ask("Reply with only an emoji.", max_tokens=8, extra_body={"temperature": 0})
    ) as stream:
        final = stream.get_final_message()
    assert final.content and final.content[0].type == "text"
    assert not final.content[0].text.isascii()  # the emoji the test is about
    assert final.model == "claude-haiku-4-5" and final.usage.output_tokens > 0


def test_max_tokens_reached(path):
    _, gateway = path
    message = _client(gateway).messages.create(**_ask("Write a long essay about the sea.", max_tokens=5))
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 5


def test_stop_sequence_hit_and_reported(translate):
    # The model counts reliably; the gateway must cut at the stop and name it.
    client = _client(translate)
    for stream in (False, True):
        request = _ask(
            "Count from 1 to 20, separated by commas.",
            max_tokens=80,
            stop_sequences=["7", "never-seen"],
            extra_body={"temperature": 0},
        )
        if stream:
            with client.messages.stream(**request) as s:
                message = s.get_final_message()
        else:
            message = client.messages.create(**request)
        assert message.stop_reason == "stop_sequence", message
        assert message.stop_sequence == "7"
        assert "7" not in message.content[0].text
        # The stream was closed at the stop, before llama-server's usage: the prompt is
        # counted by llama-server's own tokenizer, the output one token per chunk.
        counted = client.messages.count_tokens(model=request["model"], messages=request["messages"]).input_tokens
        assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == counted
        assert message.usage.output_tokens > 0


def test_repeated_prefix_reports_cached_input(translate):
    client = _client(translate)
    system = "You are a careful assistant. " * 40
    first = client.messages.create(**_ask("Name a colour.", system=system, max_tokens=5))
    second = client.messages.create(**_ask("Name a fruit.", system=system, max_tokens=5))
    assert first.usage.input_tokens > 100
    assert second.usage.cache_read_input_tokens > 100
    assert second.usage.input_tokens < first.usage.input_tokens  # the cached part is not counted twice


TOOLS = [
    {
        "name": "get_weather",
        "description": "Look up the weather for a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny, 21 degrees."}]},
]


@pytest.mark.parametrize("shape", ["text", "tools"])
def test_count_tokens_equals_the_prompt_tokens_the_backend_reports(translate, llama_server, shape):
    client = _client(translate)
    request = {"model": "served", "system": "Be brief.", "messages": HISTORY if shape == "tools" else HISTORY[:1]}
    if shape == "tools":
        request["tools"] = TOOLS
    counted = client.messages.with_raw_response.count_tokens(**request)
    assert counted.headers["x-token-count-method"] == "upstream"
    # The same request, sent for real: llama-server's own prompt_tokens.
    reply = client.messages.create(**request, max_tokens=1)
    assert counted.parse().input_tokens == reply.usage.input_tokens + reply.usage.cache_read_input_tokens


def test_count_tokens_through_passthrough(path):
    kind, gateway = path
    if kind != "anthropic":
        pytest.skip("the translating path is covered above")
    result = _client(gateway).messages.with_raw_response.count_tokens(
        model="served", messages=[{"role": "user", "content": "Hello"}]
    )
    assert result.parse().input_tokens > 0
    assert result.headers["x-token-count-method"] == "upstream"


def test_prompt_longer_than_the_context_is_a_clear_400(llama_server_small_ctx):
    gateway = _gateway(llama_server_small_ctx, "openai")
    try:
        with pytest.raises(anthropic.BadRequestError) as caught:
            _client(gateway).messages.create(**_ask("hello " * 1000))
    finally:
        gateway.stop()
    message = caught.value.body["error"]["message"]
    assert message.startswith("prompt is too long: ")
    tokens, limit = message.removeprefix("prompt is too long: ").split(" maximum")[0].split(" tokens > ")
    assert int(tokens) > int(limit) == 512


@pytest.mark.parametrize("stream", [False, True], ids=["message", "stream"])
def test_upstream_overflow_error_is_mapped_on_passthrough(llama_server_small_ctx, stream):
    # llama-server answers both with its OpenAI-shaped JSON 400 (exceed_context_size_error):
    # the client gets Anthropic's envelope and wording, on which Claude Code compacts.
    gateway = _gateway(llama_server_small_ctx, "anthropic")
    try:
        with pytest.raises(anthropic.BadRequestError) as caught:
            if stream:
                with _client(gateway).messages.stream(**_ask("hello " * 1000)) as s:
                    s.get_final_message()
            else:
                _client(gateway).messages.create(**_ask("hello " * 1000))
    finally:
        gateway.stop()
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "invalid_request_error"
    message = caught.value.body["error"]["message"]
    tokens, limit = message.removeprefix("prompt is too long: ").split(" maximum")[0].split(" tokens > ")
    assert int(tokens) > int(limit) == 512


def test_max_tokens_is_fitted_to_the_context(translate):
    # Claude Code asks for 32000 output tokens whatever the model; the window is 4096.
    response = httpx.post(translate.url + "/v1/messages", json=_ask("Hi", max_tokens=32000), timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    applied = int(response.headers["x-max-tokens-applied"])
    assert 0 < applied < 4096
    # The model ends "Hi" long before the window: not cut, so neither cut reason.
    assert response.json()["stop_reason"] not in ("max_tokens", "model_context_window_exceeded")


def test_a_reply_cut_at_the_limit_the_window_set_says_the_window_stopped_it(llama_server_small_ctx):
    # A prompt that leaves a few tokens of the window: max_tokens is lowered to them, and the
    # model, asked for an essay, is cut there by llama-server (finish_reason "length").
    gateway = _gateway(llama_server_small_ctx, "openai")
    try:
        client = _client(gateway)
        window = client.models.retrieve("served").max_input_tokens
        assert window is not None
        request = _ask("Write a long essay about the sea.", max_tokens=40, extra_body={"temperature": 0})
        filler = 0
        for _ in range(4):  # a filler word is about a token: converge on a prompt that leaves 6
            system = "You are a careful assistant. " + "Be thorough. " * filler
            counted = client.messages.count_tokens(
                model=request["model"], system=system, messages=request["messages"]
            ).input_tokens
            filler += (window - 6 - counted) // 3  # "Be thorough. " is about three tokens
        room = window - counted
        assert 0 < room < 40, (window, counted)
        for stream in (False, True):
            if stream:
                with client.messages.stream(**request, system=system) as s:
                    message = s.get_final_message()
            else:
                raw = client.messages.with_raw_response.create(**request, system=system)
                assert int(raw.headers["x-max-tokens-applied"]) == room
                message = raw.parse()
            assert message.stop_reason == "model_context_window_exceeded", message
            assert message.usage.output_tokens == room
    finally:
        gateway.stop()


def test_concurrent_streams(path):
    _, gateway = path
    client = _client(gateway)
    results: list[str] = []

    def run(n: int) -> None:
        with client.messages.stream(**_ask(f"Say the number {n}.", max_tokens=15)) as stream:
            results.append(stream.get_final_message().stop_reason or "")

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert sorted(results) == sorted(r for r in results if r in ("end_turn", "max_tokens")) and len(results) == 4


def _processing(server: LlamaServer) -> int:
    slots = httpx.get(server.base_url + "/slots", timeout=10).json()
    return sum(1 for slot in slots if slot["is_processing"])


def test_client_disconnect_stops_generation(path, llama_server):
    _, gateway = path
    body = _ask("Write a very long story about dragons.", max_tokens=3000, stream=True, ignore_eos=True)
    with httpx.stream("POST", gateway.url + "/v1/messages", json=body, timeout=TIMEOUT) as response:
        # Hold on to the iterator: a dropped one is collected and closes the connection early.
        chunks = response.iter_bytes()
        for chunk in chunks:
            if b"content_block_delta" in chunk:
                break
        assert _processing(llama_server) == 1, llama_server.log_tail(15)  # the backend is generating for us
    eventually(lambda: _processing(llama_server) == 0, "llama-server stopped generating", timeout=10)


def test_a_passthrough_prefill_is_kept_alive_before_message_start(llama_server):
    """llama-server answers 200 at once and sends `message_start` only when the prompt is
    read; dragoman fills that silence with comment lines (Claude Code aborts a stream
    that sends no bytes for 180 s). A fresh prompt of some thousand tokens takes far
    longer to read than the 10 ms interval here."""
    gateway = _gateway(llama_server, "anthropic", settings={"keepalive_interval": 0.01})
    words = " ".join(f"word{n}" for n in range(600))
    body = _ask(f"{uuid.uuid4()} {words}\nSay ok.", max_tokens=3, stream=True)  # a new start: no cached prefix
    try:
        with httpx.stream("POST", gateway.url + "/v1/messages", json=body, timeout=TIMEOUT) as response:
            data = b"".join(response.iter_bytes())
    finally:
        gateway.stop()
    head, found, rest = data.partition(b"event: message_start")
    assert found and rest.rstrip().endswith(b'"message_stop"}'), data[-300:]
    assert head.count(b": keep-alive\n\n") >= 1, data[:300]
    assert all(line.startswith(b":") for line in head.splitlines() if line), head  # only comments before message_start


def test_prefill_is_continued_not_repeated(translate):
    # llama-server repeats a trailing assistant turn at the start of its reply.
    messages = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "The fruit is"}]
    client = _client(translate)
    message = client.messages.create(model="served", max_tokens=8, messages=messages, extra_body={"temperature": 0})
    assert not message.content[0].text.startswith("The fruit is")
    with client.messages.stream(
        model="served", max_tokens=8, messages=messages, extra_body={"temperature": 0}
    ) as stream:
        streamed = stream.get_final_message()
    assert not streamed.content[0].text.startswith("The fruit is")


def test_auto_protocol_picks_passthrough_for_llama_server(llama_server):
    # llama-server serves /v1/messages itself, so `auto` passes requests through.
    gateway = _gateway(llama_server, "auto")
    try:
        message = _client(gateway).messages.create(**_ask("Say hello.", max_tokens=5))
        assert message.content[0].type == "text"
        assert gateway.app.gateway.backends["llama"].path == "passthrough"
    finally:
        gateway.stop()


def test_a_message_batch_runs_on_the_real_backend(path):
    """A batch's requests go through the same path as /v1/messages: answers from the
    model, and an invalid request errored in its place without failing the rest."""
    _, gateway = path
    client = _client(gateway)
    batch = client.messages.batches.create(requests=[
        {"custom_id": "hello", "params": _ask("Say hello.", max_tokens=12)},
        {"custom_id": "count", "params": _ask("Count to three.", max_tokens=12, temperature=0)},
        {"custom_id": "broken", "params": {"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hi"}]}},
    ])  # fmt: skip
    assert batch.processing_status == "in_progress" and batch.request_counts.processing == 3
    ended = lambda: (b := client.messages.batches.retrieve(batch.id)).processing_status == "ended" and b  # noqa: E731
    batch = eventually(ended, "the batch ended", timeout=TIMEOUT, every=0.2)
    counts = batch.request_counts
    assert (counts.succeeded, counts.errored, counts.processing) == (2, 1, 0)
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert set(results) == {"hello", "count", "broken"}
    for name in ("hello", "count"):
        result = results[name]
        assert result.type == "succeeded"
        assert result.message.model == "claude-haiku-4-5" and result.message.usage.output_tokens > 0
        assert result.message.stop_reason in ("end_turn", "max_tokens")
    assert results["broken"].type == "errored" and results["broken"].error.error.type == "invalid_request_error"
    assert "max_tokens" in results["broken"].error.error.message
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"


def test_an_uploaded_text_file_is_read_as_a_document(translate):
    """A document block naming an uploaded file reaches the model as the file's text:
    the prompt grows by about the file's tokens. (Translating path only: llama-server's
    own /v1/messages drops `document` blocks, so through passthrough the prompt stays the
    same size whatever the gateway sends.)"""
    client = _client(translate)
    text = "The courier's password is tangerine. " * 20
    uploaded = client.beta.files.upload(file=("note.txt", text.encode(), "text/plain"))
    try:
        asked = _ask("What is the courier's password?", max_tokens=8)
        plain = client.messages.create(**asked)
        asked["messages"][0]["content"] = [
            {"type": "document", "source": {"type": "file", "file_id": uploaded.id}},
            {"type": "text", "text": "What is the courier's password?"},
        ]
        with_file = client.messages.create(**asked)

        def prompt(message: anthropic.types.Message) -> int:  # a prefix cached by an earlier test counts too
            return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)

        assert prompt(with_file) > prompt(plain) + 100  # ~20 repetitions of the sentence
        assert with_file.content and with_file.stop_reason in ("end_turn", "max_tokens")
    finally:
        client.beta.files.delete(uploaded.id)


def test_passthrough_sends_documents_as_text_when_asked(llama_server):
    """llama-server's own /v1/messages drops `document` blocks: forwarded as sent
    (`documents = "forward"`), the prompt is the same size with or without one. By default
    (`"auto"`) the gateway recognises llama-server by its model list and sends documents as
    text: the prompt grows by about the document's tokens."""
    document = {"type": "document", "title": "Note", "source": {"type": "text", "media_type": "text/plain",
                "data": "The courier's password is tangerine. " * 20}}  # fmt: skip
    asked = _ask("What is the courier's password?", max_tokens=8)
    with_document = {
        **asked,
        "messages": [
            {"role": "user", "content": [document, {"type": "text", "text": "What is the courier's password?"}]}
        ],
    }

    def prompt(message: anthropic.types.Message) -> int:
        return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)

    forwarding, as_text = _gateway(llama_server, "anthropic", documents="forward"), _gateway(llama_server, "anthropic")
    try:
        router = as_text.app.state.gateway.router
        # the model list tells the gateway it is llama-server
        eventually(lambda: router.discovered.get("llama"), "llama's model list read", timeout=30)
        plain = prompt(_client(forwarding).messages.create(**asked))
        assert prompt(_client(forwarding).messages.create(**with_document)) == plain  # dropped by the server
        answered = _client(as_text).messages.create(**with_document)
        assert prompt(answered) > plain + 100  # ~20 repetitions of the sentence
        assert answered.content and answered.stop_reason in ("end_turn", "max_tokens")
    finally:
        forwarding.stop()
        as_text.stop()


def test_an_image_to_a_model_without_vision_is_a_400_not_a_retried_502(path):
    # SmolLM2 has no vision projector: llama-server answers 500 "image input is not supported",
    # in OpenAI's shape on its own /v1/messages too.
    _, gateway = path
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        _client(gateway).messages.create(
            **_ask("x") | {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}]}
        )
    assert "does not accept images" in caught.value.body["error"]["message"]
    assert caught.value.response.headers.get("x-should-retry") == "false"
