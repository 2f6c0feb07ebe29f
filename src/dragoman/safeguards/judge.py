"""One classifier call: a Messages request to the configured model through its route's
backend, counted as the caller's (a usage record and metrics of endpoint "classifier").
Whatever goes wrong, the calls get `unavailable` verdicts, never an invented `not_flagged`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dragoman.calls.types import Call, Completed, Outcome, Route, Slots
from dragoman.core import ids
from dragoman.core.config import SafeguardsConfig
from dragoman.core.error_mapping import anthropic_envelope
from dragoman.core.errors import GatewayError
from dragoman.safeguards import prompt, wire

log = logging.getLogger("dragoman.safeguards")

ENDPOINT = "classifier"  # how classifier calls are marked in metrics, the access log and usage records


@dataclass(frozen=True, slots=True)
class Classifier:
    """What a classifier call needs of the gateway: its settings, routing, the recorder, and
    each upstream's slots (`max_concurrent`), which a call to another upstream takes."""

    config: SafeguardsConfig
    route: Callable[[str], Awaitable[Route]]
    record: Callable[[Outcome], None]
    slots: Mapping[str, Slots] = field(default_factory=dict)


async def ask(
    classifier: Classifier, call: Call, body: dict[str, Any], *, outcome: Outcome | None = None
) -> dict[str, Any]:
    """The classifier model's message for `body` (a Messages request), within the timeout.
    Recorded under the caller's key as a call of its own, unless `outcome` is given (the
    request itself is the classifier call: its entry point records it). Raises TimeoutError
    or GatewayError."""
    model = classifier.config.model
    assert model is not None
    own = outcome is None
    if outcome is None:
        caller = call.outcome
        outcome = Outcome(request_id=ids.request_id(), endpoint=ENDPOINT, model=model,
                          key_id=caller.key_id if caller else None, tenant=caller.tenant if caller else None)  # fmt: skip
    try:
        async with asyncio.timeout(classifier.config.timeout):
            route = await classifier.route(model)
            outcome.routed(route)
            body["model"] = model
            inner = Call(body=msgspec.json.encode(body), model=model, upstream_model=route.upstream_model, headers={},
                         request_id=outcome.request_id, outcome=outcome, conversation=call.conversation)  # fmt: skip
            # A classifier on another upstream takes one of its slots; on the request's own, the
            # request's slot covers it (its upstream call is over; queueing there would wait on itself).
            parent = call.outcome.upstream if call.outcome is not None else ""
            slots = None if route.upstream == parent else classifier.slots.get(route.upstream)
            reply = await _sent(slots, inner, route)
            outcome.status = reply.status
            if not isinstance(reply, Completed):
                raise GatewayError(f"the classifier model {model!r} answered with a stream")
            if reply.status != 200:
                raise _Refused(reply.status, reply.body)
            message = msgspec.json.decode(reply.body)
    except TimeoutError:
        outcome.status, outcome.error_type = 504, "timeout_error"
        raise
    except GatewayError as error:
        outcome.status = outcome.status if outcome.status >= 400 else error.status
        outcome.error_type = outcome.error_type or error.type
        raise
    finally:
        if own:
            classifier.record(outcome)
    if not isinstance(message, dict):
        raise GatewayError(f"the classifier model {model!r} answered no message")
    return message


async def _sent(slots: Slots | None, call: Call, route: Route) -> Any:
    """The backend's reply, within the upstream's `max_concurrent` (a full queue: 529, raised)."""
    if slots is None:
        return await route.backend.messages(call, route)
    await slots.acquire(queue=True)
    try:
        return await route.backend.messages(call, route)  # a whole reply: read before the slot goes back
    finally:
        slots.release()


class _Refused(GatewayError):
    """The classifier's upstream answered an error (passthrough: relayed, not raised)."""

    def __init__(self, status: int, body: bytes) -> None:
        envelope = anthropic_envelope(body)
        super().__init__(f"answered {status}: {envelope.error.message if envelope is not None else 'no error body'}")
        self.answered = status


def failure(error: BaseException) -> str:
    """The `unavailable` reason for a classifier call that failed."""
    if isinstance(error, TimeoutError):
        return "timeout"
    status = error.answered if isinstance(error, _Refused) else getattr(error, "status", 500)
    if isinstance(error, GatewayError) and status in (400, 413) and _too_long(error.message):
        return "input_too_long"
    return "error"


def _too_long(message: str) -> bool:
    lowered = message.lower()
    return any(words in lowered for words in ("context", "too long", "too large", "too many tokens"))


async def judge(classifier: Classifier, call: Call, context: dict[str, Any], messages: list[Any],
                message: dict[str, Any]) -> tuple[dict[str, wire.Verdict], list[str]]:  # fmt: skip
    """A verdict for each tool_use block of the reply `message`, by its exact id (one call for
    them all), and their log entries (`name=outcome`: never the input)."""
    blocks, truncated = wire.tool_uses(message)
    judged = [b for b in blocks if b["id"] not in truncated]
    verdicts: dict[str, wire.Verdict] = {b["id"]: wire.unavailable("truncated") for b in blocks if b["id"] in truncated}
    if judged:
        verdicts |= await _verdicts(classifier, call, context, messages, judged)
    entries = [f"{b.get('name')}={_said(verdicts[b['id']])}" for b in blocks]
    return {b["id"]: verdicts[b["id"]] for b in blocks}, entries


async def _verdicts(classifier: Classifier, call: Call, context: dict[str, Any], messages: list[Any],
                    calls: list[dict[str, Any]]) -> dict[str, wire.Verdict]:  # fmt: skip
    body = prompt.request(classifier.config.model or "", context, messages, calls, classifier.config.transcript_chars)
    try:
        answer = await ask(classifier, call, body)
    except (TimeoutError, GatewayError) as error:
        reason = failure(error)
        log.warning("classifier call for request %s failed (%s): %s", call.request_id, reason,
                    getattr(error, "message", None) or type(error).__name__)  # fmt: skip
        return {c["id"]: wire.unavailable(reason) for c in calls}
    if answer.get("stop_reason") == "refusal":
        return {c["id"]: wire.unavailable("refused") for c in calls}
    found = prompt.verdicts(prompt.answer_text(answer), len(calls)) or {}
    if len(found) < len(calls):
        log.warning("classifier answer for request %s gave %d of %d verdicts", call.request_id, len(found), len(calls))
    return {
        c["id"]: wire.evaluated(*found[n]) if n in found else wire.unavailable("error") for n, c in enumerate(calls, 1)
    }


def _said(verdict: wire.Verdict) -> str:
    return verdict.get("outcome") or f"unavailable:{verdict.get('reason')}"
