"""Claude Code's own classifier requests ("You are a security monitor for autonomous AI
coding agents."), which it sends when the server gave no verdict for an action, or always
with CLAUDE_CODE_AUTO_MODE_SERVER=0. An open model rarely answers them in the tags Claude
Code parses, and each unreadable answer is retried (ten requests of ~36k tokens for one
action). Here the configured classifier model answers under a JSON schema, rendered back
in the exact format: `<block>no</block>`, `<block>yes</block><reason>...</reason>`, or the
fast stage's `<severity>N</severity>`, cut at the request's stop sequence as Anthropic's
API cuts it. Without a classifier model: an error, never a guess (a canned "no" would let
everything through).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from dragoman.calls.types import Call, Completed, Reply, Streaming
from dragoman.core import ids
from dragoman.core.errors import InvalidRequest, UpstreamError, UpstreamTimeout
from dragoman.protocol import anthropic
from dragoman.protocol.sse import encode_all
from dragoman.safeguards import judge, prompt
from dragoman.translate.fold import events_of

MARK = "You are a security monitor for autonomous AI coding agents"
MARK_BYTES = MARK.encode()  # in every classifier request's body (`Safeguards.concerns`)
SEVERITY_STOP = "</severity>"
SEVERITY_ASKED = (
    "<severity>N</severity>"  # the fast stage's closing instruction when it grades (2.1.332: no stop sequence)
)
ANSWER_TOKENS = 1024

_BLOCK_SCHEMA = {
    "type": "object",
    "properties": {"reason": {"type": "string"}, "block": {"type": "boolean"}},
    "required": ["reason", "block"],
    "additionalProperties": False,
}
_SEVERITY_SCHEMA = {
    "type": "object",
    "properties": {"severity": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["severity"],
    "additionalProperties": False,
}
_BLOCK_ASK = ("Give your decision as a JSON object: reason (one short sentence) and block (true if the action must be "
              "blocked, false if it may run).")  # fmt: skip
_SEVERITY_ASK = "Give your grade as a JSON object: severity, a whole number from 0 to 100."


class _System(msgspec.Struct):
    system: str | list[dict[str, Any]] | None = None


_SYSTEM = msgspec.json.Decoder(_System)


def is_monitor(call: Call) -> bool:
    """Whether `call` is Claude Code's classifier request: its system prompt is the monitor's."""
    if MARK_BYTES not in call.body:
        return False
    try:
        system = _SYSTEM.decode(call.body).system
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    if isinstance(system, str):
        return MARK in system
    return any(isinstance(b.get("text"), str) and MARK in b["text"] for b in system or [])


async def serve(classifier: judge.Classifier, call: Call) -> Reply:
    """The classifier model's answer to Claude Code's classifier request, in its tags."""
    if classifier.config.model is None:
        raise InvalidRequest(
            "this is Claude Code's auto-mode classifier request, and the gateway has no classifier model "
            "(safeguards.model): it is not answered rather than guessed; see docs/claude-code.md#auto-mode"
        )
    request = msgspec.json.decode(call.body)
    stops = [s for s in request.get("stop_sequences") or [] if isinstance(s, str)]
    severity = SEVERITY_STOP in stops or SEVERITY_ASKED in _closing(request)
    body = _asked(request, severity)
    if call.outcome is not None:
        call.outcome.endpoint = judge.ENDPOINT  # counted as the classifier call it is
    try:
        answer = await judge.ask(classifier, call, body, outcome=call.outcome)
    except TimeoutError:
        raise UpstreamTimeout(f"the classifier model gave no answer within {classifier.config.timeout:g} s") from None
    text = _rendered(prompt.answer_text(answer), severity)
    if text is None:
        raise UpstreamError("the classifier model's answer could not be read as a decision")
    stop = next((s for s in stops if s in text), None)
    if stop is not None:
        text = text[: text.index(stop)]
    said = answer.get("usage")
    said = said if isinstance(said, dict) else {}
    usage = {key: said[key] for key in ("input_tokens", "output_tokens", "cache_read_input_tokens")
             if isinstance(said.get(key), int)}  # fmt: skip
    message = anthropic.Message(
        id=ids.message_id(), model=call.model, content=[anthropic.OutTextBlock(text=text)],
        stop_reason="stop_sequence" if stop else "end_turn", stop_sequence=stop,
        usage=msgspec.convert({"input_tokens": 0, "output_tokens": 0, **usage}, anthropic.Usage),
    )  # fmt: skip
    if call.stream:
        return Streaming(_once(encode_all(events_of(message))))
    return Completed(msgspec.json.encode(message))


def _closing(request: dict[str, Any]) -> str:
    """The text of the request's last message: the stage's closing instruction."""
    messages = request.get("messages") or []
    content = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def _asked(request: dict[str, Any], severity: bool) -> dict[str, Any]:
    """Claude Code's request as the classifier model gets it: its system prompt and transcript,
    no stop sequences or thinking, the answer held to a schema."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    while messages and messages[-1].get("role") == "assistant":  # a prefilled "<block>": the schema says it now
        messages.pop()
    ask = {"type": "text", "text": _SEVERITY_ASK if severity else _BLOCK_ASK}
    if messages and messages[-1].get("role") == "user":
        content = messages[-1].get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        messages[-1] = {**messages[-1], "content": [*blocks, ask]}
    else:
        messages.append({"role": "user", "content": [ask]})
    body: dict[str, Any] = {"max_tokens": ANSWER_TOKENS, "temperature": 0, "messages": messages,
                            "output_config": {"format": {"type": "json_schema",
                                                         "schema": _SEVERITY_SCHEMA if severity else _BLOCK_SCHEMA}}}  # fmt: skip
    if request.get("system") is not None:
        body["system"] = request["system"]
    return body


def _rendered(text: str, severity: bool) -> str | None:
    start, end = text.find("{"), text.rfind("}")
    try:
        answer = json.loads(text[start : end + 1]) if 0 <= start < end else None
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    if severity:
        grade = answer.get("severity")
        if not isinstance(grade, int) or isinstance(grade, bool):
            return None
        return f"<severity>{max(0, min(100, grade))}</severity>"
    block = answer.get("block")
    if not isinstance(block, bool):
        return None
    if not block:
        return "<block>no</block>"
    reason = answer.get("reason")
    reason = reason.strip() if isinstance(reason, str) else ""
    return f"<block>yes</block><reason>{reason or 'flagged by the classifier'}</reason>"


async def _once(data: bytes) -> Any:
    yield data
