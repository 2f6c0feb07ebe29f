"""The Claude Code CLI for the tests that run it, and the command line the README gives for it."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from dragoman_local.localmodel import cache_dir
from tests.support.terminal import DOWN, ENTER, Terminal

README = Path(__file__).parents[2] / "README.md"
# What Claude Code draws when it cannot use the gateway (seen with ANTHROPIC_API_KEY on a fresh home).
FAILURES = ("Unable to connect", "Not logged in", "API Error", "issue with the selected model", "/login")
STEP_TIMEOUT = 60


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


def first_run(terminal: Terminal) -> None:
    """Through the first-run screens to the prompt, as a person answers them."""
    answered: set[str] = set()
    screens = (  # (what the screen shows, the keys a person presses)
        ("Choose the text style", ENTER),  # the theme: the default
        ("Press Enter to continue", ENTER),  # the security notes
        ("Yes, I trust this folder", DOWN + ENTER),  # the folder is the user's own
        ("custom API key", ENTER),  # the default answer, as a person in a hurry gives it
    )

    def ready(text: str) -> bool:
        return any(failure in text for failure in FAILURES) or (
            "trust" in answered and ("for shortcuts" in text or "shift+tab" in text)
        )

    for _ in range(10):
        if terminal.wait_for(
            lambda text: ready(text) or any(s in text and s not in answered for s, _ in screens), STEP_TIMEOUT
        ):
            text = terminal.text()
            if ready(text):
                return
            shown, keys = next((s, k) for s, k in screens if s in text and s not in answered)
            answered.add("trust" if "trust" in shown else shown)
            terminal.type(keys)
        else:
            break
    pytest.fail(f"Claude Code did not reach its prompt; the screen:\n{terminal.text()}")


def readme_claude(base_url: str, home: Path, work: Path) -> Terminal:
    """`claude` in a pseudo-terminal as the README's line starts it, on the empty `home`,
    with its base URL pointed at `base_url`."""
    environment = readme_claude_environment()
    environment["ANTHROPIC_BASE_URL"] = base_url
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TERM": "xterm-256color",
           "LANG": "C.UTF-8", **environment}  # fmt: skip
    return Terminal([str(claude_binary())], env=env, cwd=work)
