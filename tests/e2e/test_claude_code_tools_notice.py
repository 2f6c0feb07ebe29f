"""Claude Code, interactive, in front of a model whose chat template drops tools: the person at
the prompt reads the gateway's note in the first reply, and the model never reads it, though
Claude Code sends the reply back with the next question (dragoman.notices.tools_dropped).

The upstream counts prompts as vLLM does, and counts none for tools, as for SmolLM2's template
(tests/e2e/test_tools_dropped.py has the real local model's own report and the note on it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dragoman.notices.tools_dropped import MARK
from tests.support.claude_cli import FAILURES, STEP_TIMEOUT, first_run, readme_claude
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream
from tests.support.servers import GatewayServer, config_for, wait_tool_support
from tests.support.terminal import ENTER

pytestmark = pytest.mark.claude_code

FIRST, SECOND = "What does notes.txt say?", "And todo.txt?"
ANSWERS = ("notes.txt says: buy milk.", "todo.txt says: call Ada.")


def answer(body: dict[str, Any]) -> Reply:
    """Claude Code's main loop streams: the first answer, then the second once the conversation
    has an assistant turn; side requests (the session title) get a short text."""
    if not body.get("stream"):
        return Reply(body=completion("OK"))
    later = any(m.get("role") == "assistant" for m in body.get("messages", []))
    text = ANSWERS[1] if later else ANSWERS[0]
    return Reply(chunks=text_stream(text[:10], text[10:]))


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream().start()
    fake.template_drops_tools = True
    fake.responder = answer
    yield fake
    fake.stop()


@pytest.fixture
def gateway(upstream: FakeUpstream) -> Iterator[GatewayServer]:
    server = GatewayServer(config_for(upstream.url, default_model="test-model")).start()
    try:
        wait_tool_support(server, "default")
        yield server
    finally:
        server.stop()


def ask(terminal: Any, question: str, expected: str) -> str:
    terminal.type(question)
    terminal.type(ENTER)
    terminal.wait_for(lambda text: expected in text or any(f in text for f in FAILURES), STEP_TIMEOUT)
    return terminal.text()


def test_claude_code_shows_the_note_and_never_sends_it_to_the_model(
    gateway: GatewayServer, upstream: FakeUpstream, tmp_path: Path
) -> None:
    terminal = readme_claude(gateway.url, tmp_path / "home", tmp_path / "work")
    try:
        first_run(terminal)
        shown = ask(terminal, FIRST, ANSWERS[0])
        assert ANSWERS[0] in shown, f"no answer on the screen:\n{shown}"
        terminal.wait_for(lambda text: MARK in text, STEP_TIMEOUT)  # the note's block follows the model's
        shown = terminal.text()
        assert MARK in shown and "cannot use tools" in " ".join(shown.split()), f"no note on the screen:\n{shown}"
        shown = ask(terminal, SECOND, ANSWERS[1])
        assert ANSWERS[1] in shown and not [f for f in FAILURES if f in shown], shown
    finally:
        terminal.close()
    with_tools = [r for r in upstream.requests if r.get("tools") and r.get("stream")]
    assert [r for r in with_tools if any(m.get("role") == "assistant" for m in r["messages"])], "no second turn"
    assert MARK not in json.dumps(upstream.requests)  # Claude Code sent it back; the model never got it
