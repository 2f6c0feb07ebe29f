"""Helpers of the Files API tests (tests/integration/files): uploads through the SDK and raw HTTP, and the files they send."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic

from dragoman.core.owners import SALT_FILE
from tests.support.servers import GatewayServer

KEY = "test-key"


MODEL = "eyes"  # a vision model in front of the fake upstream's test-model


PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)  # a 1x1 PNG


NATIVE_UPSTREAM = {"protocol": "anthropic", "api_key": "upstream-secret", "max_retries": 0}


def image_file(file_id: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "file", "file_id": file_id}}


def document_file(file_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "document", "source": {"type": "file", "file_id": file_id}, **extra}


def ask(*blocks: dict[str, Any], text: str = "What is this?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*blocks, {"type": "text", "text": text}]}]


def stored(files_dir: Path) -> set[str]:
    """The file ids whose metadata is in the directory (in an owner's directory, or flat)."""
    return {path.stem for path in files_dir.rglob("file_*.json")}


def on_disk(files_dir: Path) -> list[str]:
    """The names of every file in the directory, owners' directories included (not the gateway's
    owner salt, which it keeps there)."""
    return sorted(path.name for path in files_dir.rglob("*") if path.is_file() and path.name != SALT_FILE)


def path_of(files_dir: Path, name: str) -> Path:
    """Where a stored file's content (or, with .json, metadata) is: in its owner's directory."""
    found = list(files_dir.glob(f"*/{name}"))
    assert len(found) <= 1, found
    return found[0] if found else files_dir / "nowhere" / name


def sdk(gateway: GatewayServer, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=10)
