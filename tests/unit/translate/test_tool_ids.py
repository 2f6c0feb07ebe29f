"""Server tool-call ids go to the client valid and unique, and come back as the server's."""

from __future__ import annotations

import re

import pytest

from dragoman.translate.tool_ids import ENCODED, TAGGED, client_tool_id, replica_tag_of, tagged, upstream_tool_id

ANTHROPIC_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")


@pytest.mark.parametrize("upstream_id", ["call_abc123", "chatcmpl-tool-1a2b", "OVW3pHXaJ1ffTz5Wz5Hq4gJd", "toolu_01A"])
def test_ids_anthropic_accepts_and_not_taken_are_kept(upstream_id: str) -> None:
    taken: set[str] = set()
    assert client_tool_id(upstream_id, taken) == upstream_id == upstream_tool_id(upstream_id)
    assert taken == {upstream_id}


@pytest.mark.parametrize(
    "upstream_id", ["functions.get_weather:0", "call 1", "id/with/slashes", "ü", "a=b", ENCODED + "_lookalike", "0"]
)
def test_other_ids_go_out_valid_and_come_back_as_they_were(upstream_id: str) -> None:
    taken = {"0"}  # "0" is taken: an id given again
    sent = client_tool_id(upstream_id, taken)
    assert ANTHROPIC_PATTERN.match(sent) and sent.startswith(ENCODED) and sent != upstream_id
    assert upstream_tool_id(sent) == upstream_id


def test_an_id_given_again_and_again_gets_a_new_client_id_each_time() -> None:
    """TGI and others name every call `call_0`, turn after turn, or `0` for parallel calls."""
    taken: set[str] = set()
    sent = [client_tool_id("call_0", taken) for _ in range(4)]
    assert len(set(sent)) == 4 and sent[0] == "call_0"
    assert all(ANTHROPIC_PATTERN.match(s) for s in sent)
    assert {upstream_tool_id(s) for s in sent} == {"call_0"}


def test_an_id_with_the_prefix_that_is_no_encoding_is_left_alone() -> None:
    assert upstream_tool_id(ENCODED + "_%%%") == ENCODED + "_%%%"
    assert upstream_tool_id("toolu_01ABC") == "toolu_01ABC"


@pytest.mark.parametrize("upstream_id", ["call_abc123", "functions.get_weather:0", TAGGED + "0a1b2c_x", "0"])
def test_an_id_says_which_replica_made_it_and_comes_back_as_the_servers(upstream_id: str) -> None:
    """Behind replicas, a gateway process reading the conversation learns where its turn
    before went (docs/routing.md); the server gets its own id, untagged."""
    taken = {"0", tagged("0", "00ff00")}  # "0" was given before, by this replica too
    sent = client_tool_id(upstream_id, taken, "00ff00")
    assert ANTHROPIC_PATTERN.match(sent) and sent in taken
    assert replica_tag_of(sent) == "00ff00"
    assert upstream_tool_id(sent) == upstream_id


def test_an_id_given_again_by_a_replica_gets_a_new_client_id_each_time() -> None:
    taken: set[str] = set()
    sent = [client_tool_id("call_0", taken, "abcdef") for _ in range(3)]
    assert len(set(sent)) == 3 and sent[0] == tagged("call_0", "abcdef")
    assert {upstream_tool_id(s) for s in sent} == {"call_0"}
    assert {replica_tag_of(s) for s in sent} == {"abcdef"}


def test_ids_of_no_replica_say_none() -> None:
    assert replica_tag_of("call_abc123") is None
    assert replica_tag_of(TAGGED + "xyz_1") is None  # not a tag
    assert tagged("call_1", "") == "call_1"
