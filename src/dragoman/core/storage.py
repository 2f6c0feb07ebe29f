"""Writing the gateway's own files (uploads, batches) so that a crash or a power loss
leaves each file whole or absent, never half-written, and private to the gateway's user."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = "shared"  # the owner ""'s directory: not hex, so never a key's digest
_HEX = frozenset("0123456789abcdef")


def owner_dir(root: Path, owner: str) -> Path:
    """The directory of `owner`'s uploads or batches under `root`. An owner is a digest
    (`server.auth.owner`) or "": anything else is a bug, refused rather than made into a path."""
    if not owner:
        return root / SHARED
    if len(owner) > 64 or not set(owner) <= _HEX:
        raise ValueError(f"not an owner digest: {owner!r}")
    return root / owner


def sync_dir(path: Path) -> None:
    """Make the directory's entries (a rename, a new file) survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write a new file (0600) and sync it to disk."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: readers see the old file or the new one, whole. The
    temporary name starts with a dot, so no listing of the directory takes it for a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_synced(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise
    sync_dir(path.parent)
