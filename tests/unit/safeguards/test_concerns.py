"""`Safeguards.concerns`: the pipeline calls the backend itself for a request it says no to,
so it must say yes to every request `send` would do more for."""

from __future__ import annotations

import json

from dragoman.calls.types import Call
from dragoman.safeguards import monitor, wire
from dragoman.safeguards.service import Safeguards


def _call(body: dict) -> Call:
    return Call(json.dumps(body).encode(), "m", "m", {}, "req_1")


PLAIN = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def test_a_plain_request_is_not_its_concern() -> None:
    call = _call(PLAIN)
    assert not Safeguards.concerns(call)
    assert wire.asked(call) is None and not monitor.is_monitor(call)


def test_a_request_asking_for_verdicts_is() -> None:
    call = _call({**PLAIN, "safeguards": [{"type": wire.KIND}]})
    assert Safeguards.concerns(call) and wire.asked(call)


def test_a_classifier_request_is() -> None:
    call = _call({**PLAIN, "system": [{"type": "text", "text": f"{monitor.MARK}. Judge this."}]})
    assert Safeguards.concerns(call) and monitor.is_monitor(call)
