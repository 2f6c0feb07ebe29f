"""Owner names: what the gateway calls an API key (or a tenant) on disk, without revealing it.

An owner is a salted digest of its key or tenant: HMAC-SHA256 under a secret of the gateway's
own (`SALT_FILE` in `files.dir`, made at first start) of the plain digest earlier versions used
(`legacy`). Directory names therefore cannot be matched against digests of guessed keys by
anyone who can read names but not the salt (a listing, a backup's index, a log line).

Earlier versions named owners by the plain digest (32 hex digits; a salted one has 64), so:

- their owner directories are renamed to the salted name at start-up (`rename_legacy_dirs`),
  one rename per owner, in files' and batches' directories alike;
- the owner recorded inside their metadata and batch records stays the plain digest, and is
  read through `canonical`, which salts it: those files and batches stay reachable, by their
  key only, without rewriting anything.

Every process that shares `batches.dir` must share `files.dir` too (a batch request may name
a file, and the salt is kept there).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from dragoman.core.storage import sync_dir, write_synced

log = logging.getLogger("dragoman")

SALT_FILE = ".owner-salt"
LEGACY_LENGTH = 32  # hex digits of an earlier version's plain digest
_HEX = frozenset("0123456789abcdef")


def legacy(basis: str) -> str:
    """The plain digest earlier versions named an owner by (`tenant\\0NAME` or `key\\0KEY`)."""
    return hashlib.sha256(basis.encode()).hexdigest()[:LEGACY_LENGTH]


def is_legacy(owner: str) -> bool:
    return len(owner) == LEGACY_LENGTH and set(owner) <= _HEX


class Owners:
    """Salted owner names, under one gateway's salt; None where no owner is named (no API
    keys, or `share_between_keys`): every caller is then the owner "", and nothing is salted."""

    def __init__(self, salt: bytes | None) -> None:
        self._salt = salt

    def of(self, basis: str) -> str:
        """The owner name of a key or tenant (`basis`, as for `legacy`)."""
        return self._salted(legacy(basis))

    def canonical(self, recorded: str) -> str:
        """An owner as recorded in a file's metadata or a batch's record: an earlier version's
        plain digest is salted, so it compares equal to its key's owner now."""
        return self._salted(recorded) if is_legacy(recorded) else recorded

    def _salted(self, plain: str) -> str:
        if self._salt is None:
            return plain
        return hmac.new(self._salt, plain.encode(), hashlib.sha256).hexdigest()

    def rename_legacy_dirs(self, root: Path) -> int:
        """Rename the owner directories under `root` named by a plain digest to their salted
        names; the number renamed. Safe while other processes do the same: a rename that
        another made first is passed by; a directory both names hold (an older process wrote
        after the rename) has its entries moved one by one."""
        if self._salt is None:
            return 0
        try:
            with os.scandir(root) as entries:
                found = [entry.name for entry in entries if entry.is_dir() and is_legacy(entry.name)]
        except FileNotFoundError:
            return 0
        renamed = 0
        for name in found:
            old, new = root / name, root / self._salted(name)
            try:
                os.rename(old, new)
            except FileNotFoundError:
                continue  # another process renamed it
            except OSError:  # the salted directory exists and is not empty
                for entry in os.listdir(old):
                    with contextlib.suppress(OSError):
                        os.rename(old / entry, new / entry)
                with contextlib.suppress(OSError):
                    old.rmdir()
            renamed += 1
        if renamed:
            sync_dir(root)
        return renamed


def load_salt(directory: Path) -> bytes:
    """The gateway's salt, kept in `directory` (made with the first start, 0600): whichever
    process makes it first, every process reads the same one."""
    path = directory / SALT_FILE
    with contextlib.suppress(FileNotFoundError):
        return _read(path)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    made = directory / f".{SALT_FILE}.{os.getpid()}.new"
    write_synced(made, secrets.token_hex(32).encode())
    try:
        os.link(made, path)  # never replaces a salt another process made meanwhile
        sync_dir(directory)
    except FileExistsError:
        pass
    finally:
        made.unlink(missing_ok=True)
    return _read(path)


def _read(path: Path) -> bytes:
    salt = path.read_bytes().strip()
    if len(salt) < 32:
        raise OSError(f"{path} holds no salt (delete it only if no files or batches were stored with it)")
    return salt
