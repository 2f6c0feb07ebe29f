"""Keys while their database is out (issue 34): two gateways reach the session's PostgreSQL
through a TCP proxy the test cuts, freezes and restores (the shared server cannot be
stopped), a third reaches it directly, as a replica on the other side of a partition would.
The cut-off gateways keep serving the keys they hold (no 500, no wait), their Admin API
answers 503 with `retry-after`, and once the database is back they catch up with what
changed meanwhile within `poll_interval` plus a query (the tests wait with a bound for
failure only). A locked key table fails the reads within the statement timeout."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from tests.support.fakes import FakeUpstream
from tests.support.keys import answered, ask, create, keys_config, listing, update
from tests.support.postgres import locked, pg_url  # noqa: F401 (fixture)
from tests.support.servers import GatewayServer
from tests.support.tcp_proxy import TcpProxy, pg_proxy  # noqa: F401 (fixture)
from tests.support.waiting import eventually

pytestmark = [pytest.mark.heavy, pytest.mark.faults]  # several processes: the full suite runs it, --fast leaves it out

TIMEOUT = 2.0  # [usage] statement_timeout, seconds
CATCH_UP = 6.0  # seconds a test waits for a catch-up before failing (the design's bound: 1 s poll + a query)


def _gateway(gateway_from: Callable[[dict[str, Any]], GatewayServer], upstream: FakeUpstream, url: str) -> str:
    config = keys_config(upstream.url, admin={"poll_interval": 1.0},
                         usage={"database_url": url, "statement_timeout": TIMEOUT})  # fmt: skip
    return gateway_from(config).url


def _served(url: str, key: str) -> bool:
    try:
        ask(url, key)
    except anthropic.APIStatusError:
        return False
    return True


def _refused(url: str, key: str) -> bool:
    try:
        ask(url, key)
    except anthropic.AuthenticationError:
        return True
    return False


def _assert_503(call: Callable[[], object]) -> None:
    with pytest.raises(anthropic.APIStatusError) as raised:
        call()
    assert raised.value.status_code == 503, raised.value
    assert raised.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert raised.value.response.headers["retry-after"]


@pytest.fixture
def cut_off(
    upstream: FakeUpstream,
    pg_url: str,  # noqa: F811
    pg_proxy: tuple[TcpProxy, str],  # noqa: F811
    gateway_from: Callable[[dict[str, Any]], GatewayServer],
) -> Iterator[tuple[TcpProxy, list[str], str]]:
    """(the proxy, two gateways behind it, one reaching the database directly)."""
    proxy, proxied = pg_proxy
    behind = [_gateway(gateway_from, upstream, proxied) for _ in range(2)]
    direct = _gateway(gateway_from, upstream, pg_url)
    yield proxy, behind, direct


def test_cut_off_gateways_serve_the_keys_held_and_catch_up_when_it_returns(
    cut_off: tuple[TcpProxy, list[str], str],
) -> None:
    proxy, behind, direct = cut_off
    kept = eventually(answered(lambda: create(behind[0], name="kept")), "a key made", timeout=10)
    revoked = create(behind[0], name="revoked")
    for url in behind:
        for key in (kept["key"], revoked["key"]):
            eventually(answered(lambda url=url, key=key: ask(url, key)), "the keys served", timeout=CATCH_UP)  # type: ignore[misc]
    proxy.cut()
    update(direct, revoked["id"], status="inactive")  # on the other side of the partition
    new = eventually(answered(lambda: create(direct, name="new")), "a key made", timeout=10)
    for url in behind:
        assert _served(url, kept["key"])  # the keys held: no 500, no wait
        assert _served(url, revoked["key"])  # documented: a revocation cannot reach a process cut off
        assert _refused(url, new["key"])
        _assert_503(lambda url=url: listing(url))  # type: ignore[misc]
        _assert_503(lambda url=url: create(url, name="meanwhile"))  # type: ignore[misc]
    proxy.restore()
    for url in behind:
        eventually(lambda url=url: _refused(url, revoked["key"]), "the revocation heard", timeout=CATCH_UP)  # type: ignore[misc]
        eventually(lambda url=url: _served(url, new["key"]), "the new key heard", timeout=CATCH_UP)  # type: ignore[misc]
        assert _served(url, kept["key"])
    assert "meanwhile" not in {k["name"] for k in listing(direct)["data"]}


def test_a_frozen_database_holds_neither_requests_nor_the_admin_api(cut_off: tuple[TcpProxy, list[str], str]) -> None:
    """As a database stopped with SIGSTOP: connections open, nothing answered."""
    proxy, behind, direct = cut_off
    kept = eventually(answered(lambda: create(behind[0], name="kept")), "a key made", timeout=10)
    eventually(answered(lambda: ask(behind[1], kept["key"])), "the key served", timeout=CATCH_UP)
    proxy.freeze()
    try:
        new = create(direct, name="new")
        for url in behind:
            assert _served(url, kept["key"])
            _assert_503(lambda url=url: listing(url))  # type: ignore[misc]  # within the statement timeout
    finally:
        proxy.restore()
    for url in behind:
        eventually(lambda url=url: _served(url, new["key"]), "the new key heard", timeout=CATCH_UP + TIMEOUT)  # type: ignore[misc]
    assert listing(behind[0])["data"]


def test_a_locked_key_table_answers_503_and_holds_no_request(
    upstream: FakeUpstream,
    pg_url: str,  # noqa: F811
    gateway_from: Callable[[dict[str, Any]], GatewayServer],
) -> None:
    url = _gateway(gateway_from, upstream, pg_url)
    kept = eventually(answered(lambda: create(url, name="kept")), "a key made", timeout=10)
    with locked(pg_url, "dragoman_keys", "dragoman_keys_state"):
        for _ in range(3):
            assert _served(url, kept["key"])  # authentication never waits on the table
        _assert_503(lambda: listing(url))
        _assert_503(lambda: update(url, kept["id"], name="renamed"))
    assert update(url, kept["id"], name="renamed")["name"] == "renamed"


def test_one_warning_per_outage_for_the_keys_and_the_usage_records(
    upstream: FakeUpstream,
    pg_proxy: tuple[TcpProxy, str],  # noqa: F811
    gateway_from: Callable[[dict[str, Any]], GatewayServer],
    caplog: Any,
) -> None:
    """The keyring, the usage writer and the Admin API all find the same database out: one
    warning for the outage, one line for its end, nothing from the driver; the 503s counted."""
    proxy, proxied = pg_proxy
    config = keys_config(upstream.url, admin={"poll_interval": 1.0},
                         usage={"database_url": proxied, "statement_timeout": TIMEOUT})  # fmt: skip
    server = gateway_from(config)
    gateway = server.app.state.gateway
    kept = eventually(answered(lambda: create(server.url, name="kept")), "a key made", timeout=10)
    eventually(lambda: gateway.usage._opened, "the usage store opened", timeout=20)
    caplog.set_level(logging.INFO)
    caplog.clear()
    proxy.cut()
    assert _served(server.url, kept["key"])  # a usage record to write
    _assert_503(lambda: listing(server.url))
    refused = {"store": "database", "policy": "answer_503", "decision": "refused"}
    assert gateway.metrics.registry.get_sample_value("dragoman_store_outage_requests_total", refused) == 1
    eventually(lambda: gateway.keyring._failing and gateway.usage._failing, "both found it out", timeout=CATCH_UP)
    proxy.restore()
    eventually(lambda: not gateway.keyring._failing and not gateway.usage._failing, "both back", timeout=CATCH_UP)
    assert listing(server.url)["data"]
    lines = [(r.levelname, r.name) for r in caplog.records if r.name.split(".")[0] in ("dragoman", "asyncpg")
             and r.name != "dragoman.access"]  # fmt: skip
    assert len([level for level, _ in lines if level in ("WARNING", "ERROR")]) == 1, caplog.text
    assert [level for level, _ in lines if level == "INFO"] == ["INFO"], caplog.text
