"""Two `dragoman serve` processes sharing one PostgreSQL: a change made through one (a key
made, its limit lowered, its models narrowed, its expiry passed, the key revoked) is
served by the other at its next poll (admin.poll_interval), never later than 2 s by
design; the tests wait for it by polling (`eventually`), with a bound for failure only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic

from tests.support.fakes import FakeUpstream
from tests.support.keys import ADMIN, answered, ask, create, update
from tests.support.postgres import pg_url  # noqa: F401 (fixture)
from tests.support.serve_process import _start
from tests.support.waiting import eventually


def _serve(upstream: FakeUpstream, database: str, tmp_path: Path, stop_later: Any) -> str:
    config = tmp_path / "dragoman.toml"
    config.write_text(
        f'[admin]\nkeys = ["{ADMIN}"]\npoll_interval = 1.0\n[usage]\ndatabase_url = {json.dumps(database)}\n'
    )
    process, url = _start(upstream.url, "--config", str(config))
    stop_later(process)
    return url


def _refused(url: str, key: str, error: type[anthropic.APIStatusError], saying: str = "") -> bool:
    try:
        ask(url, key)
    except error as refused:
        return saying in str(refused)
    except anthropic.APIError:
        return False
    return False  # still served


def _limited_to_one_a_minute(url: str, key: str) -> bool:
    try:
        ask(url, key)
    except anthropic.RateLimitError:
        pass  # this process already spent its one request
    return _refused(url, key, anthropic.RateLimitError)


def test_keys_made_limited_narrowed_expired_and_revoked_on_one_process_hold_on_the_other(
    upstream: FakeUpstream, pg_url: str, tmp_path: Path, stop_later: Any,  # noqa: F811
) -> None:  # fmt: skip
    one = _serve(upstream, pg_url, tmp_path, stop_later)
    two = _serve(upstream, pg_url, tmp_path, stop_later)
    made = eventually(answered(lambda: create(one, name="shared", limits={"requests_per_minute": 1000})), "a key made")
    key = made["key"]
    eventually(answered(lambda: ask(two, key)), "the key served by the other process", timeout=10)
    update(one, made["id"], limits={"requests_per_minute": 1})
    for url in (one, two):
        eventually(lambda url=url: _limited_to_one_a_minute(url, key), f"1 request a minute on {url}", timeout=10)  # type: ignore[misc]
    update(one, made["id"], models=["other-*"])
    for url in (one, two):
        eventually(lambda url=url: _refused(url, key, anthropic.PermissionDeniedError), f"403 on {url}", timeout=10)  # type: ignore[misc]
    update(two, made["id"], expires_at="2020-01-01T00:00:00Z")
    for url in (two, one):
        eventually(lambda url=url: _refused(url, key, anthropic.AuthenticationError, "expired"), f"expired on {url}",
                   timeout=10)  # type: ignore[misc]  # fmt: skip
    update(two, made["id"], status="inactive", expires_at=None)
    for url in (two, one):
        eventually(lambda url=url: _refused(url, key, anthropic.AuthenticationError, "inactive"), f"401 on {url}",
                   timeout=10)  # type: ignore[misc]  # fmt: skip
