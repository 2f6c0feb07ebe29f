"""The gateway reaching its upstream through an HTTP forward proxy: absolute-form
requests with the proxy's credentials for http:// upstreams, a CONNECT tunnel and TLS
for https:// ones, and a proxy's refusal reported without its credentials."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import httpx
import pytest

from tests.support.fakes import FakeUpstream, text_stream
from tests.support.forward_proxy import ForwardProxy
from tests.support.samples import self_signed
from tests.support.servers import sse_frames

BODY = {"model": "test-model", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
CREDENTIALS = "Basic " + base64.b64encode(b"user:pw").decode()


def _post(gateway, body: dict) -> httpx.Response:
    # trust_env=False: the test's own request goes straight to the gateway, whatever HTTP_PROXY says
    return httpx.post(gateway.url + "/v1/messages", json=body, timeout=10, trust_env=False)


def _chat_posts(proxy: ForwardProxy) -> list:
    """The requests forwarded to the upstream's chat endpoint (discovery also POSTs /tokenize,
    to find out whether the model's chat template renders tools)."""
    return [s for s in proxy.forwarded if s.line.startswith("POST ") and "/chat/completions" in s.line]


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"), "upstream")


def _tls_upstream(cert: tuple[Path, Path]) -> FakeUpstream:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    return FakeUpstream(ssl_context=context).start()


def test_messages_through_a_proxy_in_absolute_form_with_its_credentials(make_gateway, upstream):
    with ForwardProxy().in_thread() as proxy:
        gateway = make_gateway(
            upstream={"proxy": f"http://user:pw@127.0.0.1:{proxy.port}"}, server={"default_model": "test-model"}
        )
        response = _post(gateway, BODY)
        assert response.status_code == 200, response.text
        assert response.json()["content"] == [{"type": "text", "text": "Hello!"}]
        assert len(upstream.requests) == 1
        posts = _chat_posts(proxy)
        assert [s.line for s in posts] == [f"POST http://127.0.0.1:{upstream.port}/v1/chat/completions HTTP/1.1"]
        assert posts[0].headers["proxy-authorization"] == CREDENTIALS
        assert posts[0].headers["host"] == f"127.0.0.1:{upstream.port}"
        assert all(s.headers.get("proxy-authorization") == CREDENTIALS for s in proxy.seen)
        assert proxy.connects == []


def test_a_stream_through_a_proxy_arrives_whole(make_gateway, upstream):
    with ForwardProxy().in_thread() as proxy:
        gateway = make_gateway(
            upstream={"proxy": f"http://user:pw@127.0.0.1:{proxy.port}"}, server={"default_model": "test-model"}
        )
        upstream.stream_reply(text_stream("Hel", "lo ", "there"))
        response = _post(gateway, {**BODY, "stream": True})
        assert response.status_code == 200, response.text
        frames = sse_frames(response.text)
        text = "".join(data["delta"]["text"] for event, data in frames if event == "content_block_delta")
        assert text == "Hello there"
        assert frames[-1][0] == "message_stop"
        assert any(
            s.line.startswith(f"POST http://127.0.0.1:{upstream.port}/v1/chat/completions ") for s in proxy.forwarded
        )


def test_repeated_requests_reuse_the_connection_to_the_proxy(make_gateway, upstream):
    with ForwardProxy().in_thread() as proxy:
        gateway = make_gateway(upstream={"proxy": proxy.url}, server={"default_model": "test-model"})
        gateway.wait_discovered()  # model discovery (GET /v1/models) is done with its connection: no second one in parallel
        for _ in range(3):
            assert _post(gateway, BODY).status_code == 200
        assert len(_chat_posts(proxy)) == 3
        assert proxy.connections == 1
        assert all("proxy-authorization" not in s.headers for s in proxy.seen)  # no credentials in the URL: none sent


def test_an_https_upstream_through_a_proxy_with_a_ca_bundle(make_gateway, cert):
    upstream = _tls_upstream(cert)
    try:
        with ForwardProxy().in_thread() as proxy:
            gateway = make_gateway(url=upstream.url, upstream={
                "proxy": f"http://user:pw@127.0.0.1:{proxy.port}", "ca_bundle": str(cert[0]),
            }, server={"default_model": "test-model"})  # fmt: skip
            response = _post(gateway, BODY)
            assert response.status_code == 200, response.text
            assert response.json()["content"][0]["text"] == "Hello!"
            assert proxy.forwarded == []  # nothing in the clear: everything went through the tunnel
            assert {s.line for s in proxy.connects} == {f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1"}
            assert all(s.headers["proxy-authorization"] == CREDENTIALS for s in proxy.connects)
            assert len(upstream.requests) == 1
            assert "proxy-authorization" not in {
                name.lower() for name in upstream.headers[0]
            }  # not sent inside the tunnel
    finally:
        upstream.stop()


def test_a_proxy_refusing_connect_is_a_502_naming_the_status_not_the_credentials(make_gateway, cert):
    upstream = _tls_upstream(cert)
    try:
        with ForwardProxy(connect_status=407).in_thread() as proxy:
            gateway = make_gateway(url=upstream.url, upstream={
                "proxy": f"http://user:secret-pw@127.0.0.1:{proxy.port}", "ca_bundle": str(cert[0]),
            }, server={"default_model": "test-model"})  # fmt: skip
            response = _post(gateway, BODY)
            assert response.status_code == 502, response.text
            message = response.json()["error"]["message"]
            assert "unreachable" in message and "407" in message, message
            assert "secret-pw" not in response.text
            assert upstream.requests == []
    finally:
        upstream.stop()


def test_the_environment_proxy_is_used_when_none_is_configured(make_gateway, upstream, monkeypatch):
    for name in (
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)
    with ForwardProxy().in_thread() as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://env:pw@127.0.0.1:{proxy.port}")
        gateway = make_gateway(server={"default_model": "test-model"})
        assert _post(gateway, BODY).status_code == 200
        posts = _chat_posts(proxy)
        assert [s.line for s in posts] == [f"POST http://127.0.0.1:{upstream.port}/v1/chat/completions HTTP/1.1"]
        assert posts[0].headers["proxy-authorization"] == "Basic " + base64.b64encode(b"env:pw").decode()
