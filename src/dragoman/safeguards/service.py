"""`Safeguards.send`: one Messages request, with Claude Code's `safeguards` answered.

    request with safeguards ─▶ field and beta stripped ─▶ backend ─▶ reply
    reply's tool_use blocks ─▶ one classifier call ─▶ safeguard_results (JSON: top level;
                                                      stream: the final message_delta)

An upstream configured `safeguards = "forward"` (Anthropic's API) gets both and answers
itself. Without `[safeguards] model` every such request is answered `unsupported`: Claude
Code then classifies with its own requests, which `monitor` refuses with an error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec

from dragoman.calls.types import Call, Completed, Outcome, Reply, Route, Slots
from dragoman.core.config import Config
from dragoman.safeguards import monitor, stream, wire
from dragoman.safeguards.judge import Classifier, judge

log = logging.getLogger("dragoman.safeguards")

Handler = Callable[[Call, Route], Awaitable[Reply]]
UNSET = ("safeguards.model is not set: Claude Code's auto mode will fall back to its own classifier requests, which "
         "the gateway refuses, so its checked actions do not run (docs/claude-code.md#auto-mode)")  # fmt: skip


class _Messages(msgspec.Struct):
    messages: list[Any] = []


_MESSAGES = msgspec.json.Decoder(_Messages)


class Safeguards:
    """Answers `safeguards` for the upstreams that do not, and Claude Code's own classifier requests."""

    def __init__(self, config: Config, route: Callable[[str], Awaitable[Route]],
                 record: Callable[[Outcome], None], slots: Mapping[str, Slots] | None = None) -> None:  # fmt: skip
        self.classifier = Classifier(config.safeguards, route, record, slots or {})
        self._forward = frozenset(
            name for name, upstream in config.upstreams.items() if getattr(upstream, "safeguards", "") == "forward"
        )
        self._unset_said = False
        if config.safeguards.model is None and len(self._forward) < len(config.upstreams):
            log.info("%s", UNSET)  # a warning once a request asks for verdicts: most gateways serve no Claude Code

    @staticmethod
    def concerns(call: Call) -> bool:
        """Whether `send` may do more than call its handler: the request asks for verdicts, or is
        a classifier's (two byte searches; the pipeline calls the handler itself otherwise)."""
        body = call.body
        return monitor.MARK_BYTES in body or wire.MARK_BYTES in body

    async def send(self, call: Call, route: Route, handler: Handler) -> Reply:
        """`handler`'s reply to `call`, with `safeguard_results` where the request asked for them."""
        forwarded = route.upstream in self._forward and route.path != "translate"
        if not forwarded and monitor.is_monitor(call):
            return await monitor.serve(self.classifier, call)
        asked = wire.asked(call)
        if asked is None or forwarded:
            return await handler(call, route)
        call = wire.stripped(call, body=route.path != "translate")
        reply = await handler(call, route)
        if not any(entry.type == wire.KIND for entry in asked) or reply.status != 200:
            return reply
        context = wire.context_of(asked)

        async def decide(message: dict[str, Any]) -> list[dict[str, Any]]:
            return await self._results(call, context, message)

        if isinstance(reply, Completed):
            message = msgspec.json.decode(reply.body)
            if isinstance(message, dict) and message.get("type") == "message":
                reply.body = wire.with_results(reply.body, await decide(message))
            return reply
        return stream.hold(reply, decide)

    async def _results(self, call: Call, context: dict[str, Any], message: dict[str, Any]) -> list[dict[str, Any]]:
        """The reply's `safeguard_results`: `unsupported` without a classifier model, else a
        verdict per tool_use id (none: `{}`, and no classifier call)."""
        if self.classifier.config.model is None:
            if not self._unset_said:
                self._unset_said = True
                log.warning("%s", UNSET)
            return wire.UNSUPPORTED
        blocks, _ = wire.tool_uses(message)
        if not blocks:
            return wire.results({})
        try:
            messages = _MESSAGES.decode(call.body).messages
        except msgspec.DecodeError:
            messages = []
        verdicts, entries = await judge(self.classifier, call, context, messages, message)
        if call.outcome is not None:
            call.outcome.safeguards = entries
        return wire.results(verdicts)
