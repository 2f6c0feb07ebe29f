"""TLS to the upstream: verification, a private CA bundle, and client certificates."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from tests.support.fakes import FakeUpstream
from tests.support.samples import self_signed

BODY = {"model": "test-model", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("tls")
    server_cert, server_key = self_signed(directory, "upstream")
    client_cert, client_key = self_signed(directory, "client")
    return {"server_cert": server_cert, "server_key": server_key, "client_cert": client_cert, "client_key": client_key}


def _tls_upstream(certs: dict[str, Path], *, require_client: bool = False) -> FakeUpstream:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs["server_cert"], certs["server_key"])
    if require_client:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certs["client_cert"])
    return FakeUpstream(ssl_context=context).start()


def test_an_unknown_certificate_is_refused_by_default(make_gateway, certs):
    upstream = _tls_upstream(certs)
    try:
        gateway = make_gateway(url=upstream.url, server={"default_model": "test-model"})
        response = httpx.post(gateway.url + "/v1/messages", json=BODY)
    finally:
        upstream.stop()
    assert response.status_code == 502
    assert "certificate" in response.json()["error"]["message"].lower()


def test_a_ca_bundle_makes_it_trusted(make_gateway, certs):
    upstream = _tls_upstream(certs)
    try:
        gateway = make_gateway(url=upstream.url, upstream={"ca_bundle": str(certs["server_cert"])})
        response = httpx.post(gateway.url + "/v1/messages", json=BODY)
    finally:
        upstream.stop()
    assert response.status_code == 200, response.text


def test_verification_can_be_turned_off(make_gateway, certs):
    upstream = _tls_upstream(certs)
    try:
        gateway = make_gateway(url=upstream.url, upstream={"tls_verify": False})
        response = httpx.post(gateway.url + "/v1/messages", json=BODY)
    finally:
        upstream.stop()
    assert response.status_code == 200, response.text


def test_client_certificates(make_gateway, certs):
    upstream = _tls_upstream(certs, require_client=True)
    try:
        with_cert = make_gateway(url=upstream.url, upstream={
            "ca_bundle": str(certs["server_cert"]), "client_cert": str(certs["client_cert"]), "client_key": str(certs["client_key"]),
        }, server={"default_model": "test-model"})  # fmt: skip
        without = make_gateway(
            url=upstream.url, upstream={"ca_bundle": str(certs["server_cert"])}, server={"default_model": "test-model"}
        )
        assert httpx.post(with_cert.url + "/v1/messages", json=BODY).status_code == 200
        assert httpx.post(without.url + "/v1/messages", json=BODY).status_code == 502
    finally:
        upstream.stop()


def test_a_missing_ca_bundle_is_a_startup_error(upstream, tmp_path):
    from dragoman.core.config import ConfigError
    from tests.support.servers import make_config

    with pytest.raises(ConfigError, match=r"upstreams\.default\.ca_bundle: no such file"):
        make_config(upstream.url, upstream={"ca_bundle": str(tmp_path / "missing.pem")})


def test_a_client_certificate_is_presented_even_without_verification(make_gateway, certs):
    upstream = _tls_upstream(certs, require_client=True)
    try:
        gateway = make_gateway(url=upstream.url, upstream={
            "tls_verify": False, "client_cert": str(certs["client_cert"]), "client_key": str(certs["client_key"]),
        }, server={"default_model": "test-model"})  # fmt: skip
        assert httpx.post(gateway.url + "/v1/messages", json=BODY).status_code == 200
    finally:
        upstream.stop()
