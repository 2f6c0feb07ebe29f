"""Replicas: which instance a request goes to, which are passed over and for how long,
and the one request at a time a silent instance gets once its cool-down is over. The
clock is a stand-in: cool-downs are checked to the second, never waited for."""

from __future__ import annotations

import logging

import pytest

from dragoman.upstream.replicas import CoolDowns, Replicas

A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"
COOL = CoolDowns(unreachable=5.0, silent=30.0, retry_after_cap=60.0)
TRIAL_FOR = 610.0  # connect_timeout + first_byte_timeout


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fleet(*roots: str) -> tuple[Replicas, Clock]:
    clock = Clock()
    return Replicas("up", list(roots or (A, B)), trial_for=TRIAL_FOR, cool_downs=COOL, clock=clock), clock


def picks(replicas: Replicas, n: int = 6) -> list[str]:
    """Where `n` requests go, each answered before the next is sent."""
    chosen = []
    for _ in range(n):
        root = replicas.pick()
        replicas.answered(root)
        chosen.append(root)
    return chosen


def test_requests_rotate_over_the_instances() -> None:
    replicas, _ = fleet(A, B, C)
    assert picks(replicas) == [A, B, C, A, B, C]


@pytest.mark.parametrize(("silent", "cool_down"), [(True, 30.0), (False, 5.0)], ids=["silent", "unreachable"])
def test_a_failed_instance_is_passed_over_for_its_cool_down_and_no_longer(silent: bool, cool_down: float) -> None:
    replicas, clock = fleet()
    replicas.failed(A, silent=silent)
    clock.now += cool_down - 0.001
    assert picks(replicas) == [B] * 6
    clock.now += 0.001
    assert A in picks(replicas, 2)


def test_a_silent_instance_gets_one_request_at_a_time_until_it_answers() -> None:
    replicas, clock = fleet()
    replicas.failed(A, silent=True)
    clock.now += 30.0
    trial = [replicas.pick() for _ in range(2)]
    assert sorted(trial) == [A, B]  # the trial, and the next request elsewhere
    clock.now += 500.0  # the trial still waits for its first byte
    assert [replicas.pick() for _ in range(4)] == [B] * 4  # no second request waits on it meanwhile
    replicas.answered(A)
    assert sorted(picks(replicas, 4)) == [A, A, B, B]  # back in the rotation


def test_a_trial_that_is_silent_again_starts_another_cool_down_from_then() -> None:
    replicas, clock = fleet()
    replicas.failed(A, silent=True)
    clock.now += 30.0
    while replicas.pick() != A:
        pass
    clock.now += 1.0  # silent again: not held for the rest of the trial's bound
    replicas.failed(A, silent=True)
    clock.now += 29.999
    assert picks(replicas, 4) == [B] * 4
    clock.now += 0.001
    assert A in picks(replicas, 2)


def test_a_trial_the_client_abandoned_leaves_the_instance_to_the_next_request() -> None:
    replicas, clock = fleet()
    replicas.failed(A, silent=True)
    clock.now += 30.0
    while replicas.pick() != A:
        pass
    replicas.abandoned(A)  # no verdict: the next request tries it
    assert A in [replicas.pick() for _ in range(2)]


def test_an_instance_refusing_at_once_needs_no_trial_after_its_cool_down() -> None:
    replicas, clock = fleet()
    replicas.failed(A, silent=True)
    replicas.failed(A, silent=False)  # it refuses now: finding out again costs nothing
    clock.now += 30.0
    assert [replicas.pick() for _ in range(4)] == [A, B, A, B]  # no request waits for another's answer


@pytest.mark.parametrize("silent", [True, False], ids=["silent", "unreachable"])
def test_when_every_instance_is_passed_over_one_is_still_asked(silent: bool) -> None:
    replicas, _ = fleet()
    replicas.failed(A, silent=silent)
    replicas.failed(B, silent=silent)
    assert replicas.pick() in (A, B)
    assert replicas.pick(avoid=A) == B  # a retry still leaves the one that failed it
    assert not replicas.others_free(A)


def test_others_free_tells_whether_a_retry_has_somewhere_to_go() -> None:
    replicas, clock = fleet(A, B, C)
    assert replicas.others_free(A)
    replicas.failed(B, silent=True)
    assert replicas.others_free(A)  # C
    replicas.pass_over(C, 10)
    assert not replicas.others_free(A)
    clock.now += 10
    assert replicas.others_free(A)


def test_a_retry_after_is_capped_and_outlasts_a_shorter_cool_down() -> None:
    replicas, clock = fleet()
    assert replicas.pass_over(A, 3600) is True  # B is free
    replicas.failed(A, silent=False)  # 5 s: the retry-after's 60 s stand
    clock.now += 59.999
    assert picks(replicas, 4) == [B] * 4
    clock.now += 0.001
    assert A in picks(replicas, 2)


def test_an_answer_ends_a_silence_but_not_a_retry_after() -> None:
    replicas, clock = fleet()
    replicas.pass_over(A, 20)
    replicas.answered(A)  # a request sent before the retry-after came back
    assert picks(replicas, 4) == [B] * 4
    replicas.failed(B, silent=True)
    replicas.answered(B)  # one sent before the silence answered: the instance is alive
    clock.now += 20
    assert sorted(picks(replicas, 4)) == [A, A, B, B]


def test_order_lists_every_instance_and_starts_no_trial() -> None:
    replicas, clock = fleet(A, B, C)
    replicas.failed(A, silent=True)
    clock.now += 30.0
    for _ in range(3):
        order = replicas.order()
        assert sorted(order) == [A, B, C]
    assert A in [replicas.pick() for _ in range(3)]  # still free for a request's trial


def test_the_log_says_when_an_instance_falls_silent_and_when_it_answers_again(caplog: pytest.LogCaptureFixture) -> None:
    replicas, clock = fleet()
    with caplog.at_level(logging.INFO, logger="dragoman.upstream"):
        replicas.failed(A, silent=True)
        clock.now += 30.0
        while replicas.pick() != A:
            pass
        replicas.failed(A, silent=True)  # its trial: silent still, not news
        clock.now += 30.0
        while replicas.pick() != A:
            pass
        replicas.answered(A)
        replicas.answered(A)  # answering as usual: not news either
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "WARNING",
            f"upstream up: instance {A} did not answer in time; passed over for 30 s, then sent one request at a time until it answers",
        ),
        ("INFO", f"upstream up: instance {A} answers again"),
    ]
