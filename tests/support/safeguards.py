"""Claude Code's auto mode in tests: the `safeguards` it sends, and scripted classifier answers."""

from __future__ import annotations

import json
from typing import Any

from tests.support.fakes import Reply, chunk, completion, usage_chunk

BETA = "dangerous-tool-use-2026-09-03"
BETAS = f"claude-code-20250219,{BETA},afk-mode-2026-01-31"
CONTEXT = {
    "v": 1,
    "permission_mode": "auto",
    "platform": "linux",
    "live_cwd": "/work/proj",
    "home_dir": "/home/u",
    "trusted_directories": ["/work/proj"],
    "rules": {"allow": [{"rule": "Bash(ls:*)", "source": "userSettings"}], "deny": [], "ask": []},
    "auto_mode": {"soft_deny": ["never touch production"]},
    "git_state": {"cwd": "/work/proj", "branch": "main", "user_email": "someone@example.com"},
}
SAFEGUARDS = [{"type": "dangerous_tool_use", "classifier_context": CONTEXT}]
BASH = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def bash_call(call_id: str, command: str) -> dict[str, Any]:
    """An OpenAI tool call of Bash, as the scripted model makes it."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "Bash", "arguments": json.dumps({"command": command})},
    }


def model_calls(*calls: tuple[str, str], text: str = "Let me run that.") -> Reply:
    """The scripted model's whole reply: `text`, then a Bash call per (id, command)."""
    return Reply(body=completion(text, finish="tool_calls", tool_calls=[bash_call(i, c) for i, c in calls]))


def streamed_calls(*calls: tuple[str, str], text: str = "Let me run that.") -> Reply:
    """The same reply streamed, arguments in two fragments each, as vLLM streams them."""
    chunks: list[Any] = [chunk({"role": "assistant", "content": text})]
    for index, (call_id, command) in enumerate(calls):
        arguments = json.dumps({"command": command})
        head = {"index": index, "id": call_id, "type": "function", "function": {"name": "Bash", "arguments": ""}}
        chunks.append(chunk({"tool_calls": [head]}))
        for piece in (arguments[:5], arguments[5:]):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    return Reply(chunks=[*chunks, chunk({}, "tool_calls"), usage_chunk(20, 9)])


def verdicts(*flagged: bool, reason: str = "looks fine") -> Reply:
    """The classifier's answer, as its schema asks: call_1.. in order, each flagged or not."""
    answer = {f"call_{n}": {"reason": reason if not f else "deletes the home directory", "flagged": f}
              for n, f in enumerate(flagged, 1)}  # fmt: skip
    return Reply(body=completion(json.dumps(answer), prompt=900, completion_tokens=30))


def is_classifier(request: dict[str, Any]) -> bool:
    """Whether an upstream request is the gateway's classifier call (its answer held to a schema)."""
    return (request.get("response_format") or {}).get("type") == "json_schema"
