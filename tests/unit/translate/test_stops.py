"""StopMatcher: the gateway's own stop-sequence matching over streamed text."""

from __future__ import annotations

import pytest

from dragoman.translate.stops import PrefillEcho, StopMatcher


def feed_all(stops: list[str], pieces: list[str]) -> tuple[str, str | None, list[str]]:
    """(text emitted, matched stop, text emitted per feed call)"""
    matcher = StopMatcher(stops)
    emitted = [matcher.feed(piece) for piece in pieces]
    rest = matcher.flush()
    return "".join(emitted) + rest, matcher.matched, emitted


@pytest.mark.parametrize(
    ("stops", "pieces", "text", "matched"),
    [
        (["END"], ["hello END world"], "hello ", "END"),
        (["END"], ["hello E", "ND world"], "hello ", "END"),
        (["END"], ["hello E", "N", "D"], "hello ", "END"),
        (["END"], ["END"], "", "END"),
        (["END"], ["no stop here"], "no stop here", None),
        (["END"], ["trailing E"], "trailing E", None),  # released by flush
        (["END"], ["trailing EN", ""], "trailing EN", None),
        (["END"], ["ENEND"], "EN", "END"),  # a failed partial match restarts inside itself
        (["aab"], ["a", "a", "a", "b"], "a", "aab"),
        (["\n\nHuman:", "\n\nAssistant:"], ["Sure.\n\nAss", "istant: hi"], "Sure.", "\n\nAssistant:"),
        (["STOP", "END"], ["a END b STOP"], "a ", "END"),  # the earliest in the text, not in the list
        (["x"], ["ab", "x", "cd"], "ab", "x"),
        (["é!"], ["caf", "é", "!"], "caf", "é!"),
        ([], ["anything END"], "anything END", None),
        ([""], ["empty stops are ignored"], "empty stops are ignored", None),
    ],
)
def test_matching(stops: list[str], pieces: list[str], text: str, matched: str | None) -> None:
    assert feed_all(stops, pieces)[:2] == (text, matched)


def test_only_a_possible_prefix_is_held_back() -> None:
    matcher = StopMatcher(["</answer>"])
    assert matcher.feed("42 </an") == "42 "
    assert matcher.feed("swerable") == "</answerable"
    assert matcher.feed(" <") == " "
    assert matcher.flush() == "<"
    assert matcher.matched is None


def test_nothing_is_emitted_after_a_match() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("a END b") == "a "
    assert matcher.feed("more") == ""
    assert matcher.flush() == ""
    assert matcher.matched == "END"


def test_falsy_without_stops() -> None:
    assert not StopMatcher([])
    assert not StopMatcher([""])
    assert StopMatcher(["x"])


SAMPLES = [
    (["END"], "The answer is 42. END of story"),
    (["\n\nHuman:"], "Line one.\n\nLine two.\n\nHuman: hi"),
    (["</tool>", "<tool"], "text <to be or not> more <tool>x</tool>"),
    (["aab", "ab"], "xaaab tail"),  # both complete on the same character
    (["bc", "abcd"], "xabcde"),  # "bc" completes first even though "abcd" starts earlier
    (["abc"], "ababab abc"),
    (["END"], "no stop sequence in this one at all, E EN"),
]


@pytest.mark.parametrize(("stops", "sample"), SAMPLES)
def test_result_does_not_depend_on_how_the_text_is_chunked(stops: list[str], sample: str) -> None:
    """Upstream chunk boundaries are arbitrary: every way to cut the text in two or
    three pieces (and one character at a time) gives the same text and match."""
    whole = feed_all(stops, [sample])[:2]
    assert feed_all(stops, list(sample))[:2] == whole
    for i in range(len(sample) + 1):
        assert feed_all(stops, [sample[:i], sample[i:]])[:2] == whole, i
        for j in range(i, len(sample) + 1, 3):
            assert feed_all(stops, [sample[:i], sample[i:j], sample[j:]])[:2] == whole, (i, j)


@pytest.mark.parametrize(
    ("stops", "sample", "text", "matched"),
    [
        (["aab", "ab"], "xaaab tail", "xa", "aab"),
        (["bc", "abcd"], "xabcde", "xa", "bc"),
        (["abcd", "bc"], "xabcde", "xa", "bc"),
    ],
)
def test_the_stop_that_completes_first_wins(stops: list[str], sample: str, text: str, matched: str) -> None:
    """A backend stops generating as soon as one stop sequence is complete, so that
    is the one reported, with the text before it."""
    assert feed_all(stops, list(sample))[:2] == (text, matched)
    assert feed_all(stops, [sample])[:2] == (text, matched)


@pytest.mark.parametrize(
    ("prefill", "pieces", "expected"),
    [
        ("The fruit is", ["The fruit is a", " mango"], " a mango"),  # echoed in one piece (llama.cpp)
        ("The fruit is", ["The ", "fru", "it is", " a mango"], " a mango"),  # echoed across pieces
        ("The fruit is", [" a mango"], " a mango"),  # not echoed (vLLM's continue_final_message)
        ("The fruit is", ["The", " answer"], "The answer"),  # looked like an echo, was not
        ("The fruit is", ["The fruit is"], ""),  # the echo and nothing more
        ("The fruit is", ["The fru"], "The fru"),  # a short reply that matched so far is kept
        ("", ["hello"], "hello"),
    ],
)
def test_prefill_echo_is_dropped_only_when_it_is_one(prefill, pieces, expected):
    echo = PrefillEcho(prefill)
    out = "".join(echo.feed(piece) for piece in pieces) + echo.flush()
    assert out == expected
