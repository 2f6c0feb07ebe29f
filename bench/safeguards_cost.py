"""What Claude Code's auto mode costs through dragoman: the classifier call the gateway makes
for a reply with tool calls, against what Claude Code's own fallback sent (issue 29: ten
requests of about 36,000 input tokens for one action, ~360,000 tokens).

    python bench/safeguards_cost.py                         # the prompt's size only
    python bench/safeguards_cost.py --gateway http://127.0.0.1:8765 --model qwen3-coder --runs 5

The classifier prompt is built from the benchmark's `claude-code` conversation (bench/shapes.py,
~80 KB) and one Bash call, as `dragoman.safeguards.prompt` builds it. With `--gateway`, the
call is sent through a running dragoman to `--model` (the model you would set as
`[safeguards] model`) `--runs` times: its latency is the time a reply with tool calls waits
for its verdicts, and the upstream's usage gives the tokens it really took.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import shapes  # noqa: E402
from dragoman.safeguards import prompt  # noqa: E402

FALLBACK_TOKENS = 10 * 36_000  # Claude Code's own classifier requests for one action, as observed (issue 29)
CONTEXT = {
    "permission_mode": "auto", "platform": "linux", "live_cwd": "/work/proj", "home_dir": "/home/u",
    "trusted_directories": ["/work/proj"], "rules": {"allow": [], "deny": [], "ask": []},
    "auto_mode": {"soft_deny": ["Never push to main"]}, "git_state": {"branch": "fix-rounding"},
}  # fmt: skip
CALL = {"id": "toolu_bench", "name": "Bash", "input": {"command": "python -m pytest tests/test_money.py -q"}}


def classifier_body(model: str) -> dict[str, Any]:
    request = shapes.anthropic_request("claude-code", model=model, max_tokens=100, stream=False)
    return prompt.request(model, CONTEXT, request["messages"], [CALL], budget=24_000)


def _send(gateway: str, body: dict[str, Any], key: str) -> tuple[float, dict[str, Any]]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{gateway.rstrip('/')}/v1/messages", data=data, method="POST",
                                     headers={"content-type": "application/json", "x-api-key": key,
                                              "anthropic-version": "2023-06-01"})  # fmt: skip
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    return time.perf_counter() - started, answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", help="a running dragoman's URL (without /v1)")
    parser.add_argument("--model", default="bench-model", help="the classifier model, a name the gateway serves")
    parser.add_argument("--key", default="bench", help="the gateway's API key, if it has keys")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    body = classifier_body(args.model)
    text = prompt.SYSTEM + "".join(block["text"] for block in body["messages"][0]["content"])
    estimate = len(text) // 4  # about four characters a token for English and JSON
    print(f"classifier prompt: {len(text)} characters, ~{estimate} tokens (estimate); "
          f"Claude Code's fallback: ~{FALLBACK_TOKENS} tokens per action, {FALLBACK_TOKENS / estimate:.0f}x more")  # fmt: skip
    if not args.gateway:
        return 0
    times, inputs, parsed = [], [], 0
    for _ in range(args.runs):
        seconds, answer = _send(args.gateway, dict(body), args.key)
        times.append(seconds)
        usage = answer.get("usage") or {}
        inputs.append(usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0))
        parsed += 1 in (prompt.verdicts(prompt.answer_text(answer), 1) or {})
    print(f"through {args.gateway} to {args.model}, {args.runs} runs: median {statistics.median(times):.2f} s added per "
          f"reply with tool calls (min {min(times):.2f}, max {max(times):.2f}); {statistics.median(inputs):.0f} input "
          f"tokens per call; answers read: {parsed}/{args.runs}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
