"""The server protocol: the direct body writer is on with the uvicorn installed, and off
(uvicorn's own protocol) if uvicorn's request cycle no longer has what it reads."""

from __future__ import annotations

import pytest
from uvicorn.protocols.http import httptools_impl

from dragoman import serving


def test_the_installed_uvicorn_gets_the_direct_writer() -> None:
    # If this fails after a uvicorn upgrade, streams still work (through ASGI `send`), but
    # about 3 µs slower per token: adapt DirectBody to the new request cycle.
    assert serving.http_protocol() is serving.DirectBodyProtocol


def test_a_changed_request_cycle_falls_back_to_uvicorns_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed_init(self: object, scope: object, transport: object) -> None:
        self.scope = scope  # type: ignore[attr-defined]
        self.writer = transport  # type: ignore[attr-defined]

    monkeypatch.setattr(httptools_impl.RequestResponseCycle, "__init__", changed_init)
    assert serving.http_protocol() == "httptools"


def test_without_httptools_the_server_is_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "HTTPTOOLS", False)
    assert serving.http_protocol() == "h11"
