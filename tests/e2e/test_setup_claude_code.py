"""The README's Claude Code lines on a fresh home: `scripts/setup-claude-code`, then activating
the virtualenv, and `claude` is found (it was not on PATH after the README's steps before)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dragoman_local.localmodel import cache_dir
from tests.support.claude_cli import README, claude_binary

pytestmark = pytest.mark.claude_code

REPO = Path(__file__).parents[2]


def readme_lines() -> list[str]:
    """The README's code block that sets up Claude Code, its commands without their comments."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.DOTALL)
    (block,) = [b for b in blocks if "scripts/setup-claude-code" in b]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_setup_claude_code_then_the_readme_finds_claude(tmp_path: Path) -> None:
    claude_binary()  # the pinned CLI in the cache (a skip or a failure without it): nothing is downloaded here
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "setup-claude-code", clone / "scripts" / "setup-claude-code")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", clone / ".venv"], check=True, timeout=120)
    (tmp_path / "home").mkdir()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "LANG": "C.UTF-8",
           "DRAGOMAN_CACHE_DIR": str(cache_dir())}  # fmt: skip
    setup, activate, start = readme_lines()
    assert setup == "scripts/setup-claude-code" and activate == ". .venv/bin/activate"
    assert start.endswith(" claude")
    script = "\n".join(["set -e", setup, activate, "command -v claude", f"{start} --version"])
    done = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found, version = done.stdout.splitlines()[-2:]
    assert found == str(clone / ".venv" / "bin" / "claude")
    assert "Claude Code" in version, done.stdout
    assert f"linked {clone / '.venv' / 'bin' / 'claude'}" in done.stderr
