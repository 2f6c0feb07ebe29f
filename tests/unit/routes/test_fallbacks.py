"""Which failure goes where (`classify`), and when a model is cooled down."""

from __future__ import annotations

import pytest

from dragoman.core.error_mapping import from_stream_error, from_upstream
from dragoman.core.errors import InvalidRequest, UpstreamError, UpstreamTimeout, context_limit
from dragoman.core.redaction import NO_KEYS
from dragoman.routes.fallbacks import Cooldowns, classify
from dragoman.routes.settings import FallbackSettings


@pytest.mark.parametrize(
    ("status", "kind"),
    [(500, "fallback"), (502, "fallback"), (503, "fallback"), (529, "fallback"), (429, "fallback"),
     (401, "misconfigured"), (403, "misconfigured"), (404, "misconfigured"), (400, None), (422, None), (413, None)],
)  # fmt: skip
def test_an_upstream_status(status, kind):
    assert classify(from_upstream(status, b'{"error": {"message": "x"}}', upstream="u", redactor=NO_KEYS)) == kind


def test_prompt_too_long_in_any_words_goes_to_the_context_fallbacks():
    vllm = b'{"message": "This model\'s maximum context length is 100 tokens. However, your messages resulted in 120 tokens."}'
    assert classify(from_upstream(400, vllm, upstream="u", redactor=NO_KEYS)) == "context"
    assert classify(context_limit(90, 50, 100)) == "context"  # dragoman's own check before the call
    assert (
        classify(from_stream_error("prompt is too long: 5 tokens > 4 maximum", upstream="u", redactor=NO_KEYS))
        == "context"
    )


def test_the_gateways_own_refusals_and_in_band_statuses():
    assert classify(InvalidRequest("messages: required")) is None
    assert classify(UpstreamError("upstream u: connection refused")) == "fallback"
    assert classify(UpstreamTimeout("no first byte")) == "fallback"
    assert classify(from_stream_error("engine died", upstream="u", redactor=NO_KEYS, status=500)) == "fallback"
    assert classify(from_stream_error("bad grammar", upstream="u", redactor=NO_KEYS, status=400)) is None


def test_a_model_cools_down_after_n_failures_in_the_window_or_at_once():
    cooldowns = Cooldowns(FallbackSettings(cooldown_failures=2, cooldown_window=60, cooldown=60))
    cooldowns.failed("a")
    assert not cooldowns.cooled("a")
    cooldowns.failed("a")
    assert cooldowns.cooled("a")
    cooldowns.failed("b", at_once=True)
    assert cooldowns.cooled("b") and not cooldowns.cooled("c")
    never = Cooldowns(FallbackSettings(cooldown_failures=1, cooldown=0))
    never.failed("a")
    assert not never.cooled("a")
