"""What a new user reads first: the banner `scripts/run` prints, and the local model's port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dragoman import quickstart as banner_module
from dragoman.cli import main
from dragoman.core.config_load import from_dict
from dragoman.quickstart import claude_command, quickstart
from tests.support.claude_cli import claude_command_line, claude_environment, readme_claude_environment

LOCAL = "http://127.0.0.1:40123/v1"


def banner(**options: bool) -> str:
    config = from_dict({"server": {"default_model": "smollm2-135m-instruct"}, "upstreams": {"local": {"url": LOCAL}}})
    return quickstart(config, LOCAL, **options)


def test_the_banner_starts_claude_code_as_the_readme_does() -> None:
    # The README's line is the one tests/e2e/test_claude_code_interactive.py proves on a fresh home.
    assert claude_environment(claude_command_line(banner())) == readme_claude_environment()


def test_the_banner_names_the_local_upstream_and_the_commands_that_inspect_it() -> None:
    text = banner()
    assert f"dragoman check --upstream {LOCAL}" in text
    assert f"dragoman models --upstream {LOCAL}" in text


def test_the_banner_says_beside_claude_code_that_the_local_model_drops_tools() -> None:
    said = banner(tools_dropped=True).split("Claude Code:", 1)[1]
    assert "chat template has no tools" in said and "The local model (llama-server)" in said
    assert "has no tools" not in banner()


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_claude_off_path_is_named_by_its_full_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/setup-claude-code links `claude` into the venv's bin, not on PATH until activated."""
    linked = _executable(tmp_path / "venv" / "bin" / "claude")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(banner_module.sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    command, note = claude_command()
    assert command == str(linked) and "not on PATH" in note
    line = claude_command_line(banner())
    assert line.endswith(f"any {linked}") and claude_environment(line) == readme_claude_environment()

    linked.unlink()  # not installed anywhere: the plain name, and how to install it
    command, note = claude_command()
    assert command == "claude" and "scripts/setup-claude-code" in note

    monkeypatch.setenv("PATH", str(_executable(tmp_path / "on-path" / "claude").parent))
    assert claude_command() == ("claude", "")


def test_the_local_model_has_a_stable_default_port() -> None:
    serve = main.commands["serve"]  # type: ignore[attr-defined]
    (option,) = [p for p in serve.params if p.name == "local_port"]
    assert option.default == 8766 and "--local-port" in option.opts


def test_a_taken_local_port_is_refused_naming_the_flag(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRAGOMAN_")} | {
            "DRAGOMAN_CACHE_DIR": str(tmp_path)
        }
        done = subprocess.run([sys.executable, "-m", "dragoman", "serve", "--local-port", str(port)], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port} for the local model (--local-port N" in done.stderr
    assert not list(tmp_path.glob("llama-server-*")), "nothing is built for a port it cannot use"
