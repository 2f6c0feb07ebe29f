"""The test helper's promise on a fresh machine: without a server or the binaries to
start one, a test fails saying what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.postgres import PrivatePostgres


def test_without_initdb_the_failure_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="initdb and pg_ctl are not on PATH"):
        PrivatePostgres()
