"""Admitting and settling requests (limits.gate), on the in-process store."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from dragoman.calls.types import Call, Outcome
from dragoman.core.config_load import from_dict
from dragoman.limits import gate
from dragoman.limits.gate import LimitReached, window_end

BODY = b'{"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]}'


def limits(table: dict[str, Any], tenants: dict[str, list[str]] | None = None) -> gate.Limits:
    built = gate.build(from_dict({"server": {"tenants": tenants or {}}, "limits": table}).limits)
    assert built is not None
    return built


def call(model: str = "m", body: bytes = BODY) -> Call:
    return Call(body=body, model=model, upstream_model="served-" + model, headers={}, request_id="r",
                outcome=Outcome(request_id="r", endpoint="messages"))  # fmt: skip


def admit(limiter: gate.Limits, *, key: str | None = "key_a", tenant: str | None = None, model: str = "m",
          endpoint: str = "messages") -> gate.Admission:  # fmt: skip
    return asyncio.run(limiter.admit(key, tenant, call(model), endpoint))


def test_the_tokens_headers_follow_the_nearer_to_empty_of_input_and_output():
    limiter = limits({"input_tokens_per_minute": 1000, "output_tokens_per_minute": 150})
    headers = admit(limiter).headers()
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "50"
    assert headers["anthropic-ratelimit-tokens-remaining"] == "50"
    assert headers["anthropic-ratelimit-tokens-limit"] == "150"
    assert "anthropic-ratelimit-requests-limit" not in headers  # no requests limit configured


def test_a_model_limit_adds_buckets_and_the_tightest_shows():
    limiter = limits({"requests_per_minute": 100, "models": {"served-m": {"requests_per_minute": 3}}})
    assert admit(limiter).headers()["anthropic-ratelimit-requests-remaining"] == "2"  # by the upstream's name
    assert admit(limiter, model="other").headers()["anthropic-ratelimit-requests-remaining"] == "98"


def test_a_tenant_inherits_what_it_leaves_out():
    limiter = limits({"requests_per_minute": 5, "output_tokens_per_minute": 1000,
                      "tenants": {"t": {"requests_per_minute": 1}}}, tenants={"t": ["sk"]})  # fmt: skip
    headers = admit(limiter, key="key_x", tenant="t").headers()
    assert headers["anthropic-ratelimit-requests-limit"] == "1"
    assert headers["anthropic-ratelimit-output-tokens-limit"] == "1000"
    with pytest.raises(LimitReached) as caught:
        admit(limiter, key="key_y", tenant="t")  # another key of the tenant: the same bucket
    assert caught.value.message.startswith("limits.tenants.t.requests_per_minute: tenant t is over")


def test_settling_refunds_unused_output_and_charges_input():
    limiter = limits({"input_tokens_per_minute": 1000, "output_tokens_per_minute": 1000})
    admission = admit(limiter)
    outcome = Outcome(request_id="r", endpoint="messages", status=200, input_tokens=300, output_tokens=20)
    admission.settle(outcome)
    admission.settle(outcome)  # once only
    headers = admit(limiter).headers()
    assert 700 <= int(headers["anthropic-ratelimit-input-tokens-remaining"]) < 710
    assert 880 <= int(headers["anthropic-ratelimit-output-tokens-remaining"]) < 890  # 1000 - 20 - this one's 100


def test_cache_writes_count_as_input_and_cache_reads_do_not():
    limiter = limits({"input_tokens_per_minute": 1000})
    admit(limiter).settle(Outcome(request_id="r", endpoint="messages", status=200, input_tokens=100, output_tokens=5,
                                  cache_read_tokens=400, cache_creation_tokens=200))  # fmt: skip
    assert 700 <= int(admit(limiter).headers()["anthropic-ratelimit-input-tokens-remaining"]) < 710


def test_a_failed_request_gets_its_whole_reservation_back():
    limiter = limits({"output_tokens_per_minute": 1000})
    admit(limiter).settle(Outcome(request_id="r", endpoint="messages", status=502))
    assert int(admit(limiter).headers()["anthropic-ratelimit-output-tokens-remaining"]) >= 899


def test_count_tokens_takes_a_request_and_no_tokens():
    limiter = limits({"requests_per_minute": 10, "output_tokens_per_minute": 1000})
    headers = admit(limiter, endpoint="count_tokens").headers()
    assert headers["anthropic-ratelimit-requests-remaining"] == "9"
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "1000"


def test_budget_windows_are_utc_days_and_months():
    moment = datetime.datetime(2026, 12, 31, 23, 30, tzinfo=datetime.UTC).timestamp()
    name, end = window_end("day", moment)
    assert (
        name == "2026-12-31"
        and datetime.datetime.fromtimestamp(end, datetime.UTC).isoformat() == "2027-01-01T00:00:00+00:00"
    )
    name, end = window_end("month", moment)
    assert name == "2026-12" and end == datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC).timestamp()
    name, end = window_end("month", datetime.datetime(2026, 1, 31, tzinfo=datetime.UTC).timestamp())
    assert name == "2026-01" and end == datetime.datetime(2026, 2, 1, tzinfo=datetime.UTC).timestamp()
