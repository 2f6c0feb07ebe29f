"""Claude Code's interactive UI, started as the README says, on a fresh home directory.

`claude -p` skips the first-run screens and the login check; a new user meets both. This
starts `claude` in a pseudo-terminal with an empty HOME and exactly the variables of the
README's line (its base URL pointed at the test gateway), answers the first-run screens as a
person would (the theme, the security notes, trusting the folder), asks a question, and
reads the answer off the screen.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.claude_cli import FAILURES, STEP_TIMEOUT, claude_binary, first_run, readme_claude_environment
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream
from tests.support.servers import GatewayServer, config_for
from tests.support.terminal import ENTER, Terminal

pytestmark = pytest.mark.claude_code

QUESTION = "Which gateway answers?"
ANSWER = "dragoman answers from the local model."


def answer(body: dict[str, Any]) -> Reply:
    """The main loop's stream gets ANSWER; side requests (the session title) get a short text."""
    if body.get("stream"):
        return Reply(chunks=text_stream(ANSWER[:9], ANSWER[9:]))
    return Reply(body=completion("OK"))


@pytest.fixture
def gateway() -> Iterator[GatewayServer]:
    upstream = FakeUpstream().start()
    upstream.responder = answer
    server = GatewayServer(config_for(upstream.url, default_model="test-model")).start()
    try:
        yield server
    finally:
        server.stop()
        upstream.stop()


def test_the_readme_line_starts_claude_code_on_a_fresh_home(gateway: GatewayServer, tmp_path: Path) -> None:
    environment = readme_claude_environment()
    assert environment.pop("ANTHROPIC_BASE_URL") == "http://127.0.0.1:8765"
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"), "TERM": "xterm-256color", "LANG": "C.UTF-8",
           "ANTHROPIC_BASE_URL": gateway.url, **environment}  # fmt: skip
    terminal = Terminal([str(claude_binary())], env=env, cwd=tmp_path / "work")
    try:
        first_run(terminal)
        text = terminal.text()
        assert not [f for f in FAILURES if f in text], f"Claude Code failed before the prompt:\n{text}"
        terminal.type(QUESTION)
        terminal.type(ENTER)
        shown = terminal.wait_for(lambda text: ANSWER in text or any(f in text for f in FAILURES), STEP_TIMEOUT)
        text = terminal.text()
        assert shown and ANSWER in text, f"no answer on the screen:\n{text}"
        assert not [f for f in FAILURES if f in text], text
    finally:
        terminal.close()
