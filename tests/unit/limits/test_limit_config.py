"""[limits] in the configuration: what it accepts, and errors that name the key."""

from __future__ import annotations

import pytest

from dragoman.core.config import ConfigError
from dragoman.core.config_load import from_dict
from dragoman.limits import gate

TENANTS = {"tenants": {"team-a": ["sk-a"]}}


def test_no_limits_means_no_limiter() -> None:
    assert gate.build(from_dict({}).limits) is None
    assert gate.build(from_dict({"limits": {"redis_url": "redis://127.0.0.1:6379/0"}}).limits) is None


def test_a_tenant_or_model_table_alone_turns_limits_on() -> None:
    config = from_dict({"server": TENANTS, "limits": {"tenants": {"team-a": {"requests_per_minute": 5}}}})
    assert gate.build(config.limits) is not None
    assert gate.build(from_dict({"limits": {"models": {"m": {"max_concurrent": 2}}}}).limits) is not None


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [
        (
            {"tenants": {"team-b": {"requests_per_minute": 5}}},
            "limits.tenants.team-b: no such tenant in [server] tenants",
        ),
        ({"requests_per_minute": 0}, "limits.requests_per_minute: must be 1 or more"),
        (
            {"tenants": {"team-a": {"models": {"m": {"tokens_per_day": -1}}}}},
            "limits.tenants.team-a.models.m.tokens_per_day",
        ),
        ({"redis_url": "http://127.0.0.1:6379"}, "limits.redis_url: must start with redis://"),
        ({"on_redis_error": "ignore"}, "limits.on_redis_error"),
        ({"redis_credit": -1}, "limits.redis_credit: must be 0"),
        ({"redis_credit": "many"}, "limits.redis_credit"),
        ({"requests_per_hour": 5}, "limits.requests_per_hour: unknown key"),
    ],
)
def test_errors_name_the_key(limits: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_dict({"server": TENANTS, "limits": limits})
    assert fragment in str(caught.value)
