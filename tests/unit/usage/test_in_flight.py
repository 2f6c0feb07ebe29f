"""What an open stream would leave if the gateway died now (usage's journal, issue 34): a
translated stream learns its input only at its end, so until then its record carries the
upstream's count if one came mid-stream, else the estimate; never 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dragoman.backends.openai.backend import _as_events
from dragoman.backends.openai.stream import Translation
from dragoman.calls.types import Outcome
from dragoman.core import ids
from dragoman.translate.stream import StreamTranslator
from dragoman.usage.journal import CRASHED, Journal
from dragoman.usage.writer import UsageWriter


def chunk(usage: dict[str, int] | None = None, **delta: Any) -> bytes:
    payload: dict[str, Any] = {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    if usage is not None:
        payload["usage"] = usage
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _stream(tmp_path: Path) -> tuple[UsageWriter, Translation[Any], Outcome]:
    writer = UsageWriter(store=None, journal=Journal(tmp_path))  # type: ignore[arg-type]  # no write happens
    outcome = Outcome(request_id="req_1", endpoint="messages", model="m")
    writer.opened(outcome)
    translator = StreamTranslator(model="m", message_id="msg_1", new_tool_id=ids.tool_use_id)
    translation = Translation("up", translator, outcome, _as_events, None, estimate=lambda: 42)
    list(translation.feed(chunk(role="assistant", content="") + chunk(content="a") + chunk(content="b")))
    outcome.first_byte = outcome.started  # its first token went out
    return writer, translation, outcome


def test_a_crashed_translated_stream_carries_the_estimated_input(tmp_path: Path) -> None:
    writer, _, _ = _stream(tmp_path)
    [record] = writer._in_flight()
    assert (record.error_type, record.input_tokens, record.output_tokens) == (CRASHED, 42, 2)


def test_the_upstreams_count_wins_once_it_came(tmp_path: Path) -> None:
    writer, translation, _ = _stream(tmp_path)
    list(translation.feed(chunk(usage={"prompt_tokens": 7, "completion_tokens": 3}, content="c")))
    [record] = writer._in_flight()
    assert (record.input_tokens, record.output_tokens) == (7, 3)
