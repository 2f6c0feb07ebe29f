"""Image URLs never reach a model server: vLLM, SGLang and llama.cpp would fetch them from
inside the network they run in. The gateway fetches each one under the rules URL documents
have (public addresses only unless `fetch_allow_private`) and sends the image inline."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp.connector
import anthropic
import httpx
import pytest

from dragoman.core.config_load import from_dict
from tests.support.batches import results_of, wait_ended
from tests.support.envelopes import error_of, raw_error
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.samples import TINY_PNG
from tests.support.servers import GatewayServer

PNG = base64.b64encode(TINY_PNG).decode()
SERVED: list[str] = []  # the paths the image server was asked for


class _Images(BaseHTTPRequestHandler):
    """/png answers the tiny PNG (as application/octet-stream: its bytes decide); anything else, text."""

    def do_GET(self) -> None:  # noqa: N802
        SERVED.append(self.path)
        body = TINY_PNG if self.path == "/png" else b"not an image"
        self.send_response(200)
        self.send_header("content-type", "application/octet-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def images() -> Iterator[str]:
    SERVED.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _image(url: str) -> dict:
    return {"type": "image", "source": {"type": "url", "url": url}}


def _places(url: str) -> list[list[dict]]:
    """An image URL as a user block, inside a tool result, and inside a `content` document."""
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [_image(url)]}
    document = {"type": "document", "source": {"type": "content", "content": [_image(url)]}}
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}]}
    return [
        [{"role": "user", "content": [_image(url), {"type": "text", "text": "What is this?"}]}],
        [{"role": "user", "content": "Look."}, call, {"role": "user", "content": [result]}],
        [{"role": "user", "content": [document, {"type": "text", "text": "What is this?"}]}],
    ]


TOOLS = [{"name": "look", "input_schema": {"type": "object"}}]
PRIVATE = ["http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:6379/", "http://[::1]/x.png"]


@pytest.mark.parametrize("url", PRIVATE)
def test_an_image_url_to_a_private_address_is_a_400_and_the_model_server_sees_nothing(client, upstream, url):
    for messages in _places(url):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="test-model", max_tokens=10, messages=messages, tools=TOOLS)
        assert "refusing to fetch from a private, loopback or reserved address" in error_of(
            caught, 400, "invalid_request_error"
        )
    assert upstream.requests == []


def test_a_name_that_resolves_to_loopback_is_refused_too(client, upstream, images):
    port = images.rsplit(":", 1)[1]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="test-model", max_tokens=10, messages=_places(f"http://localhost:{port}/png")[0])
    assert "image URL host 'localhost'" in error_of(caught, 400, "invalid_request_error")
    assert upstream.requests == []


# 127.0.0.1 as the socket layer reads it, not as `ipaddress` does: a number, octal, hex, fewer parts.
NUMERIC_LOOPBACK = ["2130706433", "127.1", "0177.0.0.1", "0", "0x7f.1", "017700000001", "0x7f000001", "0x7f.0.0.1"]
NUMERIC_REFUSED = "refusing a numeric host not written as four decimal numbers"


@pytest.fixture
def old_aiohttp(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp as before 3.14.1 (aio-libs/aiohttp#12827): a host of digits and dots is connected
    to as it is, the public-only resolver never asked. (Hex forms reach the resolver anyway.)"""
    monkeypatch.setattr(aiohttp.connector, "is_canonical_ipv4_address", lambda host: True)


@pytest.mark.parametrize("host", NUMERIC_LOOPBACK)
@pytest.mark.usefixtures("old_aiohttp")
def test_a_numeric_loopback_host_is_refused_whatever_aiohttp_does(client, upstream, images, host):
    port = images.rsplit(":", 1)[1]
    for messages in _places(f"http://{host}:{port}/png"):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model="test-model", max_tokens=10, messages=messages, tools=TOOLS)
        assert NUMERIC_REFUSED in error_of(caught, 400, "invalid_request_error")
    assert upstream.requests == [] and SERVED == []


@pytest.mark.usefixtures("old_aiohttp")
def test_a_numeric_loopback_host_in_a_batch_request_is_refused_too(client, upstream, images):
    port = images.rsplit(":", 1)[1]
    requests = [{"custom_id": f"host-{n}", "params": {"model": "test-model", "max_tokens": 10,
                                                      "messages": _places(f"http://{host}:{port}/png")[0]}}
                for n, host in enumerate(NUMERIC_LOOPBACK)]  # fmt: skip
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    wait_ended(client, created.id)
    results = results_of(client, created.id)
    assert len(results) == len(NUMERIC_LOOPBACK)
    for result in results.values():
        assert result.type == "errored" and result.error.error.type == "invalid_request_error", result
        assert NUMERIC_REFUSED in result.error.error.message
    assert upstream.requests == [] and SERVED == []


def test_an_allowed_image_url_reaches_the_model_inline_never_as_a_url(make_gateway, upstream, images):
    gateway = make_gateway(server={"fetch_allow_private": True})
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    for messages in _places(f"{images}/png"):
        client.messages.create(model="test-model", max_tokens=10, messages=messages, tools=TOOLS)
    sent = str(upstream.requests)
    assert images not in sent and sent.count(f"data:image/png;base64,{PNG}") == 3
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="test-model", max_tokens=10, messages=_places(f"{images}/text")[0])
    assert "not a JPEG, PNG, GIF or WebP image" in error_of(caught, 400, "invalid_request_error")


def _passthrough(native: FakeAnthropic, routes: list[dict] | None = None, **server: object) -> GatewayServer:
    return GatewayServer(from_dict({
        "server": server,
        "upstreams": {"native": {"url": native.url + "/v1", "protocol": "anthropic", "max_retries": 0}},
        "models": [{"name": "claude-test", "upstream": "native", "upstream_model": "claude-test", "vision": True}],
        "routes": routes or [],
    })).start()  # fmt: skip


def test_passthrough_image_urls_are_held_to_the_same_rule(native, images):
    for server, allowed in (({}, False), ({"fetch_allow_private": True}, True)):
        gateway = _passthrough(native, **server)
        try:
            client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
            for messages in _places(f"{images}/png"):
                if allowed:
                    client.messages.create(model="claude-test", max_tokens=10, messages=messages, tools=TOOLS)
                else:
                    with pytest.raises(anthropic.BadRequestError):
                        client.messages.create(model="claude-test", max_tokens=10, messages=messages, tools=TOOLS)
        finally:
            gateway.stop()
    sent = [body for path, body, _ in native.requests if path.endswith("/messages")]
    assert len(sent) == 3 and images not in str(sent)
    assert str(sent).count(f"'data': '{PNG}'") == 3


def test_an_image_url_spelled_with_json_escapes_is_caught_too(client, upstream, native):
    """`"\\u0075rl"` decodes to `"url"`: a pre-check on the raw bytes must not let it through."""
    raw = (b'{"model": "%s", "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "im\\u0061ge", '
           b'"source": {"type": "\\u0075rl", "\\u0075rl": "http://169.254.169.254/"}}]}]}')  # fmt: skip
    gateway = _passthrough(native)
    try:
        for url, model in ((str(client.base_url).rstrip("/"), b"test-model"), (gateway.url, b"claude-test")):
            response = httpx.post(f"{url}/v1/messages", content=raw % model, timeout=10,
                                  headers={"content-type": "application/json", "x-api-key": "k"})  # fmt: skip
            assert "refusing to fetch from a private" in raw_error(response, 400, "invalid_request_error")
    finally:
        gateway.stop()
    assert upstream.requests == [] and native.requests == []


def test_an_images_route_and_the_url_check_share_one_read_of_the_messages(native, images):
    """With a route on images, the messages the route read are the ones the URL check looks
    through (protocol.blocks): an allowed URL still arrives inline, an escaped private one is refused."""
    vision = [{"name": "vision", "when": {"images": True}, "model": "claude-test"}]
    gateway = _passthrough(native, vision, fetch_allow_private=True)
    try:
        client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
        for messages in _places(f"{images}/png")[:2]:  # a user block, a tool result
            raw = client.messages.with_raw_response.create(model="claude-test", max_tokens=10, messages=messages,
                                                           tools=TOOLS)  # fmt: skip
            assert raw.headers["x-dragoman-route"] == "vision"
    finally:
        gateway.stop()
    sent = [body for path, body, _ in native.requests if path.endswith("/messages")]
    assert len(sent) == 2 and images not in str(sent) and str(sent).count(f"'data': '{PNG}'") == 2
