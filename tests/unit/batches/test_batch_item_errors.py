"""A batch request's errors name the field where the batch request holds it: what the
gateway finds wrong with the params of request 3 is `requests.3.params.<field>: ...`,
whichever check found it (decoding, the batch's own rules, the thinking and tool checks
of the translation, files); an upstream's own answer is left as it said it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dragoman.assembly.gateway import Gateway
from dragoman.batches.runs import Runner
from dragoman.batches.store import Record
from dragoman.core.config_load import from_dict
from dragoman.core.errors import UpstreamError
from dragoman.core.validation import within
from dragoman.protocol.batches import BatchRequest

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
BUDGET_NOT_BELOW_MAX_TOKENS = "`max_tokens` must be greater than `thinking.budget_tokens`."


def params(**over: Any) -> dict[str, Any]:
    return {"model": "test-model", "max_tokens": 2000, "messages": [{"role": "user", "content": "hi"}], **over}


@pytest.mark.parametrize(
    ("message", "named"),
    [
        ("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
         "requests.3.params.thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
        ("messages.0.content.1.source.file_id: no file", "requests.3.params.messages.0.content.1.source.file_id: no file"),
        ("[...].0: Expected `int`, got `str`", "requests.3.params.[...].0: Expected `int`, got `str`"),
        ("model: 'x' is not served here", "requests.3.params.model: 'x' is not served here"),
        # Anthropic's words name no field in some checks: the params as a whole.
        (BUDGET_NOT_BELOW_MAX_TOKENS, f"requests.3.params: {BUDGET_NOT_BELOW_MAX_TOKENS}"),
        ("Thinking may not be enabled when tool_choice forces tool use.",
         "requests.3.params: Thinking may not be enabled when tool_choice forces tool use."),
        ("Expected `object`, got `int`", "requests.3.params: Expected `object`, got `int`"),
        ("document URL 'ftp://x': only http and https URLs are fetched",
         "requests.3.params: document URL 'ftp://x': only http and https URLs are fetched"),
    ],
)  # fmt: skip
def test_within_names_the_field_from_the_whole_request(message: str, named: str) -> None:
    assert within("requests.3.params", message) == named


ITEMS: list[tuple[Any, str]] = [
    (5, "requests.0.params: Expected `object`, got `int`"),
    ({"model": "test-model", "messages": []}, "requests.1.params.max_tokens: Field required"),
    (params(max_tokens="many"), "requests.2.params.max_tokens: Expected `int`, got `str`"),
    (params(messages=[{"role": "user", "content": [{"type": "text"}]}]), "requests.3.params.messages.0.content.0.text: Field required"),
    (params(stream=True), "requests.4.params.stream: streaming is not available in a batch"),
    (params(thread={"type": "create"}), "requests.5.params.thread: message threads are not available in a batch"),
    (params(thinking={"type": "enabled", "budget_tokens": 100}),
     "requests.6.params.thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"),
    (params(top_k=-1), "requests.7.params.top_k: must be greater than or equal to 0"),
    (params(thinking={"type": "enabled", "budget_tokens": 4000}), f"requests.8.params: {BUDGET_NOT_BELOW_MAX_TOKENS}"),
    (params(tools=[TOOL], tool_choice={"type": "any"}, thinking={"type": "enabled", "budget_tokens": 1024}),
     "requests.9.params: Thinking may not be enabled when tool_choice forces tool use."),
    (params(tools=[TOOL, TOOL]), "requests.10.params.tools.1.name: 'get_weather' is the name of an earlier tool"),
    (params(tool_choice={"type": "any"}), "requests.11.params.tool_choice: type 'any' needs tools"),
    (params(tools=[TOOL], tool_choice={"type": "tool", "name": "other"}), "requests.12.params.tool_choice.name: no tool named 'other'"),
    (params(messages=[]), "requests.13.params.messages: at least one message is required"),
    (params(temperature=3), "requests.14.params.temperature: must be between 0 and 1"),
    (params(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": 7}}]}]),
     "requests.15.params.messages.0.content.0.source.file_id: Expected `str`, got `int`"),
    (params(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "file_nope"}}]}]),
     "requests.16.params.messages.0.content.0.source.file_id: no file 'file_nope'"),
]  # fmt: skip
NOT_INVALID = {16: "not_found_error"}  # the others are invalid_request_error


@pytest.fixture
def runner(tmp_path: Path) -> Any:
    """`run(batch_params)`: each params run as a request of one batch, in order; the error
    messages (None for a success). The upstream is never reached: nothing listens there."""
    config = from_dict({
        "server": {"registry_cache": ""},
        "batches": {"dir": str(tmp_path / "batches")},
        "files": {"dir": str(tmp_path / "files")},
        "upstreams": {"default": {"url": "http://127.0.0.1:9/v1", "max_retries": 0}},
        "models": [{"name": "test-model", "upstream": "default", "upstream_model": "m"}],
    })  # fmt: skip

    def run(items: list[Any]) -> list[tuple[str, str]]:
        async def main() -> list[tuple[str, str]]:
            gateway = Gateway(config)
            runner = Runner(gateway.pipeline, gateway.metrics, config.batches, lambda *_: None, lambda: None)
            record = Record(
                id="msgbatch_01t", owner="", created=time.time(), expires=time.time() + 60, total=len(items), headers={}
            )
            try:
                errors = []
                for index, item in enumerate(items):
                    request = BatchRequest(custom_id=f"r{index}", params=msgspec.Raw(json.dumps(item).encode()))
                    succeeded, payload = await runner._message(record, index, request)
                    assert not succeeded
                    error = json.loads(payload)["error"]
                    errors.append((error["type"], error["message"]))
                return errors
            finally:
                await gateway.close()

        return asyncio.run(main())

    return run


def test_every_check_names_the_field_where_the_batch_request_holds_it(runner: Any) -> None:
    errors = runner([item for item, _ in ITEMS])
    wrong = [
        (kind, message, expected)
        for index, ((kind, message), (_, expected)) in enumerate(zip(errors, ITEMS, strict=True))
        if kind != NOT_INVALID.get(index, "invalid_request_error") or not message.startswith(expected)
    ]
    assert wrong == []


def test_an_upstreams_failure_is_not_taken_for_the_params(runner: Any) -> None:
    """Nothing listens at the upstream: its failure says so, with no params path in front."""
    [(kind, message)] = runner([params()])
    assert kind == UpstreamError.type and not message.startswith("requests."), message
