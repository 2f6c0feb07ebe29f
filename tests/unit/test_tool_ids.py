"""Server tool-call ids that Anthropic's pattern refuses go out encoded and come back decoded."""

from __future__ import annotations

import re

import pytest

from dragoman.translate.tool_ids import ENCODED, client_tool_id, upstream_tool_id

ANTHROPIC_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")


@pytest.mark.parametrize("upstream_id", ["call_abc123", "chatcmpl-tool-1a2b", "OVW3pHXaJ1ffTz5Wz5Hq4gJd", "toolu_01A"])
def test_ids_anthropic_accepts_are_kept(upstream_id: str) -> None:
    assert client_tool_id(upstream_id) == upstream_id == upstream_tool_id(upstream_id)


@pytest.mark.parametrize("upstream_id", ["functions.get_weather:0", "call 1", "id/with/slashes", "ü", "a=b", ENCODED + "lookalike"])
def test_other_ids_go_out_valid_and_come_back_as_they_were(upstream_id: str) -> None:
    sent = client_tool_id(upstream_id)
    assert ANTHROPIC_PATTERN.match(sent) and sent.startswith(ENCODED)
    assert upstream_tool_id(sent) == upstream_id


def test_an_id_with_the_prefix_that_is_no_encoding_is_left_alone() -> None:
    assert upstream_tool_id(ENCODED + "%%%") == ENCODED + "%%%"
