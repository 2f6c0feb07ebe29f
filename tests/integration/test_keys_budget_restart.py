"""A money budget outlives a restart: a gateway that starts counting a period charges it
with what the usage ledger says was spent, where the limits' store holds nothing for it
(no Redis, or a Redis that lost it), and not again where it does (a Redis that kept it).
A budget given to a key that has already spent is charged the same way."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
import redis

from tests.support.fakes import FakeUpstream, completion
from tests.support.keys import ask, create, keys_config, update
from tests.support.usage import wait_recorded
from tests.support.waiting import eventually

DEAR = {"input": 3.0, "output": 15.0}  # 10 input and 5 output tokens: 0.0105 cents
BUDGET = {"amount": "0.015", "period": "month"}  # one such request fits; two do not


def _config(upstream: FakeUpstream, tmp_path: Any, **limits: Any) -> dict[str, Any]:
    models = [{"name": "dear", "upstream": "default", "upstream_model": "test-model", "price": DEAR}]
    return keys_config(upstream.url, usage={"dir": str(tmp_path)}, models=models, limits=limits)


def _spend(url: str, key: str, upstream: FakeUpstream) -> None:
    upstream.json_reply(completion("a", prompt=10, completion_tokens=5))
    ask(url, key, model="dear")


@pytest.mark.parametrize("redis_kept", [None, True, False], ids=["no-redis", "redis-kept", "redis-lost"])
def test_a_restarted_gateway_remembers_what_a_budget_spent(
    upstream: FakeUpstream, gateway_from: Any, tmp_path: Any, redis_url: str, redis_prefix: str, redis_kept: bool | None
) -> None:
    limits = {} if redis_kept is None else {"redis_url": redis_url, "redis_prefix": redis_prefix}
    first = gateway_from(_config(upstream, tmp_path, **limits))
    made = create(first.url, name="thrifty", budget=BUDGET)
    _spend(first.url, made["key"], upstream)  # 0.0105 of 0.015 cents
    wait_recorded(first, 1)
    first.stop()  # its records written to the ledger as it closes
    if redis_kept is False:
        client = redis.Redis.from_url(redis_url)
        client.delete(*client.keys(redis_prefix + "*"))  # Redis restarted empty, say
    second = gateway_from(_config(upstream, tmp_path, **limits))
    eventually(lambda: made["id"] in second.app.state.gateway.keyring.by_id, "the key read by the new gateway")
    _spend(second.url, made["key"], upstream)  # 0.0105 spent, not 0.021: admitted (spent once, not twice)
    with pytest.raises(anthropic.RateLimitError, match="budget"):  # 0.021 spent: the budget is used up
        _spend(second.url, made["key"], upstream)


def test_a_budget_given_to_a_key_counts_what_it_spent_before(
    upstream: FakeUpstream, gateway_from: Any, tmp_path: Any
) -> None:
    server = gateway_from(_config(upstream, tmp_path))
    made = create(server.url, name="late budget")
    _spend(server.url, made["key"], upstream)
    _spend(server.url, made["key"], upstream)  # 0.021 cents, no budget yet
    wait_recorded(server, 2)
    update(server.url, made["id"], budget=BUDGET)
    with pytest.raises(anthropic.RateLimitError, match="budget"):
        _spend(server.url, made["key"], upstream)
