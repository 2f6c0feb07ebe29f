"""A request's one end (`calls.types.Finish`): what it held is released and its outcome
recorded exactly once, however many times and ways its end is reached."""

from __future__ import annotations

import gc
import weakref

import pytest

from dragoman.calls.types import Outcome
from dragoman.core.errors import GatewayError, Overloaded, RateLimited


def outcome_with_log() -> tuple[Outcome, list[str]]:
    log: list[str] = []
    outcome = Outcome(request_id="req_1", endpoint="messages")
    outcome.finish.record = lambda o: log.append(f"record {o.status}")
    outcome.finish.hold(lambda: log.append("slot"))
    outcome.finish.hold(lambda: log.append("limits"))
    return outcome, log


def test_ending_twice_releases_and_records_once() -> None:
    outcome, log = outcome_with_log()
    outcome.status = 200
    outcome.finish.end()
    outcome.finish.end()
    assert log == ["slot", "limits", "record 200"]  # released first, in order, then recorded


class _Held:
    """Something a request's outcome holds (its trace, say)."""


def test_an_ended_request_is_freed_as_it_ends_not_by_a_garbage_collection() -> None:
    """A cycle between an outcome and its finish would wait for a collection, with all it holds."""
    gc.disable()
    try:
        outcome, _ = outcome_with_log()
        held = _Held()
        outcome.trace, alive = held, weakref.ref(held)
        del held
        with outcome.finish:
            outcome.status = 200
        del outcome
        assert alive() is None
    finally:
        gc.enable()


def test_a_hold_taken_after_the_end_is_released_at_once() -> None:
    outcome, log = outcome_with_log()
    outcome.finish.end()
    outcome.finish.hold(lambda: log.append("late"))
    assert log == ["slot", "limits", "record 0", "late"]


def test_a_release_that_fails_stops_neither_the_others_nor_the_record() -> None:
    outcome, log = outcome_with_log()

    def broken() -> None:
        raise RuntimeError("a bug in a release")

    outcome.finish.hold(broken)
    outcome.finish.hold(lambda: log.append("after"))
    outcome.finish.end()
    assert log == ["slot", "limits", "after", "record 0"]


def test_the_block_ends_the_request_once_however_it_is_left() -> None:
    outcome, log = outcome_with_log()
    with outcome.finish:
        outcome.status = 200
        outcome.finish.end()  # e.g. a whole reply, settled before it is sent
    assert log == ["slot", "limits", "record 200"]


def test_an_error_leaving_the_block_is_copied_to_the_outcome_then_recorded() -> None:
    outcome, log = outcome_with_log()
    with pytest.raises(RateLimited), outcome.finish:
        raise RateLimited("requests: the key's limit of 1 a minute is reached")
    assert (outcome.status, outcome.error_type, outcome.upstream_failed) == (429, "rate_limit_error", False)
    assert log == ["slot", "limits", "record 429"]


def test_a_bug_leaving_the_block_is_a_500_and_an_error_already_noted_stays() -> None:
    outcome, log = outcome_with_log()
    with pytest.raises(KeyError), outcome.finish:
        raise KeyError("a bug")
    assert (outcome.status, outcome.error_type) == (500, "api_error") and log[-1] == "record 500"

    noted, _ = outcome_with_log()
    with pytest.raises(RuntimeError), noted.finish:
        noted.failed(Overloaded("the upstream is overloaded"))
        raise RuntimeError("while answering")
    assert (noted.status, noted.error_type) == (529, "overloaded_error")


def test_a_failure_after_a_streams_head_keeps_its_status() -> None:
    outcome = Outcome(request_id="req_1", endpoint="messages", status=200)
    outcome.failed(GatewayError("internal error"), committed=True)
    assert (outcome.status, outcome.error_type) == (200, "api_error")


def test_a_client_that_left_is_a_499_only_if_nothing_was_answered() -> None:
    unanswered, streaming = (
        Outcome(request_id="a", endpoint="messages"),
        Outcome(request_id="b", endpoint="messages", status=200),
    )
    unanswered.left()
    streaming.left()
    assert (unanswered.status, unanswered.disconnected) == (499, True)
    assert (streaming.status, streaming.disconnected) == (200, True)
