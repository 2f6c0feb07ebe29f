"""CPU per request of the key check (`server.auth.check`): 3 configured keys against 100,000
keys made at run time, and the check before issue 31 (a scan of the configured keys).

    python bench/key_lookup.py [--keys 100000] [--requests 200000]

Process CPU time per check, best of 5 rounds, for a key presented in `x-api-key`.
"""

from __future__ import annotations

import argparse
import hmac
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from starlette.requests import Request

from dragoman.keys.connections import Sqlite
from dragoman.keys.records import KeyRow, digest, hint, key_id
from dragoman.keys.ring import Keyring
from dragoman.keys.store import KeyStore
from dragoman.server import auth

CONFIGURED = ["sk-team-a-0123456789", "sk-team-b-0123456789", "sk-team-c-0123456789"]


def _request(key: str) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/v1/messages", "query_string": b"",
                    "headers": [(b"x-api-key", key.encode()), (b"content-type", b"application/json")]})  # fmt: skip


def per_check(check: Callable[[], object], requests: int) -> float:
    """µs of CPU per call, the best of 5 rounds."""
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(requests):
            check()
        best = min(best, time.process_time() - started)
    return best / requests * 1e6


def before(request: Request, keys: frozenset[str]) -> None:
    """The check as it was: every configured key compared in constant time."""
    key = auth.presented_key(request)
    if key is None or not any(hmac.compare_digest(key.encode(), k.encode()) for k in keys):
        raise AssertionError


def ring_with(count: int, directory: Path) -> tuple[Keyring, str]:
    store = KeyStore(Sqlite(directory / "unused.sqlite3"))  # never opened: rows are applied as a poll would
    store.salt = bytes(range(32))
    ring = Keyring(CONFIGURED, store=store)
    last = ""
    rows = []
    for n in range(count):
        last = f"sk-dm-bench-{n:08d}-abcdefghijklmnopqrstuvwxyz"
        rows.append(KeyRow(id=key_id(last), digest=digest(store.salt, last), hint=hint(last), name=f"k{n}",
                           created_at=1.0, updated_at=1.0, version=n + 1))  # fmt: skip
    ring.apply(rows)
    return ring, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        small = Keyring(CONFIGURED)
        big, made = ring_with(args.keys, Path(directory))
        configured, keys, presented = _request(CONFIGURED[1]), frozenset(CONFIGURED), _request(made)
        rows = [
            ("before issue 31: 3 configured keys, scanned", per_check(lambda: before(configured, keys), args.requests)),
            ("3 configured keys", per_check(lambda: auth.check(configured, small), args.requests)),
            (f"{args.keys:,} made at run time, a configured key presented",
             per_check(lambda: auth.check(configured, big), args.requests)),
            (f"{args.keys:,} made at run time, one of them presented",
             per_check(lambda: auth.check(presented, big), args.requests)),
        ]  # fmt: skip
    print("| Keys | CPU per check |\n| --- | --- |")
    for name, micros in rows:
        print(f"| {name} | {micros:.2f} µs |")


if __name__ == "__main__":
    main()
