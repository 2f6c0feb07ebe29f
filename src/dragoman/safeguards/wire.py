"""The wire side of `safeguards`: what a request asks, what the upstream must not see, and
the `safeguard_results` a reply carries (shapes: /work/shared/reference/safeguards.md §1-2,
as Anthropic's API answers and LiteLLM and Claude Code read them)."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from dragoman.calls.types import Call
from dragoman.core.errors import InvalidRequest
from dragoman.protocol import anthropic

KIND = "dangerous_tool_use"  # the one safeguard Claude Code asks for
BETA_PREFIX = "dangerous-tool-use-"  # its beta, `dangerous-tool-use-2026-09-03`: sent and stripped with the field
MARK_BYTES = b'"safeguards"'  # in every body that asks for verdicts (`Safeguards.concerns`)

Verdict = dict[str, Any]  # one tool call's: {"type": "evaluated", "outcome": ...} or {"type": "unavailable", ...}


class Safeguard(msgspec.Struct, frozen=True):
    type: str
    classifier_context: dict[str, Any] | None = None


class _Asked(msgspec.Struct):
    safeguards: list[Safeguard] | None = None


_ASKED = msgspec.json.Decoder(_Asked)


def asked(call: Call) -> list[Safeguard] | None:
    """The request's `safeguards`, or None without any (the common request costs a byte search)."""
    if MARK_BYTES not in call.body:
        return None
    try:
        return _ASKED.decode(call.body).safeguards
    except msgspec.ValidationError as error:
        raise InvalidRequest(f"safeguards: {error}".replace(" - at `$.safeguards", " (at `safeguards")) from None
    except msgspec.DecodeError:
        return None  # not JSON: the core said so before; nothing asked


def context_of(safeguards: list[Safeguard]) -> dict[str, Any]:
    """The `classifier_context` of the dangerous_tool_use entry ({} without one)."""
    return next((s.classifier_context or {} for s in safeguards if s.type == KIND), {})


def stripped(call: Call, *, body: bool) -> Call:
    """`call` without the field (in `body` only when it is sent on as bytes: a translator reads
    the fields it knows) and without its beta: an upstream given one alone answers 400."""
    headers = {k: v for k, v in call.headers.items() if k.lower() != "anthropic-beta"}
    kept = sorted(name for name in anthropic.betas(call.headers) if not name.startswith(BETA_PREFIX))
    if kept:
        headers["anthropic-beta"] = ",".join(kept)
    new_body = call.body
    if body:
        data = msgspec.json.decode(call.body)
        data.pop("safeguards", None)
        new_body = msgspec.json.encode(data)
    return dataclasses.replace(call, headers=headers, body=new_body)


def evaluated(flagged: bool, explanation: str = "") -> Verdict:
    if not flagged:
        return {"type": "evaluated", "outcome": "not_flagged"}
    return {"type": "evaluated", "outcome": "flagged", "explanation": explanation or "flagged by the classifier"}


def unavailable(reason: str) -> Verdict:
    """No verdict: Claude Code checks that one action itself. Reasons as seen on the wire:
    timeout, error, truncated, refused, input_too_long."""
    return {"type": "unavailable", "reason": reason}


def results(verdicts: dict[str, Verdict]) -> list[dict[str, Any]]:
    """`safeguard_results` for the reply: each verdict keyed by its tool_use's exact id."""
    return [{"type": KIND, "status": {"type": "available", "tool_uses": verdicts}}]


UNSUPPORTED: list[dict[str, Any]] = [{"type": KIND, "status": {"type": "unsupported"}}]


def with_results(body: bytes, found: list[dict[str, Any]]) -> bytes:
    """A whole message's JSON with `safeguard_results` at its top level."""
    message = msgspec.json.decode(body)
    message["safeguard_results"] = found
    return msgspec.json.encode(message)


def tool_uses(message: dict[str, Any]) -> tuple[list[dict[str, Any]], set[str]]:
    """The message's tool_use blocks, and the ids of those cut short by `max_tokens`
    (their input is not whole: judged by nobody, `unavailable: truncated`)."""
    blocks = [b for b in message.get("content") or [] if isinstance(b, dict) and b.get("type") == "tool_use"]
    blocks = [b for b in blocks if isinstance(b.get("id"), str)]
    content = message.get("content") or []
    truncated: set[str] = set()
    if message.get("stop_reason") == "max_tokens" and content and content[-1] in blocks:
        truncated.add(content[-1]["id"])
    return blocks, truncated
