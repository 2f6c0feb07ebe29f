"""The classifier's prompt: what it shows, what it leaves out, and the budget."""

from __future__ import annotations

import json

from dragoman.safeguards import prompt


def _turns(n: int) -> list[dict]:
    messages: list[dict] = []
    for i in range(n):
        messages.append({"role": "user", "content": f"request {i} " + "x" * 100})
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"prose {i}"},
                                                          {"type": "tool_use", "id": f"t{i}", "name": "Bash",
                                                           "input": {"command": f"cmd {i}"}}]})  # fmt: skip
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": f"out {i}"}]}
        )
    return messages


def test_the_transcript_keeps_the_first_turn_and_the_newest_within_budget() -> None:
    text = prompt.transcript(_turns(50), budget=2000)
    lines = text.split("\n")
    assert len(text) <= 2000
    assert json.loads(lines[0])["user"].startswith("request 0 ")
    assert json.loads(lines[1]) == {"meta": "earlier turns omitted"}
    assert json.loads(lines[-1]) == {"tool_call": {"name": "Bash", "input": {"command": "cmd 49"}}}
    assert "prose" not in text and "out 4" not in text


def test_a_short_transcript_is_whole_and_each_line_is_clipped() -> None:
    text = prompt.transcript([{"role": "user", "content": "y" * 5000}, *_turns(1)], budget=100_000)
    assert "earlier turns omitted" not in text
    assert text.split("\n")[0].endswith("... (5012 chars)") and len(text.split("\n")[0]) < 2100


def test_the_environment_keeps_the_rules_not_the_identity() -> None:
    context = {"permission_mode": "auto", "rules": {"deny": ["Bash(rm:*)"]}, "user": {"email": "a@b"},
               "git_state": {"branch": "main", "remote_url": "git@secret"}, "rule_roots": {"x": "y"}}  # fmt: skip
    shown = json.loads(prompt.environment(context))
    assert shown == {"permission_mode": "auto", "rules": {"deny": ["Bash(rm:*)"]}, "git_state": {"branch": "main"}}


def test_the_request_puts_what_changes_least_first_and_names_each_call() -> None:
    calls = [{"id": "toolu_a", "name": "Bash", "input": {"command": "ls"}},
             {"id": "toolu_b", "name": "Write", "input": {"file_path": "/etc/passwd"}}]  # fmt: skip
    body = prompt.request("judge", {"platform": "linux"}, _turns(2), calls, budget=24_000)
    blocks = [b["text"] for b in body["messages"][0]["content"]]
    assert body["system"] == prompt.SYSTEM
    assert [b.split("\n")[0] for b in blocks] == ["<environment>", "<transcript>", "<actions>"]
    assert '"action": "call_2", "tool": "Write"' in blocks[2]
    assert body["output_config"]["format"]["schema"]["required"] == ["call_1", "call_2"]


def test_verdicts_are_read_by_call_number_and_a_garbled_one_is_left_out() -> None:
    text = 'Sure: ```json\n{"call_1": {"reason": "ok", "flagged": false}, "call_2": {"flagged": "yes"}}\n```'
    assert prompt.verdicts(text, 3) == {1: (False, "ok")}
    assert prompt.verdicts("no json here", 1) is None
