"""The usage report's parameters, as Anthropic's API takes them: each refusal names its
parameter, and buckets snap to UTC minutes, hours and days."""

from __future__ import annotations

import pytest

from dragoman.core.errors import InvalidRequest
from dragoman.usage.report import ReportQuery

NOW = 1_780_000_000.0


def query(**params: str | list[str]) -> ReportQuery:
    return ReportQuery({k: v if isinstance(v, list) else [v] for k, v in params.items()}, now=NOW)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({}, "starting_at"),
        ({"starting_at": "yesterday"}, "starting_at"),
        ({"starting_at": "2026-01-01T00:00:00Z", "bucket_width": "1w"}, "bucket_width"),
        ({"starting_at": "2026-01-01T00:00:00Z", "limit": "32"}, "limit"),
        ({"starting_at": "2026-01-01T00:00:00Z", "bucket_width": "1m", "limit": "1441"}, "limit"),
        ({"starting_at": "2026-01-01T00:00:00Z", "limit": "x"}, "limit"),
        ({"starting_at": "2026-01-01T00:00:00Z", "group_by[]": "colour"}, "group_by"),
        ({"starting_at": "2026-01-01T00:00:00Z", "ending_at": "2025-01-01T00:00:00Z"}, "starting_at"),
        ({"starting_at": "2099-01-01T00:00:00Z"}, "starting_at"),
        ({"starting_at": "2026-01-01T00:00:00Z", "page": "page_bm9wZQ=="}, "page"),
        ({"starting_at": ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]}, "starting_at"),
    ],
)
def test_a_bad_parameter_is_named(params: dict[str, str], named: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        query(**params)
    assert caught.value.message.startswith(f"{named}:")


def test_buckets_snap_and_default_as_anthropic_does() -> None:
    day = query(starting_at="2026-03-04T05:06:07+02:00")
    assert day.start % 86400 == 0 and day.limit == 7 and day.width_name == "1d"
    hour = query(starting_at="2026-03-04T05:06:07Z", bucket_width="1h")
    assert hour.start % 3600 == 0 and hour.limit == 24
    minute = query(starting_at="2026-03-04T05:06:07Z", bucket_width="1m", **{"group_by[]": ["model", "api_key_id"]})
    assert minute.limit == 60 and minute.store_query().group_by == ("model", "api_key_id")


def test_other_anthropic_groups_are_accepted_and_answered_null() -> None:
    assert query(starting_at="2026-01-01T00:00:00Z", group_by=["workspace_id"]).store_query().group_by == ()
