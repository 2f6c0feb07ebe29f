"""Owner directories on disk, over a real socket with the official SDK: named by a salted
digest of the key (a weak key cannot be guessed from a name), and files and batches that
earlier versions stored under the plain digest (in its directory, or flat) stay reachable by
their key, and by no other, after the directories are renamed at start-up."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import anthropic

from dragoman.batches.store import BatchStore, Record
from dragoman.core.config import FilesConfig
from dragoman.core.owners import legacy
from dragoman.files.store import FileStore
from tests.support.batches import answer_per_marker, params, wait_ended
from tests.support.fakes import FakeUpstream
from tests.support.servers import GatewayServer

KEYS = ["weak", "other-key"]


def _start(gateway_from: Callable[[dict], GatewayServer], upstream: FakeUpstream, root: Path) -> GatewayServer:
    return gateway_from({
        "server": {"api_keys": KEYS},
        "files": {"dir": str(root / "files")},
        "batches": {"dir": str(root / "batches")},
        "upstreams": {"default": {"url": upstream.url, "max_retries": 0}},
    })  # fmt: skip


def _sdk(gateway: GatewayServer, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=5)


def _owner_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("msgbatch_", ".")))


def test_owner_directories_are_salted_digests_not_digests_of_the_key(gateway_from, upstream, tmp_path):
    answer_per_marker(upstream)
    names = []
    for place in ("one", "two"):  # two gateways, each with its own salt
        client = _sdk(_start(gateway_from, upstream, tmp_path / place), "weak")
        client.beta.files.upload(file=("a.txt", b"hello", "text/plain"))
        client.messages.batches.create(requests=[{"custom_id": "r", "params": params()}])
        files, batches = _owner_dirs(tmp_path / place / "files"), _owner_dirs(tmp_path / place / "batches")
        assert files == batches and len(files) == 1  # one name for the key in both stores
        names.append(files[0])
    plain = legacy("key\0weak")
    assert plain not in names and all(len(name) == 64 for name in names)
    assert names[0] != names[1]  # not a function of the key alone


def test_files_and_batches_under_the_plain_digest_stay_their_keys_only(gateway_from, upstream, tmp_path):
    answer_per_marker(upstream)
    plain = legacy("key\0weak")
    files_dir, batches_dir = tmp_path / "files", tmp_path / "batches"
    store = FileStore(FilesConfig(dir=str(files_dir)))  # as an earlier version wrote them
    kept = asyncio.run(store.save("kept.txt", "text/plain", b"in its directory", owner=plain))
    flat = asyncio.run(store.save("flat.txt", "text/plain", b"flat", owner=plain))
    for suffix in ("", ".json"):
        os.rename(files_dir / plain / (flat.id + suffix), files_dir / (flat.id + suffix))
    body = json.dumps({"requests": [{"custom_id": "r", "params": params()}]}).encode()
    batch_ids = []
    for n, place in enumerate(("dir", "flat")):
        record = Record(id=f"msgbatch_01legacy{place}", owner=plain, created=time.time() - 10 + n,
                        expires=time.time() + 3600, total=1, headers={"anthropic-version": "2023-06-01"})  # fmt: skip
        where = BatchStore(batches_dir).create(record, body)
        if place == "flat":
            os.rename(where.path, batches_dir / record.id)
        batch_ids.append(record.id)

    gateway = _start(gateway_from, upstream, tmp_path)
    mine, theirs = _sdk(gateway, "weak"), _sdk(gateway, "other-key")
    assert sorted(f.id for f in mine.beta.files.list()) == sorted([kept.id, flat.id])
    reply = mine.messages.create(model="test-model", max_tokens=16, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "file", "file_id": kept.id}}, {"type": "text", "text": "say <<doc>>"}]}])  # fmt: skip
    assert reply.content
    assert "in its directory" in json.dumps(upstream.requests[-1])
    for batch_id in batch_ids:
        assert wait_ended(mine, batch_id).request_counts.succeeded == 1
    assert sorted(b.id for b in mine.messages.batches.list().data) == sorted(batch_ids)
    assert list(theirs.beta.files.list()) == [] and theirs.messages.batches.list().data == []
    assert plain not in _owner_dirs(files_dir) + _owner_dirs(batches_dir)  # renamed at start-up
    for batch_id in batch_ids:
        mine.messages.batches.delete(batch_id)
    mine.beta.files.delete(kept.id)
    assert [f.id for f in mine.beta.files.list()] == [flat.id]
