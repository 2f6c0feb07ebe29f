"""Passthrough with `documents = "as_text"` (for servers such as llama-server, whose own
/v1/messages ignores document blocks): each document block reaches the upstream as a text
block holding the document as the translating path gives it to a model; the rest of the
body is as the client sent it. Without the option documents are forwarded unchanged."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import pytest

from dragoman.core.config_load import from_dict
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.samples import pdf_bytes
from tests.support.servers import GatewayServer
from tests.support.waiting import eventually


@pytest.fixture
def start(native: FakeAnthropic, gateway_from: Callable[[dict], GatewayServer]) -> Callable[..., anthropic.Anthropic]:
    """`start(protocol=..., **upstream)`: a client of a gateway in front of the native fake."""

    def run(protocol: str = "anthropic", **upstream: Any) -> anthropic.Anthropic:
        gateway = gateway_from({
            "upstreams": {"native": {"url": native.url, "protocol": protocol, "max_retries": 0, **upstream}},
            "models": [{"name": "claude-test", "upstream": "native"}],
        })  # fmt: skip
        return anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)

    return run


@pytest.fixture
def serve(gateway_from: Callable[[dict], GatewayServer]) -> Callable[..., GatewayServer]:
    """`serve(upstream, **server)`: a gateway with one upstream, serving it as `claude-test`."""

    def run(upstream: dict[str, Any], **server: Any) -> GatewayServer:
        return gateway_from(
            {
                "server": server,
                "upstreams": {"u": {"max_retries": 0, **upstream}},
                "models": [{"name": "claude-test", "upstream": "u"}],
            }
        )

    return run


def wait_listed(gateway: GatewayServer, upstream: str) -> None:
    """Until the upstream's model list has been read (it tells what server it is)."""
    router = gateway.app.state.gateway.router
    eventually(lambda: router.discovered.get(upstream), "the upstream's model list was read")


def ask(*blocks: dict, **extra: Any) -> dict:
    return {
        "model": "claude-test",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [*blocks, {"type": "text", "text": "Sum it up."}]}],
        **extra,
    }


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


def test_the_images_of_a_content_document_go_as_image_blocks_in_their_places(start, native):
    client = start(documents="as_text")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    scan = {"type": "document", "title": "Scan", "source": {"type": "content", "content": [{"type": "text", "text": "Page 1"}, image]},
            "cache_control": {"type": "ephemeral"}}  # fmt: skip
    client.messages.create(**ask(scan))
    _, body, _ = native.requests[0]
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": '<document title="Scan">'},
        {"type": "text", "text": "Page 1"},
        image,
        {
            "type": "text",
            "text": "</document>",
            "cache_control": {"type": "ephemeral"},
        },  # the breakpoint closes the document
        {"type": "text", "text": "Sum it up."},
    ]


def test_documents_in_tool_results_and_pdfs_are_text_too(start, native):
    client = start(documents="as_text")
    pdf = {
        "type": "document",
        "source": {
            "type": "base64",
            "media_type": "application/pdf",
            "data": base64.b64encode(pdf_bytes("Invoice 42 is paid")).decode(),
        },
    }
    client.messages.create(model="claude-test", max_tokens=10, messages=[
        {"role": "user", "content": "Read the invoice."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [pdf]}]},
    ])  # fmt: skip
    _, body, _ = native.requests[0]
    [result] = body["messages"][2]["content"][0]["content"]
    assert (
        result["type"] == "text"
        and "Invoice 42 is paid" in result["text"]
        and result["text"].startswith("<document>\n[page 1]")
    )
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


def test_auto_asks_for_the_model_list_when_a_request_has_documents_and_it_is_not_known(native, serve):
    """llama-server was still starting when the gateway first asked what it is: a request with
    documents asks again before it is sent, and its documents go as text."""
    native.owned_by, native.models_down = "llamacpp", True
    gateway = serve({"url": native.url, "protocol": "anthropic"})
    eventually(lambda: native.model_lists, "the start-up discovery, refused")
    native.models_down = False
    anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0).messages.create(**ask(NOTE))
    _, body, _ = native.requests[-1]
    assert body["messages"][0]["content"][0]["type"] == "text"


@pytest.mark.parametrize("setting, owned_by, as_text", [
    (None, "llamacpp", True),  # the default, "auto": llama-server is recognised by its model list
    (None, "vllm", False),
    ("forward", "llamacpp", False),
    ("as_text", "vllm", True),
])  # fmt: skip
def test_auto_sends_documents_as_text_to_llama_server(native, serve, setting, owned_by, as_text):
    native.owned_by = owned_by
    gateway = serve({"url": native.url, "protocol": "anthropic", **({"documents": setting} if setting else {})})
    wait_listed(gateway, "u")
    anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0).messages.create(**ask(NOTE))
    _, body, _ = native.requests[-1]
    assert (body["messages"][0]["content"][0]["type"] == "text") is as_text


def test_an_auto_upstream_that_chose_passthrough_takes_the_option(start, native):
    client = start(protocol="auto", documents="as_text")
    client.messages.create(**ask(NOTE))
    _, body, _ = [r for r in native.requests if r[0] == "/v1/messages"][-1]  # after the probe
    assert body["messages"][0]["content"][0]["type"] == "text"


class _SlowMissing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        time.sleep(0.8)  # longer than the gateway's keep-alive interval below
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_docs() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowMissing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()  # the listening socket: shutdown() only ends serve_forever


def _broken_pdf() -> bytes:
    """A two-page PDF with two bytes damaged (found by fuzzing): pypdf raises LimitReachedError."""
    data = bytearray(pdf_bytes("hello world", "page two"))
    data[21], data[608] = 183, 70
    return bytes(data)


def test_a_damaged_pdf_is_a_400_naming_it_not_a_500(start, native):
    """pypdf raises other errors than PdfReadError on some damaged files: still a 400."""
    client = start(documents="as_text")
    document = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(_broken_pdf()).decode()},
    }
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**ask(document))
    assert caught.value.body["error"]["message"].startswith("messages.0.content.0.source.data")
    assert native.requests == []


def test_a_streamed_request_whose_document_url_cannot_be_fetched_is_a_400(native, serve, slow_docs):
    """The body is prepared before a stream is committed: a URL document that answers 404
    after longer than a keep-alive interval is still a 400, not a 200 with an error event."""
    gateway = serve({"url": native.url, "protocol": "anthropic", "documents": "as_text"},
                    fetch_documents=True, fetch_allow_private=True, keepalive_interval=0.2)  # fmt: skip
    document = {"type": "document", "source": {"type": "url", "url": slow_docs + "/gone.pdf"}}
    response = httpx.post(gateway.url + "/v1/messages", json=ask(document, stream=True), timeout=30)
    assert native.requests == []
    assert response.status_code == 400, (response.status_code, response.text[:300])


@pytest.mark.parametrize(
    "document, named",
    [
        (
            {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
            "messages.0.content.0.source",
        ),
        (
            {"type": "document", "source": {"type": "base64", "media_type": "text/csv", "data": "YQ=="}},
            "messages.0.content.0.source.media_type",
        ),
        (
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "not base64!"}},
            "messages.0.content.0.source.data",
        ),
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


def test_pdf_text_is_extracted_off_the_event_loop(native, upstream, serve, monkeypatch):
    """A PDF's text extraction (about a second per MB) runs in a thread on both paths, passing
    through and translating: the event loop keeps serving other clients meanwhile."""
    from dragoman.backends import documents
    from dragoman.translate import content

    in_a_thread: list[bool] = []
    real = content.document_text

    def watched(block: Any, where: str, clock: Any) -> str:
        try:
            asyncio.get_running_loop()
            in_a_thread.append(False)
        except RuntimeError:  # no loop runs in this thread
            in_a_thread.append(True)
        return real(block, where, clock)

    monkeypatch.setattr(documents, "document_text", watched)
    monkeypatch.setattr(content, "document_text", watched)
    pdf = {
        "type": "document",
        "source": {
            "type": "base64",
            "media_type": "application/pdf",
            "data": base64.b64encode(pdf_bytes("Invoice 42")).decode(),
        },
    }
    for where in ({"url": native.url, "protocol": "anthropic", "documents": "as_text"}, {"url": upstream.url}):
        gateway = serve(where)
        anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0).messages.create(**ask(pdf))
    assert in_a_thread == [True, True]
    assert "Invoice 42" in str(upstream.requests[0]["messages"])
