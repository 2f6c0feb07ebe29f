"""Session cookies: signed, expiring, naming a key's id only; CSRF tokens bound to a session."""

from __future__ import annotations

import time

from dragoman.console.session import Sessions
from dragoman.keys.records import Grant

GRANT = Grant(id="key_abc", name="alice", role="admin")


def test_a_cookie_is_read_back_only_as_it_was_signed() -> None:
    signer = Sessions(b"s" * 32, hours=1)
    value, made = signer.issue(GRANT)
    assert signer.read(value) == made and made.k == "key_abc" and made.r == "admin"
    body, mac = value.split(".")
    # The MAC's first character, not its last: the last base64 character of 32 bytes carries two
    # padding bits the decoder drops, so "A" and "B" there can decode to the same MAC.
    tampered = ("B" if mac[0] == "A" else "A") + mac[1:]
    assert signer.read(f"{body}.{tampered}") is None
    assert Sessions(b"t" * 32, hours=1).read(value) is None  # another secret
    for junk in ("", "x", "a.b.c", "@@@.@@@", "e30.e30"):
        assert signer.read(junk) is None


def test_a_session_expires() -> None:
    signer = Sessions(b"s" * 32, hours=1)
    signer.lifetime = -1
    value, _ = signer.issue(GRANT)
    assert signer.read(value) is None


def test_the_csrf_token_is_the_sessions_own() -> None:
    signer = Sessions(b"s" * 32, hours=1)
    _, one = signer.issue(GRANT)
    _, two = signer.issue(GRANT)
    assert signer.csrf_ok(one, signer.csrf(one))
    assert not signer.csrf_ok(one, signer.csrf(two)) and not signer.csrf_ok(one, None) and not signer.csrf_ok(one, "")
    assert one.e > time.time()
