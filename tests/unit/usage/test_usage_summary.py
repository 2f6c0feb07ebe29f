"""`dragoman usage`'s times: words and spans as well as dates."""

from __future__ import annotations

import datetime

import pytest

from dragoman.usage.summary import parse_when

NOW = datetime.datetime(2026, 12, 6, 15, 30, tzinfo=datetime.UTC).timestamp()
MIDNIGHT = datetime.datetime(2026, 12, 6, tzinfo=datetime.UTC).timestamp()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("today", MIDNIGHT), ("Yesterday", MIDNIGHT - 86400), ("now", NOW), ("7d", NOW - 7 * 86400), ("12h", NOW - 43200),
     ("30m", NOW - 1800), ("2w", NOW - 14 * 86400), ("2026-12-01", MIDNIGHT - 5 * 86400),
     ("2026-12-06T10:00:00+01:00", MIDNIGHT + 9 * 3600)],
)  # fmt: skip
def test_times_the_usage_command_takes(text: str, expected: float) -> None:
    assert parse_when(text, NOW) == expected


def test_a_time_it_does_not_take_is_named() -> None:
    with pytest.raises(ValueError, match="'soon'"):
        parse_when("soon", NOW)
