"""Extended thinking and effort: Anthropic's controls -> the backend's reasoning knobs.

Pure. The policy, in order:
- an explicit top-level `reasoning_effort` wins, then `output_config.effort`, then
  the effort implied by `thinking.budget_tokens` (a hint, not a token cap);
- `thinking` enabled or adaptive surfaces the backend's reasoning text as thinking
  blocks; disabled or absent hides it (and can switch reasoning off where the model
  family has a switch);
- models that do not reason ignore the controls Claude Code sends on every request,
  unless strict mode asks for Anthropic-style rejection.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from dragoman.core.capabilities import ReasoningCaps
from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic


@dataclass(frozen=True, slots=True)
class ReasoningPlan:
    effort: str | None = None  # sent as reasoning_effort
    chat_template_kwargs: dict[str, Any] | None = None
    surface_thinking: bool = False
    omit_thinking_text: bool = False  # thinking.display "omitted": blocks without their text


def _budget_effort(budget: int | None, caps: ReasoningCaps) -> str:
    if budget is None:
        return "medium"
    if budget <= caps.low_max_budget:
        return "low"
    if budget <= caps.medium_max_budget:
        return "medium"
    return "high"


ABOVE_HIGH = ("xhigh", "max")  # Anthropic's levels past high: the model's own highest, if it has none of them


def _validated(effort: str, field: str, caps: ReasoningCaps) -> str:
    if effort in ABOVE_HIGH and effort not in caps.efforts and caps.efforts:
        return caps.efforts[-1]
    if effort not in caps.efforts:
        allowed = ", ".join(caps.efforts) + (", xhigh, max" if caps.efforts else "")
        raise InvalidRequest(f"{field}: {effort!r} is not an effort this model supports; use one of {allowed}")
    return effort


def plan(request: anthropic.MessagesRequest, caps: ReasoningCaps, *, model: str) -> ReasoningPlan:
    thinking = request.thinking.type if request.thinking else None
    wants_thinking = thinking in ("enabled", "adaptive")
    if not caps.reasoning:
        if request.reasoning_effort is not None:
            raise InvalidRequest(f"reasoning_effort: model {model!r} does not support reasoning")
        if wants_thinking and caps.strict:
            raise InvalidRequest(f"Failed to process thinking request: model {model!r} does not support thinking")
        return ReasoningPlan()

    effort: str | None = None
    if request.reasoning_effort is not None:
        effort = _validated(request.reasoning_effort, "reasoning_effort", caps)
    elif request.output_config is not None and request.output_config.effort is not None:
        effort = _validated(request.output_config.effort, "output_config.effort", caps)
    elif thinking == "enabled":
        effort = _budget_effort(request.thinking.budget_tokens if request.thinking else None, caps)
        if effort not in caps.efforts and caps.efforts:
            effort = caps.efforts[-1] if effort == "high" else caps.efforts[0]

    if thinking == "disabled" and caps.thinking_off == "enable_thinking":
        return ReasoningPlan(effort=None, chat_template_kwargs={"enable_thinking": False})
    if thinking == "disabled" and caps.thinking_off == "lowest_effort" and caps.efforts:
        return ReasoningPlan(effort=caps.efforts[0])
    omitted = wants_thinking and request.thinking is not None and request.thinking.display == "omitted"
    return ReasoningPlan(effort=effort, surface_thinking=wants_thinking, omit_thinking_text=omitted)


SIGNATURE = "dragoman-unsigned"  # open models cannot sign thinking; clients only echo it
CARRIED = "dragoman-b64:"  # a signature that carries the reasoning a block was sent without


def signature_for(reasoning: str, *, omitted: bool) -> str:
    """A thinking block's signature. Sent without its text (`display: "omitted"`, which Claude
    Code asks for in `-p` runs), the block carries its reasoning here instead, so that a model
    that needs its reasoning replayed gets it back when the client echoes the block."""
    if omitted and reasoning:
        return CARRIED + base64.b64encode(reasoning.encode()).decode()
    return SIGNATURE


def replayed_reasoning(thinking: str, signature: str | None) -> str:
    """The reasoning of an echoed thinking block: its text, or what its signature carries."""
    if thinking or not signature or not signature.startswith(CARRIED):
        return thinking
    try:
        return base64.b64decode(signature[len(CARRIED) :], validate=True).decode()
    except (binascii.Error, ValueError):
        return thinking
