"""Passthrough with `documents = "as_text"` (for servers such as llama-server, whose own
/v1/messages ignores document blocks): each document block reaches the upstream as a text
block holding the document as the translating path gives it to a model; the rest of the
body is as the client sent it. Without the option documents are forwarded unchanged."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from dragoman.config import from_dict
from tests.fake_anthropic import FakeAnthropic
from tests.samples import pdf_bytes
from tests.servers import GatewayServer


@pytest.fixture
def native() -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic().start()
    yield fake
    fake.stop()


@pytest.fixture
def start(native: FakeAnthropic) -> Iterator[Callable[..., anthropic.Anthropic]]:
    started: list[GatewayServer] = []

    def run(protocol: str = "anthropic", **upstream: Any) -> anthropic.Anthropic:
        config = from_dict({
            "upstreams": {"native": {"url": native.url, "protocol": protocol, "max_retries": 0, **upstream}},
            "models": [{"name": "claude-test", "upstream": "native"}],
        })  # fmt: skip
        gateway = GatewayServer(config).start()
        started.append(gateway)
        return anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)

    yield run
    for gateway in started:
        gateway.stop()


def wait_listed(gateway: GatewayServer, upstream: str) -> None:
    """Until the upstream's model list has been read (it tells what server it is)."""
    router = gateway.app.state.gateway.router
    deadline = time.monotonic() + 5
    while not router.discovered.get(upstream):
        assert time.monotonic() < deadline, "no model list"
        time.sleep(0.01)


def ask(*blocks: dict, **extra: Any) -> dict:
    return {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": [*blocks, {"type": "text", "text": "Sum it up."}]}], **extra}


NOTE = {"type": "document", "title": "Note", "context": "from the desk", "source": {"type": "text", "media_type": "text/plain", "data": "The key is under the mat."},
        "cache_control": {"type": "ephemeral"}, "citations": {"enabled": True}}  # fmt: skip


def test_a_text_document_goes_as_a_text_block_and_the_rest_is_unchanged(start, native):
    client = start(documents="as_text")
    client.messages.create(**ask(NOTE), extra_body={"some_future_field": [1, 2]})
    _, body, _ = native.requests[0]
    first, second = body["messages"][0]["content"]
    assert first == {
        "type": "text",
        "text": '<document title="Note">\n<context>from the desk</context>\nThe key is under the mat.\n</document>',
        "cache_control": {"type": "ephemeral"},  # the breakpoint stays where the client put it
    }
    assert second == {"type": "text", "text": "Sum it up."}
    assert body["some_future_field"] == [1, 2]


def test_documents_in_tool_results_and_pdfs_are_text_too(start, native):
    client = start(documents="as_text")
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(pdf_bytes("Invoice 42 is paid")).decode()}}
    client.messages.create(model="claude-test", max_tokens=10, messages=[
        {"role": "user", "content": "Read the invoice."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [pdf]}]},
    ])  # fmt: skip
    _, body, _ = native.requests[0]
    [result] = body["messages"][2]["content"][0]["content"]
    assert result["type"] == "text" and "Invoice 42 is paid" in result["text"] and result["text"].startswith("<document>\n[page 1]")
    assert body["messages"][0]["content"] == "Read the invoice."


def test_count_tokens_sees_the_same_text(start, native):
    client = start(documents="as_text")
    client.messages.count_tokens(model="claude-test", messages=ask(NOTE)["messages"])
    path, body, _ = native.requests[0]
    assert path == "/v1/messages/count_tokens"
    assert body["messages"][0]["content"][0]["type"] == "text"


def test_documents_are_forwarded_unchanged_to_other_servers_by_default(start, native):
    client = start()
    client.messages.create(**ask(NOTE))
    _, body, _ = native.requests[0]
    assert body["messages"][0]["content"][0] == NOTE


@pytest.mark.parametrize("setting, owned_by, as_text", [
    (None, "llamacpp", True),  # the default, "auto": llama-server is recognised by its model list
    (None, "vllm", False),
    ("forward", "llamacpp", False),
    ("as_text", "vllm", True),
])  # fmt: skip
def test_auto_sends_documents_as_text_to_llama_server(native, setting, owned_by, as_text):
    native.owned_by = owned_by
    upstream = {"url": native.url, "protocol": "anthropic", "max_retries": 0, **({"documents": setting} if setting else {})}
    gateway = GatewayServer(from_dict({"upstreams": {"native": upstream}, "models": [{"name": "claude-test", "upstream": "native"}]})).start()
    try:
        wait_listed(gateway, "native")
        anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0).messages.create(**ask(NOTE))
    finally:
        gateway.stop()
    _, body, _ = native.requests[-1]
    assert (body["messages"][0]["content"][0]["type"] == "text") is as_text


def test_an_auto_upstream_that_chose_passthrough_takes_the_option(start, native):
    client = start(protocol="auto", documents="as_text")
    client.messages.create(**ask(NOTE))
    path, body, _ = [r for r in native.requests if r[0] == "/v1/messages"][-1]  # after the probe
    assert body["messages"][0]["content"][0]["type"] == "text"


@pytest.mark.parametrize(
    "document, named",
    [
        ({"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}, "messages.0.content.0.source"),
        ({"type": "document", "source": {"type": "base64", "media_type": "text/csv", "data": "YQ=="}}, "messages.0.content.0.source.media_type"),
        ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "not base64!"}}, "messages.0.content.0.source.data"),
        ({"type": "document", "source": {"type": "nonsense"}}, "messages.0.content.0"),
    ],
)
def test_a_document_that_cannot_become_text_is_a_400_naming_it(start, native, document, named):
    client = start(documents="as_text")
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**ask(document))
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(named)
    assert native.requests == []  # nothing half-converted was sent


def test_an_unknown_documents_value_is_a_config_error() -> None:
    with pytest.raises(Exception, match="documents"):
        from_dict({"upstreams": {"n": {"url": "http://127.0.0.1:1", "protocol": "anthropic", "documents": "maybe"}}})
