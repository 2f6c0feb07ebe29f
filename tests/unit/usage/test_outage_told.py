"""One warning and one end per outage per process, whoever meets it first: an admin read
that fails before the keyring or the usage writer notice keeps them quiet, and the end is
told once (issue 34's "one warning per outage")."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dragoman.core.errors import StoreUnavailable
from dragoman.usage.outage import Outage, ReadGuard


async def _fails() -> None:
    raise ConnectionError("lost")


async def _answers() -> int:
    return 1


def _failed_once(caplog: pytest.LogCaptureFixture) -> tuple[Outage, ReadGuard]:
    """An outage and an admin read's guard that has met it (its warning logged)."""
    outage = Outage()
    guard = ReadGuard(1.0, outage=lambda: outage)
    caplog.set_level(logging.INFO, logger="dragoman.usage")
    with pytest.raises(StoreUnavailable):
        asyncio.run(guard(_fails()))
    return outage, guard


def test_a_reader_that_met_the_outage_first_keeps_the_parts_quiet(caplog: pytest.LogCaptureFixture) -> None:
    outage, guard = _failed_once(caplog)
    assert outage.failed("keys") is False and outage.failed("usage") is False  # told already: they log nothing
    assert outage.answered("keys") is False and outage.answered("usage") is True  # the last part tells its end
    assert asyncio.run(guard(_answers())) == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(warnings) == 1 and infos == []  # the guard does not tell the end twice


def test_a_blip_only_a_reader_saw_is_told_start_and_end(caplog: pytest.LogCaptureFixture) -> None:
    outage, guard = _failed_once(caplog)
    assert asyncio.run(guard(_answers())) == 1
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert outage.failed("keys") is True  # a later outage is told again
