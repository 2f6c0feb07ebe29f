"""Tool-call arguments as backends send them: JSON text, empty, objects, truncated."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dragoman.core.errors import UpstreamError
from dragoman.translate.tool_args import completion_suffix, parse_arguments


@pytest.mark.parametrize(
    ("text", "suffix"),
    [
        ('{"a": 1}', ""),
        ("", ""),
        ("{", "}"),
        ('{"a": [1, 2', "]}"),
        ('{"a": "x', '"}'),
        ('{"a": "x\\', '\\"}'),  # a dangling escape is completed, not left open
        ('{"a": "say \\"hi', '"}'),
        ('{"a": "}]{[', '"}'),  # brackets inside strings do not count
        ('{"a":', "null}"),
        ('{"a": {"b": ', "null}}"),
        ('{"a": [{"b": [', "]}]}"),
        ('{"a": 1,', None),  # needs a deletion, or an invented key
        ('{"a": [1, ', "null]}"),
        ('{"ci', '":null}'),  # cut in a key
        ('{"city"', ":null}"),
        ('{"a": tr', "ue}"),  # cut in a literal
        ('{"a": nu', "ll}"),
        ('{"a": -', "0}"),  # cut in a number
        ('{"a": 1.', "0}"),
        ('{"a": 1e', "0}"),
        ('{"a": "x\\u00', '00"}'),  # cut in a \u escape
        ('{"a": "x",', None),
        ('{"a": 1}}', None),
        ('{"a": [1}', None),
        ("]", None),
    ],
)
def test_completion_suffix(text: str, suffix: str | None) -> None:
    assert completion_suffix(text) == suffix


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, {}),
        ("", {}),
        (" \n", {}),
        ({"path": "/tmp/x"}, {"path": "/tmp/x"}),
        ({}, {}),
        ('{"path": "/tmp/x", "lines": [1, 2]}', {"path": "/tmp/x", "lines": [1, 2]}),
        ('  {"a": 1}\n', {"a": 1}),
        ('{"text": "line1\\nline2 \\u00e9"}', {"text": "line1\nline2 \u00e9"}),
        ('{"a": [1, {"b": "c', {"a": [1, {"b": "c"}]}),
        ('{"command": "ls -la', {"command": "ls -la"}),
        ('{"key":', {"key": None}),
    ],
)
def test_parse_arguments(raw: Any, expected: dict) -> None:
    assert parse_arguments(raw, tool="bash") == expected


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("{oops", "not valid JSON"),
        ('{"a": 1,', "not valid JSON"),
        ('{"a": trux', "not valid JSON"),
        ('{"a": 1} trailing', "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('"{\\"a\\": 1}"', "not a JSON object"),
        ("null", "not a JSON object"),
        ("7", "not a JSON object"),
    ],
)
def test_invalid_arguments_are_an_upstream_error_naming_the_tool(raw: str, fragment: str) -> None:
    with pytest.raises(UpstreamError) as caught:
        parse_arguments(raw, tool="str_replace_based_edit_tool")
    assert caught.value.status == 502
    assert "str_replace_based_edit_tool" in caught.value.message and fragment in caught.value.message


def test_error_message_is_bounded() -> None:
    with pytest.raises(UpstreamError) as caught:
        parse_arguments("{" + "x" * 10_000, tool="f")
    assert len(caught.value.message) < 400


SAMPLE = {
    "path": "/src/app.py",
    "edits": [{"old": 'a "quoted" [x]', "new": "b\\n{y}"}, {"old": "", "new": None}],
    "dry_run": False,
    "n": -1.5,
}


def test_every_truncation_is_repaired_or_rejected_cleanly() -> None:
    """A stream can be cut after any character: the result is always a JSON object
    or an UpstreamError, never another exception or a non-object."""
    text = json.dumps(SAMPLE)
    repaired = 0
    for end in range(len(text) + 1):
        try:
            value = parse_arguments(text[:end], tool="f")
        except UpstreamError:
            continue
        assert isinstance(value, dict)
        repaired += 1
    assert parse_arguments(text, tool="f") == SAMPLE
    assert repaired > len(text) // 2  # most cut points are repairable by closing what is open
