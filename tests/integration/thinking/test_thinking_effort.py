"""Extended thinking, what the upstream is asked: usage counts, the effort (and
X-Reasoning-Effort), validation errors, the off switch and the right max-tokens field."""

from __future__ import annotations

import anthropic
import pytest

from tests.support.fakes import chunk, completion, usage_chunk
from tests.support.thinking_scaffold import ANSWER, REASONING, THINK, USER, _blocks, _error, _stream, vllm_new, vllm_old

REASONING_USAGE = {
    "prompt_tokens": 20,
    "completion_tokens": 150,
    "total_tokens": 170,
    "completion_tokens_details": {"reasoning_tokens": 120},
}


def test_output_tokens_include_reasoning_tokens(gw, fake):
    client = gw()
    fake.stream_reply(
        [chunk({"role": "assistant", "content": ""}), chunk({"reasoning": REASONING}), chunk({"content": ANSWER}), chunk({}, "stop"),
         {**usage_chunk(), "usage": REASONING_USAGE}]
    )  # fmt: skip
    body = completion(ANSWER, reasoning=REASONING)
    body["usage"] = REASONING_USAGE
    fake.json_reply(body)

    events, streamed = _stream(client, model="thinker", thinking=THINK)
    plain = client.messages.create(model="thinker", max_tokens=8000, messages=USER, thinking=THINK)

    delta = next(e for e in events if e.type == "message_delta")
    assert delta.usage.output_tokens == 150
    for message in (streamed, plain):
        assert (message.usage.input_tokens, message.usage.output_tokens) == (20, 150)


def test_a_backend_without_reasoning_text_still_applies_the_effort(gw, fake):
    """OpenAI's o-series over Chat Completions: no reasoning text, only a token count."""
    client = gw("openai")
    body = completion(ANSWER)
    body["usage"] = REASONING_USAGE
    fake.json_reply(body)

    raw = client.messages.with_raw_response.create(
        model="thinker", max_tokens=20000, messages=USER, thinking={"type": "enabled", "budget_tokens": 16000}
    )
    message = raw.parse()
    assert raw.headers.get("x-reasoning-effort") == "high"
    assert fake.requests[-1]["reasoning_effort"] == "high"
    assert _blocks(message) == [{"type": "text", "text": ANSWER}]
    assert message.usage.output_tokens == 150


@pytest.mark.parametrize(
    ("fields", "effort"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2049}}, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8192}}, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8193}}, "high"),
        ({"thinking": {"type": "enabled"}}, "medium"),  # no budget: medium, as the specifications have it
        ({"thinking": {"type": "adaptive"}}, None),  # the model's default
        ({"thinking": {"type": "disabled"}}, None),
        ({}, None),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, "high"),  # what Claude Code sends
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "high"),
        ({"thinking": {"type": "enabled", "budget_tokens": 16000}, "output_config": {"effort": "low"}}, "low"),
        ({"output_config": {"effort": "high"}, "extra_body": {"reasoning_effort": "low"}}, "low"),
        ({"extra_body": {"reasoning_effort": "medium"}}, "medium"),
    ],
)
def test_effort_goes_upstream_and_comes_back_in_a_header(gw, fake, fields, effort):
    client = gw()
    fake.json_reply(completion(ANSWER))
    raw = client.messages.with_raw_response.create(model="thinker", max_tokens=20000, messages=USER, **fields)
    raw.parse()
    sent = fake.requests[-1]
    assert sent.get("reasoning_effort") == effort
    assert raw.headers.get("x-reasoning-effort") == effort


def test_effort_header_on_a_stream(gw, fake):
    client = gw()
    fake.stream_reply(vllm_new())
    raw = client.messages.with_raw_response.create(
        model="thinker",
        max_tokens=8000,
        messages=USER,
        stream=True,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert raw.headers.get("x-reasoning-effort") == "low"
    events = list(raw.parse())
    assert events[-1].type == "message_stop"
    assert fake.requests[-1]["reasoning_effort"] == "low"


def test_enabled_thinking_without_a_budget_streams_and_counts(gw, fake):
    """`{"type": "enabled"}` alone is no 400 on a stream or a count either."""
    client = gw()
    fake.stream_reply(vllm_new())
    with client.messages.stream(model="thinker", max_tokens=500, messages=USER, thinking={"type": "enabled"}) as stream:  # type: ignore[typeddict-item]
        message = stream.get_final_message()
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert fake.requests[-1]["reasoning_effort"] == "medium"
    counted = client.messages.count_tokens(model="thinker", messages=USER, thinking={"type": "enabled"})  # type: ignore[typeddict-item]
    assert counted.input_tokens > 0


def test_budget_thresholds_from_the_server_config(gw, fake):
    client = gw(effort_budgets=[2000, 4000])
    for budget, effort in (
        (1024, "low"),
        (2000, "low"),
        (2001, "medium"),
        (4000, "medium"),
        (4001, "high"),
        (8000, "high"),
    ):
        fake.json_reply(completion(ANSWER))
        client.messages.create(
            model="thinker", max_tokens=16000, messages=USER, thinking={"type": "enabled", "budget_tokens": budget}
        )
        assert fake.requests[-1]["reasoning_effort"] == effort


def test_max_means_the_models_highest_configured_effort(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER))
    raw = client.messages.with_raw_response.create(
        model="thinker-xhigh", max_tokens=8000, messages=USER, output_config={"effort": "max"}
    )
    assert raw.headers.get("x-reasoning-effort") == "xhigh"
    assert fake.requests[-1]["reasoning_effort"] == "xhigh"


@pytest.mark.parametrize("stream", [False, True])
def test_unsupported_effort_is_a_400_naming_output_config_effort(gw, fake, stream):
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            _stream(client, model="thinker-lowhigh", output_config={"effort": "medium"})
        else:
            client.messages.create(
                model="thinker-lowhigh", max_tokens=8000, messages=USER, output_config={"effort": "medium"}
            )
    assert caught.value.status_code == 400
    message = _error(caught)
    assert "output_config.effort" in message and "'medium'" in message
    assert "low, high, xhigh, max" in message
    assert fake.requests == []


def test_unsupported_reasoning_effort_is_a_400_naming_reasoning_effort(gw, fake):
    client = gw()
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="thinker",
            max_tokens=8000,
            messages=USER,
            output_config={"effort": "low"},
            extra_body={"reasoning_effort": "ultra"},
        )
    message = _error(caught)
    assert message.startswith("reasoning_effort:") and "'ultra'" in message
    assert "low, medium, high, xhigh, max" in message
    assert fake.requests == []


def test_claude_codes_controls_are_ignored_on_a_model_that_does_not_reason(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER, reasoning_content=REASONING))
    fake.stream_reply(vllm_old())
    cc = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}

    raw = client.messages.with_raw_response.create(model="plain", max_tokens=8000, messages=USER, **cc)
    plain = raw.parse()
    _, streamed = _stream(client, model="plain", **cc)

    assert "x-reasoning-effort" not in raw.headers
    for body in fake.requests:
        assert "reasoning_effort" not in body and "chat_template_kwargs" not in body
        assert body["model"] == "llama-3.1-8b"
    assert _blocks(plain) == _blocks(streamed) == [{"type": "text", "text": ANSWER}]


@pytest.mark.parametrize(
    ("server", "model"),
    [({"strict_thinking": True}, "plain"), ({}, "plain-strict")],
    ids=["server-strict", "model-strict"],
)
@pytest.mark.parametrize("thinking", [{"type": "adaptive"}, THINK], ids=["adaptive", "enabled"])
@pytest.mark.parametrize("stream", [False, True])
def test_strict_thinking_rejects_thinking_on_a_model_that_does_not_reason(gw, fake, server, model, thinking, stream):
    client = gw(**server)
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            _stream(client, model=model, thinking=thinking)
        else:
            client.messages.create(model=model, max_tokens=8000, messages=USER, thinking=thinking)
    message = _error(caught)
    assert "Failed to process thinking request" in message and repr(model) in message
    assert fake.requests == []
    # Without thinking (or with it disabled) the same model still answers.
    fake.json_reply(completion(ANSWER))
    fake.json_reply(completion(ANSWER))
    assert (
        client.messages.create(model=model, max_tokens=100, messages=USER, thinking={"type": "disabled"})
        .content[0]
        .text
        == ANSWER
    )
    assert (
        client.messages.create(model=model, max_tokens=100, messages=USER, output_config={"effort": "high"})
        .content[0]
        .text
        == ANSWER
    )
    assert len(fake.requests) == 2


def test_model_level_strict_false_overrides_a_strict_server(gw, fake):
    client = gw(strict_thinking=True)
    fake.json_reply(completion(ANSWER))
    message = client.messages.create(
        model="plain-lenient", max_tokens=100, messages=USER, thinking={"type": "adaptive"}
    )
    assert message.content[0].text == ANSWER


@pytest.mark.parametrize("strict", [False, True])
def test_explicit_reasoning_effort_on_a_model_that_does_not_reason_is_a_400(gw, fake, strict):
    client = gw(strict_thinking=strict)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="plain", max_tokens=100, messages=USER, extra_body={"reasoning_effort": "high"})
    message = _error(caught)
    assert message.startswith("reasoning_effort:") and "plain" in message
    assert fake.requests == []


def test_disabled_thinking_sends_enable_thinking_false(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER))
    fake.json_reply(completion(ANSWER))
    fake.json_reply(completion(ANSWER))

    raw = client.messages.with_raw_response.create(
        model="thinker-switch", max_tokens=100, messages=USER, thinking={"type": "disabled"}
    )
    raw.parse()
    assert fake.requests[-1]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "reasoning_effort" not in fake.requests[-1]
    assert "x-reasoning-effort" not in raw.headers

    # Absent or adaptive thinking does not flip the switch.
    client.messages.create(model="thinker-switch", max_tokens=100, messages=USER)
    client.messages.create(model="thinker-switch", max_tokens=100, messages=USER, thinking={"type": "adaptive"})
    for body in fake.requests[1:]:
        assert "chat_template_kwargs" not in body


def test_disabled_thinking_as_lowest_effort(gw, fake):
    client = gw()
    fake.json_reply(completion(ANSWER, reasoning="hidden"))
    raw = client.messages.with_raw_response.create(
        model="thinker-lowest", max_tokens=100, messages=USER, thinking={"type": "disabled"}
    )
    message = raw.parse()
    assert fake.requests[-1]["reasoning_effort"] == "minimal"
    assert "chat_template_kwargs" not in fake.requests[-1]
    assert raw.headers.get("x-reasoning-effort") == "minimal"
    assert _blocks(message) == [{"type": "text", "text": ANSWER}]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_reasoning_model_gets_max_completion_tokens(gw, fake, stream):
    client = gw("openai")
    for _ in range(2):
        if stream:
            fake.stream_reply(vllm_new())
        else:
            fake.json_reply(completion(ANSWER))
    for model in ("thinker", "plain"):
        if stream:
            _stream(client, model=model, max_tokens=777)
        else:
            client.messages.create(model=model, max_tokens=777, messages=USER)
    thinker, plain = fake.requests
    assert thinker["max_completion_tokens"] == 777 and "max_tokens" not in thinker
    assert plain["max_tokens"] == 777 and "max_completion_tokens" not in plain


def test_openai_reasoning_model_output_cap_lowers_max_completion_tokens(gw, fake):
    client = gw("openai")
    fake.json_reply(completion(ANSWER))
    raw = client.messages.with_raw_response.create(
        model="thinker-capped", max_tokens=8000, messages=USER, thinking=THINK
    )
    raw.parse()
    sent = fake.requests[-1]
    assert sent["max_completion_tokens"] == 500 and "max_tokens" not in sent
    assert raw.headers.get("x-max-tokens-applied") == "500"
    assert raw.headers.get("x-reasoning-effort") == "medium"


@pytest.mark.parametrize("flavor", ["vllm", "sglang", "llamacpp", "ollama", "generic"])
def test_other_flavors_keep_max_tokens_for_reasoning_models(gw, fake, flavor):
    client = gw(flavor)
    fake.json_reply(completion(ANSWER))
    client.messages.create(model="thinker", max_tokens=5321, messages=USER, thinking=THINK)
    assert fake.requests[-1]["max_tokens"] == 5321 and "max_completion_tokens" not in fake.requests[-1]
