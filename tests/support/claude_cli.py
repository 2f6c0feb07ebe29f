"""The Claude Code CLI for the tests that run it, and the command line the README gives for it."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from dragoman_local.localmodel import cache_dir

README = Path(__file__).parents[2] / "README.md"


def claude_binary() -> Path:
    """The pinned CLI (scripts/setup-claude-code); a failure when missing, a skip with
    DRAGOMAN_SKIP_CLAUDE_CODE=1."""
    if os.environ.get("DRAGOMAN_SKIP_CLAUDE_CODE") == "1":
        pytest.skip("DRAGOMAN_SKIP_CLAUDE_CODE=1")
    explicit = os.environ.get("DRAGOMAN_CLAUDE_BIN")
    path = Path(explicit) if explicit else cache_dir() / "claude-code" / "node_modules" / ".bin" / "claude"
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"the Claude Code CLI is not installed at {path}: run scripts/setup-claude-code "
            "(needs npm), or set DRAGOMAN_SKIP_CLAUDE_CODE=1 to skip these tests",
            pytrace=False,
        )
    return path


def claude_command_line(text: str) -> str:
    """The first line of `text` that starts Claude Code: `VAR=value ... claude` (or `.../bin/claude`)."""
    match = re.search(r"((?:ANTHROPIC_\w+=\S+[ \t]+)+(?:\S*/)?claude)[ \t]*$", text, re.MULTILINE)
    assert match, "no `ANTHROPIC_...=... claude` line"
    return match.group(1)


def claude_environment(line: str) -> dict[str, str]:
    """The variables a `VAR=value ... claude` line sets."""
    *assignments, program = shlex.split(line)
    assert Path(program).name == "claude", line
    return dict(assignment.split("=", 1) for assignment in assignments)


def readme_claude_environment() -> dict[str, str]:
    """The variables the README's Claude Code line sets."""
    return claude_environment(claude_command_line(README.read_text()))
