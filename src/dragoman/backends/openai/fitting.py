"""Fitting a request's max_tokens to what the model can produce."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from dragoman.calls.types import Route
from dragoman.core.errors import context_limit, context_overflow
from dragoman.protocol import openai

log = logging.getLogger("dragoman.upstream")


class Fitted(NamedTuple):
    body: bytes
    # max_tokens was lowered to the room the prompt leaves in the context window (below
    # what was asked and below the model's output cap): a reply cut at that limit was
    # stopped by the window, `model_context_window_exceeded` rather than `max_tokens`.
    window_bound: bool


async def fitted_body(chat: openai.ChatRequest, route: Route, asked: int,
                      count: Callable[[openai.ChatRequest], Awaitable[tuple[int, str]]]) -> Fitted:  # fmt: skip
    """The upstream body, with max_tokens lowered to what the model can produce
    (visibly), or fail in Anthropic's words. `count` gives (prompt tokens, method)."""
    body = openai.ENCODER.encode(chat)
    window_bound = False
    limit = asked
    if route.caps.max_output_tokens is not None and limit > route.caps.max_output_tokens:
        limit = route.caps.max_output_tokens
    window = route.context_window
    if window is not None and limit + len(body) > window:
        # Only a prompt that might not leave room is counted (a token is at least a byte).
        prompt, method = await count(chat)
        if method != "estimate":
            if prompt > window:
                raise context_overflow(prompt, window)
            if prompt == window:
                raise context_limit(prompt, asked, window)
            if prompt + limit > window:
                limit, window_bound = window - prompt, True
    if limit == asked:
        return Fitted(body, window_bound=False)
    log.info(
        "max_tokens lowered from %d to %d to fit model %s (context %s)", asked, limit, route.upstream_model, window
    )
    if chat.max_completion_tokens is not None:
        chat.max_completion_tokens = limit
    else:
        chat.max_tokens = limit
    return Fitted(openai.ENCODER.encode(chat), window_bound)
