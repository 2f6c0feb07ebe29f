"""The banner `dragoman serve` prints once the local model serves (`scripts/run`): how to talk
to it, the exact commands that inspect it, and a `claude` a new user's shell can find."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from dragoman.core.config import Config


def quickstart(config: Config, upstream_url: str, *, tools_dropped: bool = False) -> str:
    """The banner; `tools_dropped` adds that the local model never sees Claude Code's tools."""
    base = f"http://{config.server.host}:{config.server.port}"
    program = _program()
    claude, where = claude_command()
    tools = (
        "\n  (the local model's chat template has no tools: Claude Code cannot read files, search or edit with it;"
        "\n   docs/claude-code.md#models-whose-chat-template-drops-tools)"
        if tools_dropped
        else ""
    )
    return f"""
dragoman is serving the local model at {base}
  curl:        curl {base}/v1/messages -H 'content-type: application/json' \\
                 -d '{{"model":"{config.server.default_model}","max_tokens":64,"messages":[{{"role":"user","content":"Hello"}}]}}'
  Python SDK:  anthropic.Anthropic(base_url="{base}", api_key="any")
  Claude Code: ANTHROPIC_BASE_URL={base} ANTHROPIC_AUTH_TOKEN=any {claude}{where}{tools}
The local model (llama-server) listens at {upstream_url} while this runs; to inspect it:
  {program} check --upstream {upstream_url}
  {program} models --upstream {upstream_url}
"""


def claude_command() -> tuple[str, str]:
    """How to start Claude Code from here, and a note when that is not plain `claude`: the
    full path when the shell would not find it (scripts/setup-claude-code links it into the
    virtualenv's bin, which is on PATH only once activated)."""
    if shutil.which("claude"):
        return "claude", ""
    beside = Path(sys.executable).parent / "claude"  # the venv's bin, unresolved
    if os.access(beside, os.X_OK):
        return str(beside), "\n  (claude is not on PATH: its full path above; or `. .venv/bin/activate` first)"
    return "claude", "\n  (claude is not installed: scripts/setup-claude-code installs it, with npm, into .venv/bin)"


def _program() -> str:
    """How to run this dragoman again: its name when the shell finds this one by it, else its full
    path (`scripts/run` installs into .venv, which is not on PATH, from the repository's root)."""
    invoked = sys.argv[0]
    if os.path.basename(invoked) != "dragoman":  # python -m dragoman, or a test
        return "dragoman"
    found = shutil.which("dragoman")
    if found and os.path.realpath(found) == os.path.realpath(invoked):
        return "dragoman"
    return os.path.abspath(invoked)
