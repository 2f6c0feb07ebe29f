"""Claude Code's own classifier requests (its "security monitor" system prompt): answered by
the configured classifier model under a schema, rendered in the tags Claude Code parses;
refused, never guessed, without one."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anthropic
import pytest

from tests.support.fakes import FakeUpstream, Reply, completion
from tests.support.safeguards import is_classifier

MONITOR = "You are a security monitor for autonomous AI coding agents.\n\n## Context\n\nRules..."
TRANSCRIPT = "<transcript>\nUser: tidy up\nBash: rm -rf ~\n</transcript>"


@pytest.fixture
def monitor_client(upstream: FakeUpstream, gateway_from: Any) -> Callable[..., anthropic.Anthropic]:
    def start(**config: Any) -> anthropic.Anthropic:
        server = gateway_from({"server": {"default_model": "test-model"},  # Claude Code asks for claude-*
                               "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}, **config})  # fmt: skip
        return anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)

    return start


def _ask(client: anthropic.Anthropic, **kw: Any) -> Any:
    return client.messages.create(model="claude-sonnet-5", max_tokens=kw.pop("max_tokens", 64),
                                  system=[{"type": "text", "text": MONITOR}],
                                  messages=[{"role": "user", "content": TRANSCRIPT}], **kw)  # fmt: skip


def _answer(**answer: Any) -> Reply:
    return Reply(body=completion(json.dumps(answer), prompt=35000, completion_tokens=12))


def test_a_block_is_rendered_in_the_tags_claude_code_parses(upstream: FakeUpstream, monitor_client: Any) -> None:
    client = monitor_client(safeguards={"model": "test-model"})
    upstream.queue(_answer(reason="Deletes the home directory.", block=True))
    reply = _ask(client, max_tokens=8192)
    assert reply.content[0].text == "<block>yes</block><reason>Deletes the home directory.</reason>"
    assert reply.stop_reason == "end_turn" and reply.model == "claude-sonnet-5"
    sent = upstream.requests[0]
    assert is_classifier(sent) and sent["model"] == "test-model" and "stop" not in sent
    assert sent["messages"][0] == {"role": "system", "content": MONITOR}  # its own rules, unchanged
    assert sent["max_tokens"] >= 1024  # room for the schema's answer, whatever Claude Code allowed


def test_the_fast_stage_is_cut_at_its_stop_sequence(upstream: FakeUpstream, monitor_client: Any) -> None:
    client = monitor_client(safeguards={"model": "test-model"})
    upstream.queue(_answer(reason="A listing.", block=False), Reply(body=completion('{"severity": 12}')))
    allowed = _ask(client, stop_sequences=["</block>"])
    assert allowed.content[0].text == "<block>no"
    assert allowed.stop_reason == "stop_sequence" and allowed.stop_sequence == "</block>"
    graded = _ask(client, stop_sequences=["</severity>"])
    assert graded.content[0].text == "<severity>12" and graded.stop_sequence == "</severity>"
    assert upstream.requests[1]["response_format"]["json_schema"]["schema"]["required"] == ["severity"]


def test_a_grading_stage_without_stop_sequences_gets_the_whole_tag(upstream: FakeUpstream, monitor_client: Any) -> None:
    """2.1.332 asks for a grade in its closing instruction, with no stop sequence, and reads
    only a reply that is exactly `<severity>N</severity>`."""
    client = monitor_client(safeguards={"model": "test-model"})
    upstream.queue(Reply(body=completion('{"severity": 71}')))
    closing = "<severity>N</severity>: N is your own grade, an integer from 0 to 100"
    graded = client.messages.create(model="claude-sonnet-5", max_tokens=64, system=MONITOR,
                                    messages=[{"role": "user", "content": [{"type": "text", "text": TRANSCRIPT},
                                                                           {"type": "text", "text": closing}]}])  # fmt: skip
    assert graded.content[0].text == "<severity>71</severity>" and graded.stop_reason == "end_turn"


def test_a_streamed_request_gets_the_same_answer_as_events(upstream: FakeUpstream, monitor_client: Any) -> None:
    client = monitor_client(safeguards={"model": "test-model"})
    upstream.queue(_answer(reason="fine", block=False))
    with client.messages.stream(model="claude-sonnet-5", max_tokens=64, system=MONITOR,
                                messages=[{"role": "user", "content": TRANSCRIPT}]) as stream:  # fmt: skip
        assert stream.get_final_message().content[0].text == "<block>no</block>"


def test_an_unreadable_answer_is_an_error_not_a_verdict(upstream: FakeUpstream, monitor_client: Any) -> None:
    client = monitor_client(safeguards={"model": "test-model"})
    upstream.queue(Reply(body=completion("I think it is probably fine")))
    with pytest.raises(anthropic.APIStatusError) as raised:
        _ask(client)
    assert raised.value.status_code == 502 and "could not be read" in raised.value.message


def test_without_a_classifier_model_it_is_refused(upstream: FakeUpstream, monitor_client: Any) -> None:
    client = monitor_client()
    with pytest.raises(anthropic.BadRequestError) as raised:
        _ask(client)
    assert "safeguards.model" in raised.value.message and not upstream.requests


def test_it_is_counted_as_a_classifier_call(upstream: FakeUpstream, monitor_client: Any,
                                            caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    client = monitor_client(safeguards={"model": "test-model"})
    upstream.queue(_answer(reason="fine", block=False))
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        _ask(client)
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"]
    assert line["endpoint"] == "classifier" and line["input_tokens"] == 35000 and line["served_model"] == "test-model"


def test_a_user_message_quoting_the_monitor_is_an_ordinary_request(upstream: FakeUpstream,
                                                                    monitor_client: Any) -> None:  # fmt: skip
    client = monitor_client(safeguards={"model": "test-model"})
    client.messages.create(model="test-model", max_tokens=64, messages=[{"role": "user", "content": MONITOR}])
    assert not is_classifier(upstream.requests[0])
