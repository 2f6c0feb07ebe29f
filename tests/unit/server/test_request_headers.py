"""RequestHeaders answers every lookup as Starlette's Headers does, from a dict."""

from __future__ import annotations

import itertools

import pytest
from starlette.datastructures import Headers

from dragoman.server.headers import RequestHeaders

NAMES = [b"x-api-key", b"anthropic-beta", b"content-length", b"Odd-Case"]
VALUES = [b"one", b"two", b"caf\xe9"]
ASKED = ["x-api-key", "X-API-Key", "anthropic-beta", "content-length", "odd-case", "Odd-Case", "absent"]


def _raws() -> list[list[tuple[bytes, bytes]]]:
    pairs = [(n, v) for n in NAMES for v in VALUES[:2]]
    raws = [[], *([p] for p in pairs), *(list(c) for c in itertools.combinations(pairs, 3))]
    return [*raws, [(b"anthropic-beta", b"a"), (b"x-api-key", VALUES[2]), (b"anthropic-beta", b"b")]]


@pytest.mark.parametrize("raw", _raws())
def test_every_lookup_as_starlette(raw: list[tuple[bytes, bytes]]) -> None:
    theirs, ours = Headers(scope={"headers": list(raw)}), RequestHeaders({"headers": list(raw)})
    for name in ASKED:
        assert ours.get(name) == theirs.get(name)
        assert ours.get(name, "-") == theirs.get(name, "-")
        assert (name in ours) == (name in theirs)
        assert ours.getlist(name) == theirs.getlist(name)
        if name in theirs:
            assert ours[name] == theirs[name]
        else:
            with pytest.raises(KeyError):
                ours[name]
    assert ours.items() == theirs.items() and ours.raw == theirs.raw and ours == theirs


def test_the_first_header_of_a_name_wins() -> None:
    ours = RequestHeaders({"headers": [(b"x-api-key", b"first"), (b"x-api-key", b"second")]})
    assert ours["x-api-key"] == ours.get("X-Api-Key") == "first"
    assert ours.getlist("x-api-key") == ["first", "second"]
