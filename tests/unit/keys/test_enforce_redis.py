"""A key's money budget with Redis (a real server of the test's own): counted there in the
same script call as the key's limits, one round trip a request, its settlement riding along."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from dragoman.calls.types import Call, Outcome
from dragoman.core.config import Price as PriceConfig
from dragoman.core.config_load import from_dict
from dragoman.core.limit_settings import LimitSet
from dragoman.keys import money
from dragoman.keys.enforce import KeyedLimits
from dragoman.keys.records import Budget, KeyRow
from dragoman.keys.ring import Keyring
from dragoman.limits import fallback, gate
from tests.support.redis_server import RedisProcess

BODY = b'{"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]}'


def _keyed(url: str) -> KeyedLimits:
    limits = {"redis_url": url, "redis_prefix": "t:", "redis_credit": 0}  # every request a round trip
    keyed = gate.build(from_dict({"limits": limits}).limits, cls=KeyedLimits)
    assert isinstance(keyed, KeyedLimits)
    keyed.ring = Keyring()
    keyed.ring.apply([KeyRow(id="key_a", digest="d", hint="h", name="a", version=1, budget=Budget(amount="100"),
                             limits=LimitSet(requests_per_minute=1000, output_tokens_per_minute=100_000))])  # fmt: skip
    keyed.prices = money.Prices([("m", [], PriceConfig(input=1.0, output=1.0))])
    return keyed


def test_a_budget_is_counted_in_the_limits_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fallback.Share, "start", lambda self: None)  # the heartbeat's round trips are its own
    own = RedisProcess().start()

    async def run() -> list[Any]:
        keyed = _keyed(own.url)
        seen = []
        try:
            for n in range(10):
                outcome = Outcome(request_id=f"r{n}", endpoint="messages", status=200, input_tokens=10, output_tokens=5)
                call = Call(body=BODY, model="m", upstream_model="m", headers={}, request_id=f"r{n}", outcome=outcome)
                admission = await keyed.admit("key_a", None, call, "messages")
                seen.append(admission)
                admission.settle(outcome)  # rides along with the next request's round trip
        finally:
            await keyed.close()  # the last settlement goes alone
        return seen

    try:
        assert len(asyncio.run(run())) == 10
        client = redis.Redis.from_url(own.url)
        calls = {name.removeprefix("cmdstat_"): f["calls"] for name, f in client.info("commandstats").items()}
        assert calls["time"] == 11, calls  # 10 requests, one script call each, and the last settlement
        bucket = money.bucket("key_a", Budget(amount="100"), time.time())
        assert money.SPAN - float(client.hget("t:" + bucket.key, "t")) == 10 * 15 * money.NANO  # type: ignore[arg-type]
    finally:
        own.stop()
