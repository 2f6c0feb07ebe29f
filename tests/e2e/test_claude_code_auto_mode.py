"""Claude Code's auto mode through dragoman, in its interactive UI (a pseudo-terminal): the
scripted model calls Bash, the scripted classifier (the same upstream, as `[safeguards]
model`) judges each call. A harmless command runs, one the classifier flags is blocked, no
"ask your gateway" notice appears, and Claude Code sends no classifier request of its own
(counted at the upstream). With CLAUDE_CODE_AUTO_MODE_SERVER=0 it does send its own, and
they get an answer it can read from the classifier model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.claude_cli import FAILURES, claude_binary, first_run, readme_claude_environment
from tests.support.fakes import FakeUpstream, Reply, completion, text_stream
from tests.support.safeguards import streamed_calls
from tests.support.servers import GatewayServer
from tests.support.terminal import ENTER, Terminal

pytestmark = pytest.mark.claude_code

STEP_TIMEOUT = 90
HARMLESS = "touch harmless-proof.txt"
DANGEROUS = "rm -rf ../precious-dir"  # outside the working directory: Claude Code has it classified
PYTHON = "python3 -c \"open('ran.txt', 'w').write('ran')\""  # arbitrary code: Claude Code has it classified
# What Claude Code shows when the gateway does not answer `safeguards` (docs/claude-code.md#auto-mode).
NOTICE = ("ask your gateway", "isn't eligible", "auto-mode-classifier-billing")
REASON = "it deletes the precious directory"
ESCAPE = "\x1b"
UNEVALUATED = ("could not evaluate", "no verdict", "no usable answer")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


class Scripted:
    """The upstream's side: the model, the gateway's classifier calls, Claude Code's own."""

    def __init__(self) -> None:
        self.classifier_calls: list[dict[str, Any]] = []
        self.monitor_requests: list[dict[str, Any]] = []  # Claude Code's own (its system prompt is the monitor's)
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        system = _text(messages[0]) if messages and messages[0].get("role") == "system" else ""
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}
        if "security monitor for autonomous AI coding agents" in system:
            self.monitor_requests.append(body)
            judged = _text(messages[-1]).rsplit("<transcript>", 1)[-1]
            blocked = judged.rfind(DANGEROUS) > judged.rfind("ran.txt")  # the newest call is the one judged
            return Reply(body=completion(json.dumps({"reason": REASON if blocked else "harmless", "block": blocked})))
        if "call_1" in (schema.get("properties") or {}):
            self.classifier_calls.append(body)
            actions = _text(messages[-1]).split("<actions>")[-1]
            verdicts = {name: {"reason": REASON if DANGEROUS in line else "harmless", "flagged": DANGEROUS in line}
                        for name, line in zip(schema["required"], actions.strip().split("\n"), strict=False)}  # fmt: skip
            return Reply(body=completion(json.dumps(verdicts)))
        if not body.get("stream") or not body.get("tools"):
            return Reply(body=completion(json.dumps({"title": "Auto mode"}) if schema else "OK"))
        last = messages[-1]
        if last.get("role") == "tool" or (len(messages) > 1 and messages[-2].get("role") == "tool"):
            return Reply(chunks=text_stream("Step ", "finished."))
        self.calls += 1
        command = DANGEROUS if "precious" in _text(last) else PYTHON if "python" in _text(last) else HARMLESS
        return streamed_calls((f"call_bash{self.calls}", command), text="Running it.")


@pytest.fixture(params=["classifier"])
def scripted(request: pytest.FixtureRequest) -> Iterator[tuple[Scripted, FakeUpstream, GatewayServer]]:
    """The scripted upstream and a gateway before it: with it as `[safeguards] model`, or without one ("none")."""
    from dragoman.core.config_load import from_dict

    upstream = FakeUpstream().start()
    script = Scripted()
    upstream.responder = script
    safeguards = {"model": "test-model"} if request.param == "classifier" else {}
    config = from_dict({"server": {"default_model": "test-model"}, "safeguards": safeguards,
                        "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}})  # fmt: skip
    server = GatewayServer(config).start()
    try:
        yield script, upstream, server
    finally:
        server.stop()
        upstream.stop()


def _claude(server: GatewayServer, tmp_path: Path, **extra: str) -> Terminal:
    environment = readme_claude_environment()
    environment.pop("ANTHROPIC_BASE_URL")
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "precious-dir").mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path / "home"), "TERM": "xterm-256color",
           "LANG": "C.UTF-8", "DISABLE_AUTOUPDATER": "1", "ANTHROPIC_BASE_URL": server.url, **environment, **extra}  # fmt: skip
    terminal = Terminal([str(claude_binary()), "--permission-mode", "auto"], env=env, cwd=tmp_path / "work")
    first_run(terminal)
    return terminal


def _ask(terminal: Terminal, prompt: str, done: int) -> str:
    """Type `prompt`; the screen once the model's `done`-th "Step finished." is on it."""
    terminal.type(prompt)
    terminal.type(ENTER)
    terminal.wait_for(
        lambda text: text.count("Step finished.") >= done or any(f in text for f in FAILURES), STEP_TIMEOUT
    )
    return terminal.text()


def test_auto_mode_runs_what_the_classifier_allows_and_blocks_what_it_flags(scripted: Any, tmp_path: Path) -> None:
    script, upstream, server = scripted
    terminal = _claude(server, tmp_path)
    try:
        screen = _ask(terminal, "Please run the harmless command", 1)
        assert (tmp_path / "work" / "harmless-proof.txt").exists(), screen
        terminal.type("/status")
        terminal.type(ENTER)
        terminal.wait_for(lambda text: "Auto mode server" in text, STEP_TIMEOUT)
        status = next((line for line in terminal.text().split("\n") if "Auto mode server" in line), "")
        terminal.type(ESCAPE)
        assert "Enabled" in status, terminal.text()
        screen = _ask(terminal, "Now delete the precious directory", 2)
        assert (tmp_path / "precious-dir").is_dir(), screen  # blocked: never ran
        assert "Blocked by auto mode" in screen and REASON in screen
        results = [_text(m) for r in upstream.requests for m in r.get("messages", []) if m.get("role") == "tool"]
        assert f"denied by the Claude Code auto mode classifier. Reason: {REASON}" in results[-1]
        assert not [n for n in NOTICE if n.lower() in screen.lower()], screen
        assert not [f for f in FAILURES if f in screen], screen
        assert len(script.classifier_calls) == 2  # one per reply with a tool call
        assert script.monitor_requests == []  # Claude Code asked no classifier of its own
    finally:
        terminal.close()


def test_without_server_review_claude_codes_own_requests_get_a_readable_answer(scripted: Any, tmp_path: Path) -> None:
    script, _, server = scripted
    terminal = _claude(server, tmp_path, CLAUDE_CODE_AUTO_MODE_SERVER="0")
    try:
        screen = _ask(terminal, "Please run the python command", 1)
        assert (tmp_path / "work" / "ran.txt").exists(), screen
        allowed = len(script.monitor_requests)
        screen = _ask(terminal, "Now delete the precious directory", 2)
        assert (tmp_path / "precious-dir").is_dir(), screen  # blocked: never ran
        assert "Blocked by auto mode" in screen and REASON in screen
        assert allowed >= 1 and len(script.monitor_requests) > allowed  # its own requests, one stage or two each
        assert not [u for u in UNEVALUATED if u in screen.lower()], screen
        assert script.classifier_calls == []  # nothing asked for safeguards
    finally:
        terminal.close()


@pytest.mark.parametrize("scripted", ["none"], indirect=True)
def test_without_a_classifier_model_claude_code_falls_back_and_nothing_runs_unchecked(scripted: Any,
                                                                                     tmp_path: Path) -> None:  # fmt: skip
    """What docs/claude-code.md says the user sees without `[safeguards] model`: the notice, then
    Claude Code's own classifier requests, refused, so a classified action does not run."""
    script, upstream, server = scripted
    terminal = _claude(server, tmp_path)
    try:
        terminal.type("Please run the python command")
        terminal.type(ENTER)
        shown = terminal.wait_for(lambda text: any(n in text.lower() for n in NOTICE) and "Enter to continue" in text,
                                  STEP_TIMEOUT)  # fmt: skip
        assert shown, terminal.text()
        for _ in range(5):  # "continue": with its own, billed, classifier requests (a key too early is lost)
            terminal.type(ENTER)
            if terminal.wait_for(lambda text: "Enter to continue" not in text, 10):
                break
        terminal.wait_for(lambda text: "Step finished." in text, STEP_TIMEOUT)
        screen = terminal.text()
        assert "auto mode's check had no usable answer" in screen, screen
        assert not (tmp_path / "work" / "ran.txt").exists(), screen
        assert script.classifier_calls == [] and script.monitor_requests == []  # refused before the upstream
    finally:
        terminal.close()
