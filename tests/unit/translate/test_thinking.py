"""The effort policy (`translate.thinking.plan`): Anthropic's `thinking`,
`output_config.effort` and `reasoning_effort` -> the backend's reasoning knobs.

Table-driven: each row is a request's reasoning fields, the model's caps, and the
plan (or the 400) expected."""

from __future__ import annotations

from typing import Any

import pytest

from dragoman.core.capabilities import ReasoningCaps
from dragoman.core.errors import InvalidRequest
from dragoman.translate.thinking import ReasoningPlan, plan
from tests.support.helpers import request

USER = [{"role": "user", "content": "Hello"}]
REASONING = ReasoningCaps(reasoning=True)
PLAIN = ReasoningCaps(reasoning=False)
STRICT = ReasoningCaps(reasoning=False, strict=True)


def _plan(caps: ReasoningCaps = REASONING, model: str = "qwen3-8b", **fields: Any) -> ReasoningPlan:
    return plan(request(messages=USER, **fields), caps, model=model)


def _enabled(budget: int | None = None) -> dict[str, Any]:
    return {"type": "enabled", "budget_tokens": budget} if budget is not None else {"type": "enabled"}


# -- thinking.budget_tokens -> effort ----------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "effort"),
    [
        (1024, "low"),
        (2047, "low"),
        (2048, "low"),  # "low up to 2048": inclusive
        (2049, "medium"),
        (4096, "medium"),
        (8192, "medium"),  # "medium up to 8192": inclusive
        (8193, "high"),
        (16000, "high"),
        (128000, "high"),
        (None, "medium"),  # omitted budget
    ],
)
def test_budget_maps_to_effort_with_default_thresholds(budget, effort):
    result = _plan(thinking=_enabled(budget))
    assert result == ReasoningPlan(effort=effort, surface_thinking=True)


@pytest.mark.parametrize(
    ("budget", "effort"),
    [(500, "low"), (1000, "low"), (1001, "medium"), (4000, "medium"), (4001, "high"), (None, "medium")],
)
def test_budget_thresholds_are_configurable(budget, effort):
    caps = ReasoningCaps(reasoning=True, low_max_budget=1000, medium_max_budget=4000)
    assert _plan(caps, thinking=_enabled(budget)).effort == effort


@pytest.mark.parametrize(
    "efforts",
    [("low", "high"), ("medium", "high"), ("low", "medium"), ("high",), ("minimal", "low", "medium", "high", "xhigh")],
)
@pytest.mark.parametrize("budget", [1024, 5000, 20000, None])
def test_budget_derived_effort_is_always_one_the_model_takes(efforts, budget):
    """A budget is a hint: it never turns into an effort the model would reject (and never a 400)."""
    caps = ReasoningCaps(reasoning=True, efforts=efforts)
    effort = _plan(caps, thinking=_enabled(budget)).effort
    assert effort in efforts


def test_a_large_budget_on_a_model_with_extra_levels_picks_its_highest():
    caps = ReasoningCaps(reasoning=True, efforts=("low", "medium", "high", "xhigh"))
    # `high` exists, so high is high; the budget does not invent `xhigh`.
    assert _plan(caps, thinking=_enabled(50000)).effort == "high"
    caps = ReasoningCaps(reasoning=True, efforts=("low", "medium"))
    assert _plan(caps, thinking=_enabled(50000)).effort == "medium"


# -- thinking types ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("thinking", "expected"),
    [
        ({"type": "adaptive"}, ReasoningPlan(effort=None, surface_thinking=True)),  # backend's default effort
        ({"type": "disabled"}, ReasoningPlan()),
        (None, ReasoningPlan()),
        (_enabled(1024), ReasoningPlan(effort="low", surface_thinking=True)),
    ],
    ids=["adaptive", "disabled", "absent", "enabled"],
)
def test_thinking_types_on_a_reasoning_model(thinking, expected):
    fields = {"thinking": thinking} if thinking is not None else {}
    assert _plan(**fields) == expected


@pytest.mark.parametrize(
    ("thinking", "surfaced"),
    [
        ({"type": "enabled", "budget_tokens": 4096}, True),
        ({"type": "adaptive"}, True),
        ({"type": "disabled"}, False),
        (None, False),
    ],
    ids=["enabled", "adaptive", "disabled", "absent"],
)
@pytest.mark.parametrize("effort_field", [None, "output_config", "reasoning_effort"])
def test_reasoning_is_surfaced_only_when_thinking_is_enabled_or_adaptive(thinking, surfaced, effort_field):
    fields: dict[str, Any] = {"thinking": thinking} if thinking is not None else {}
    if effort_field == "output_config":
        fields["output_config"] = {"effort": "high"}
    elif effort_field == "reasoning_effort":
        fields["reasoning_effort"] = "high"
    assert _plan(**fields).surface_thinking is surfaced


# -- thinking_off: the family's off switch -----------------------------------------------


def test_disabled_maps_to_enable_thinking_false():
    caps = ReasoningCaps(reasoning=True, thinking_off="enable_thinking")
    assert _plan(caps, thinking={"type": "disabled"}) == ReasoningPlan(
        effort=None, chat_template_kwargs={"enable_thinking": False}, surface_thinking=False
    )


@pytest.mark.parametrize(
    ("efforts", "lowest"), [(("low", "medium", "high"), "low"), (("minimal", "low", "high"), "minimal")]
)
def test_disabled_maps_to_the_lowest_effort(efforts, lowest):
    caps = ReasoningCaps(reasoning=True, efforts=efforts, thinking_off="lowest_effort")
    assert _plan(caps, thinking={"type": "disabled"}) == ReasoningPlan(effort=lowest, surface_thinking=False)


@pytest.mark.parametrize("thinking_off", ["enable_thinking", "lowest_effort"])
@pytest.mark.parametrize(
    "thinking", [None, {"type": "adaptive"}, _enabled(20000)], ids=["absent", "adaptive", "enabled"]
)
def test_the_off_switch_applies_only_to_disabled(thinking_off, thinking):
    caps = ReasoningCaps(reasoning=True, thinking_off=thinking_off)
    fields = {"thinking": thinking} if thinking is not None else {}
    result = _plan(caps, **fields)
    assert result.chat_template_kwargs is None
    expected = {None: None, "adaptive": None, "enabled": "high"}[thinking and thinking["type"]]
    assert result.effort == expected


# -- output_config.effort and reasoning_effort --------------------------------------------


@pytest.mark.parametrize(
    ("fields", "effort"),
    [
        ({"output_config": {"effort": "low"}}, "low"),
        ({"output_config": {"effort": "high"}}, "high"),
        ({"reasoning_effort": "medium"}, "medium"),
        # output_config.effort beats the budget's hint
        ({"output_config": {"effort": "low"}, "thinking": _enabled(32000)}, "low"),
        ({"output_config": {"effort": "high"}, "thinking": _enabled(1024)}, "high"),
        # an explicit reasoning_effort beats both
        ({"reasoning_effort": "high", "output_config": {"effort": "low"}}, "high"),
        ({"reasoning_effort": "low", "output_config": {"effort": "high"}, "thinking": _enabled(32000)}, "low"),
        ({"reasoning_effort": "low", "thinking": _enabled(32000)}, "low"),
        # adaptive with an effort: the effort is applied
        ({"output_config": {"effort": "high"}, "thinking": {"type": "adaptive"}}, "high"),
        # output_config without an effort (only a format) leaves the budget in charge
        (
            {
                "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
                "thinking": _enabled(1024),
            },
            "low",
        ),
    ],
)
def test_effort_precedence(fields, effort):
    assert _plan(**fields).effort == effort


@pytest.mark.parametrize(
    ("efforts", "highest"),
    [
        (("low", "medium", "high"), "high"),
        (("low", "high", "xhigh"), "xhigh"),
        (("low", "medium", "high", "max"), "max"),
        (("medium",), "medium"),
    ],
)
@pytest.mark.parametrize("field", ["output_config", "reasoning_effort"])
def test_max_means_the_models_highest_effort(efforts, highest, field):
    caps = ReasoningCaps(reasoning=True, efforts=efforts)
    fields = {"output_config": {"effort": "max"}} if field == "output_config" else {"reasoning_effort": "max"}
    assert _plan(caps, **fields).effort == highest


@pytest.mark.parametrize(
    ("efforts", "sent"),
    [
        (("low", "medium", "high"), "high"),
        (("low", "high", "xhigh"), "xhigh"),
        (("low", "medium", "high", "max"), "max"),
    ],
)
def test_xhigh_is_the_models_own_xhigh_else_its_highest(efforts, sent):
    """Claude Code offers xhigh (CLAUDE_CODE_EFFORT_LEVEL); a 400 would refuse every request."""
    assert _plan(ReasoningCaps(reasoning=True, efforts=efforts), output_config={"effort": "xhigh"}).effort == sent


@pytest.mark.parametrize(
    ("fields", "sent_field", "value"),
    [
        ({"output_config": {"effort": "extreme"}}, "output_config.effort", "extreme"),
        ({"output_config": {"effort": "minimal"}}, "output_config.effort", "minimal"),
        ({"reasoning_effort": "ultra"}, "reasoning_effort", "ultra"),
        ({"reasoning_effort": "none"}, "reasoning_effort", "none"),
        # reasoning_effort wins, so its value is the one judged (and named)
        ({"reasoning_effort": "bogus", "output_config": {"effort": "low"}}, "reasoning_effort", "bogus"),
    ],
)
def test_unsupported_effort_is_a_400_naming_the_field_and_the_allowed_values(fields, sent_field, value):
    with pytest.raises(InvalidRequest) as caught:
        _plan(thinking={"type": "adaptive"}, **fields)
    error = caught.value
    assert error.status == 400 and error.type == "invalid_request_error"
    assert error.message.startswith(sent_field + ":"), error.message
    assert repr(value) in error.message or value in error.message
    for allowed in ("low", "medium", "high", "max"):
        assert allowed in error.message, error.message


def test_unsupported_effort_lists_the_models_own_efforts():
    caps = ReasoningCaps(reasoning=True, efforts=("low", "high"))
    with pytest.raises(InvalidRequest) as caught:
        _plan(caps, output_config={"effort": "medium"})
    message = caught.value.message
    assert message.startswith("output_config.effort:") and "'medium'" in message
    allowed = message.split("one of", 1)[1]
    assert [v.strip() for v in allowed.split(",")] == ["low", "high", "xhigh", "max"]


def test_output_config_effort_is_validated_only_when_no_reasoning_effort_overrides_it():
    # output_config.effort is invalid, but reasoning_effort is explicit and wins.
    assert _plan(reasoning_effort="low", output_config={"effort": "extreme"}).effort == "low"


# -- models that do not reason ------------------------------------------------------------


CLAUDE_CODE = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}


@pytest.mark.parametrize(
    "fields",
    [
        CLAUDE_CODE,
        {"thinking": {"type": "adaptive"}},
        {"thinking": _enabled(10000)},
        {"thinking": {"type": "disabled"}},
        {"output_config": {"effort": "high"}},
        {"output_config": {"effort": "not-an-effort"}},  # not validated: nothing to validate against
        {},
    ],
)
def test_non_reasoning_model_ignores_thinking_controls_by_default(fields):
    assert _plan(PLAIN, model="llama-3.1-8b", **fields) == ReasoningPlan()


@pytest.mark.parametrize("fields", [CLAUDE_CODE, {"thinking": {"type": "adaptive"}}, {"thinking": _enabled(10000)}])
def test_strict_rejects_thinking_on_a_non_reasoning_model(fields):
    with pytest.raises(InvalidRequest) as caught:
        _plan(STRICT, model="llama-3.1-8b", **fields)
    assert caught.value.status == 400 and caught.value.type == "invalid_request_error"
    assert "Failed to process thinking request" in caught.value.message
    assert "llama-3.1-8b" in caught.value.message


@pytest.mark.parametrize("fields", [{"thinking": {"type": "disabled"}}, {}, {"output_config": {"effort": "high"}}])
def test_strict_accepts_requests_that_do_not_ask_for_thinking(fields):
    assert _plan(STRICT, model="llama-3.1-8b", **fields) == ReasoningPlan()


@pytest.mark.parametrize("caps", [PLAIN, STRICT], ids=["default", "strict"])
@pytest.mark.parametrize("effort", ["low", "high", "max"])
def test_explicit_reasoning_effort_on_a_non_reasoning_model_is_always_a_400(caps, effort):
    with pytest.raises(InvalidRequest) as caught:
        _plan(caps, model="llama-3.1-8b", reasoning_effort=effort)
    assert caught.value.status == 400
    assert caught.value.message.startswith("reasoning_effort:")
    assert "llama-3.1-8b" in caught.value.message


def test_strict_does_not_affect_reasoning_models():
    caps = ReasoningCaps(reasoning=True, strict=True)
    assert _plan(caps, **CLAUDE_CODE) == ReasoningPlan(effort="high", surface_thinking=True)
