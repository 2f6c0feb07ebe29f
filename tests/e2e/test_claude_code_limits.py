"""The real Claude Code CLI meets [limits]: a 429 rate_limit_error with retry-after is
retried as Anthropic's, and the task still gets done."""

from __future__ import annotations

import httpx
import pytest

from dragoman.core.config_load import from_dict
from tests.e2e.test_claude_code import FILE_CONTENT, FILE_NAME, QUIET, Harness, harness  # noqa: F401 (fixture)

pytestmark = pytest.mark.claude_code

RPM = 4  # one request every 15 s once the bucket is spent: the CLI meets the limit, whatever its start-up takes


def test_claude_code_retries_a_429_by_its_retry_after(harness: Harness) -> None:  # noqa: F811 (the fixture)
    config = from_dict({"limits": {"requests_per_minute": RPM},
                        "models": [{"name": "test-model", "upstream": "default", "reasoning": True, "aliases": ["claude-*"]}],
                        "upstreams": {"default": {"url": harness.upstream.url, "max_retries": 0}}})  # fmt: skip
    harness.start_gateway(config)
    assert harness.gateway is not None
    with httpx.Client(base_url=harness.gateway.url, timeout=10) as drain:  # spend the bucket first
        count = {"model": "test-model", "messages": [{"role": "user", "content": "x"}]}
        while drain.post("/v1/messages/count_tokens", json=count).status_code != 429:
            pass
    before = len(harness.gateway.cli_exchanges())
    run = harness.run(QUIET)
    why = run.explain()
    exchanges = run.exchanges[before:]
    refused = [e for e in exchanges if e.status == 429]
    assert refused, why  # the CLI met the limit ...
    assert all(b"rate_limit_error" in e.response for e in refused), why
    assert run.process.returncode == 0 and run.result.get("is_error") is False, why  # ... and retried past it
    assert (harness.workdir / FILE_NAME).read_text() == FILE_CONTENT, why
    assert len(harness.upstream.requests) >= 2  # the refused ones never reached it
    assert not [
        e for e in run.exchanges if e.status is not None and e.status >= 400 and e.status != 429 and not e.prewarm
    ], why
