"""docs/compatibility.md is generated from the protocol types; it must not drift."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.heavy
def test_compatibility_doc_is_current():
    generated = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_compat.py")], capture_output=True, text=True, check=True
    ).stdout
    committed = (ROOT / "docs" / "compatibility.md").read_text()
    assert generated == committed, (
        "docs/compatibility.md is stale: run python scripts/gen_compat.py > docs/compatibility.md"
    )


def test_every_request_field_has_a_status():
    text = (ROOT / "docs" / "compatibility.md").read_text()
    for field in ("`max_tokens`", "`stop_sequences`", "`context_management`", "`thinking`"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {field} |"))
        assert "supported" in row or "ignored" in row or "rejected" in row
