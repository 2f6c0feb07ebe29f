from __future__ import annotations

from collections.abc import Iterator

import pytest

from dragoman.limits import fallback
from tests.support.redis_server import RedisProcess


@pytest.fixture
def own_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisProcess]:
    """A Redis of the test's own, whose command counts are the test's alone (the stores'
    heartbeat, which makes round trips of its own, is not started)."""
    monkeypatch.setattr(fallback.Share, "start", lambda self: None)
    own = RedisProcess().start()
    yield own
    own.stop()
