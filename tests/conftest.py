from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest

from dragoman.assembly.gateway import Timings
from dragoman.core.config_load import from_dict
from tests.support import redis_server, servers
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fakes import FakeUpstream
from tests.support.serve_process import _kill
from tests.support.servers import GatewayServer, config_for, make_config


@pytest.fixture(autouse=True)
def private_data_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files and batches a test's gateways keep go to a directory of the test's own: never
    the user's, and never one a later test's gateway would find (and take batches over from)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data-home")))


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port where nothing listens (connections refused), held for the whole test."""
    with servers.dead_port() as port:
        yield port


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream().start()
    yield fake
    fake.stop()


@pytest.fixture
def fakes() -> Iterator[tuple[FakeUpstream, FakeUpstream]]:
    """Two scripted upstreams (routes and fallbacks between models)."""
    a, b = FakeUpstream().start(), FakeUpstream().start()
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture
def gateway(upstream: FakeUpstream) -> Iterator[GatewayServer]:
    server = GatewayServer(config_for(upstream.url)).start()
    yield server
    server.stop()


@pytest.fixture
def client(gateway: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="test-key", max_retries=0)


@pytest.fixture
def native() -> Iterator[FakeAnthropic]:
    """A scripted Anthropic-native upstream, for the passthrough path."""
    fake = FakeAnthropic().start()
    yield fake
    fake.stop()


@pytest.fixture
def gateway_from() -> Iterator[Callable[[dict[str, Any]], GatewayServer]]:
    """Start a gateway from a config dict (as a TOML file would give it); stopped at teardown."""
    started: list[GatewayServer] = []

    def start(data: dict[str, Any], *, timings: Timings | None = None) -> GatewayServer:
        server = GatewayServer(from_dict(data), timings=timings).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def make_gateway(upstream: FakeUpstream) -> Iterator[Callable[..., GatewayServer]]:
    """Start a gateway with a custom config: `make_gateway(server={...}, upstream={...},
    models=[...], url=...)`; `url` defaults to the fake upstream's. Stopped at teardown."""
    started: list[GatewayServer] = []

    def start(*, url: str | None = None, timings: Timings | None = None, **config: Any) -> GatewayServer:
        server = GatewayServer(make_config(url or upstream.url, **config), timings=timings).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """Real Redis (tests/support/redis_server.py): REDIS_URL, 127.0.0.1:6379, or one started here."""
    with redis_server.server_url() as url:
        yield url


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own in `redis_url`, cleaned up after it."""
    with redis_server.prefix(redis_url) as name:
        yield name


@pytest.fixture
def stop_later() -> Iterator[Any]:
    """`stop_later(process)`: a `dragoman serve` process killed, with its workers, when the test ends."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes.append
    for process in processes:
        _kill(process)
