"""The server protocol: the direct body writer is on with the uvicorn installed, and off
(uvicorn's own protocol) if uvicorn's request cycle no longer has what it reads."""

from __future__ import annotations

import logging

import pytest
from uvicorn.protocols.http import httptools_impl

from dragoman.server import serving


def test_the_installed_uvicorn_gets_the_direct_writer() -> None:
    # If this fails after a uvicorn upgrade, streams still work (through ASGI `send`), but
    # about 3 µs slower per token: adapt DirectBody to the new request cycle.
    assert serving.http_protocol() is serving.DirectBodyProtocol


def test_a_connection_limit_reaches_worker_processes() -> None:
    """`--workers` hands uvicorn's config, protocol included, to spawned processes by pickling."""
    import pickle

    protocol = pickle.loads(pickle.dumps(serving.http_protocol(7)))
    assert protocol.func is serving.DirectBodyProtocol and protocol.keywords == {"max_connections": 7}


def test_the_pinned_uvicorn_gets_the_hooked_protocol_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dragoman"):
        assert serving.http_protocol() is serving.DirectBodyProtocol
    assert not [r for r in caplog.records if r.name == "dragoman"]


def test_a_changed_uvicorn_is_a_warning_naming_what_changed_and_the_h11_server(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(serving, "_CYCLE_ATTRIBUTES", (*serving._CYCLE_ATTRIBUTES, "renamed_in_a_later_uvicorn"))
    with caplog.at_level(logging.WARNING, logger="dragoman"):
        options = serving.server_options()
    assert options["http"] == "h11"
    assert options["h11_max_incomplete_event_size"] == serving.MAX_HEAD_BYTES
    [record] = [r for r in caplog.records if r.name == "dragoman"]
    assert record.levelno == logging.WARNING
    assert "renamed_in_a_later_uvicorn" in record.getMessage() and "h11" in record.getMessage()


def test_without_httptools_the_server_is_h11_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(serving, "HTTPTOOLS", False)
    with caplog.at_level(logging.WARNING, logger="dragoman"):
        assert serving.http_protocol() == "h11"
    assert any("httptools is not installed" in r.getMessage() for r in caplog.records)


def test_a_changed_request_cycle_falls_back_to_uvicorns_h11_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed_init(self: object, scope: object, transport: object) -> None:
        self.scope = scope  # type: ignore[attr-defined]
        self.writer = transport  # type: ignore[attr-defined]

    monkeypatch.setattr(httptools_impl.RequestResponseCycle, "__init__", changed_init)
    assert serving.http_protocol() == "h11"  # with a warning (tests/integration/test_plain_server.py)


def test_without_httptools_the_server_is_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "HTTPTOOLS", False)
    assert serving.http_protocol() == "h11"


def test_a_changed_flow_control_falls_back_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from uvicorn.protocols.http import flow_control

    def changed_init(self: object, transport: object) -> None:
        self.transport = transport  # type: ignore[attr-defined]
        self.paused_for_writes = False  # type: ignore[attr-defined]

    monkeypatch.setattr(flow_control.FlowControl, "__init__", changed_init)
    assert serving.http_protocol() == "h11"  # with a warning (tests/integration/test_plain_server.py)


def test_a_changed_protocol_falls_back_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed_init(self: object, config: object, server_state: object, app_state: object) -> None:
        self.scope = None  # type: ignore[attr-defined]
        self.cycle = None  # type: ignore[attr-defined]
        self.keep_alive_timeout = 5  # type: ignore[attr-defined]  # renamed: the idle close reads timeout_keep_alive

    monkeypatch.setattr(httptools_impl.HttpToolsProtocol, "__init__", changed_init)
    assert serving.http_protocol() == "h11"  # with a warning (tests/integration/test_plain_server.py)


class Transport:
    def __init__(self, *, closing: bool = False, refuses: bool = False) -> None:
        self.written: list[bytes] = []
        self.closing = closing
        self.refuses = refuses

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        if self.refuses:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")
        self.written.append(data)


class Flow:
    write_paused = False


class Cycle:
    """The attributes of uvicorn's request cycle that DirectBody reads, for a started chunked body."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.flow = Flow()
        self.chunked_encoding: bool | None = True
        self.disconnected = False
        self.response_complete = False


def test_the_writer_frames_each_chunk_and_skips_empty_ones() -> None:
    transport = Transport()
    body = serving.DirectBody(Cycle(transport))
    assert body.ready()
    body.write(b"event: ping\n\n")
    body.write(b"")  # would be the terminating chunk
    assert transport.written == [b"d\r\nevent: ping\n\n\r\n"]


@pytest.mark.parametrize(
    "change",
    [
        lambda cycle: setattr(cycle, "chunked_encoding", None),  # the head has not gone out
        lambda cycle: setattr(cycle, "chunked_encoding", False),  # a Content-Length body
        lambda cycle: setattr(cycle.flow, "write_paused", True),  # the client's socket is full
        lambda cycle: setattr(cycle, "disconnected", True),
        lambda cycle: setattr(cycle, "response_complete", True),
        lambda cycle: setattr(cycle.transport, "closing", True),  # closing, not yet noticed by uvicorn
    ],
)
def test_the_writer_is_not_ready_unless_the_body_can_take_a_chunk_now(change: object) -> None:
    cycle = Cycle(Transport())
    cycle.flow = Flow()
    change(cycle)  # type: ignore[operator]
    assert not serving.DirectBody(cycle).ready()


def test_a_write_the_transport_refuses_is_dropped_and_the_writer_stays_unready() -> None:
    transport = Transport(refuses=True)
    body = serving.DirectBody(Cycle(transport))
    body.write(b"data")  # does not raise: it runs inside the upstream connection's callback
    assert not body.ready()
    transport.refuses = False
    assert not body.ready()
