"""A stream's response until its body begins, and the one place that may send it again.

A server may send a stream's head at once and its body only once it has generated
something (vLLM does, and with its engine hung sends the head and then nothing), so a
stream's head is no answer: its first body bytes are. When they do not come in time, or
the connection breaks before them, the request may go once more to another instance;
the rules, and why the client never sees the retry, are in docs/operations.md (Retries
and replicas). The stream pump (`upstream.pump`) calls `begun` until it returns, before
its first read; its per-chunk reads are untouched.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Protocol

from dragoman.core.errors import UpstreamError, UpstreamTimeout
from dragoman.upstream.keepalive import ReadWatch
from dragoman.upstream.placement import MessagesParts, Prompt, PromptKind
from dragoman.upstream.replicas import Replicas
from dragoman.upstream.transport.response import Response


@dataclass(slots=True)
class Sending:
    """One POST across its attempts: what is sent, and what its retries have used so far."""

    target: str
    lines: bytes
    body: bytes
    outcome: Any  # the request's Outcome (its retries are counted), or None
    stream: bool  # a 200 text/event-stream head is no answer yet (an Opening decides)
    budget_end: float  # time.monotonic() past which no retry waits
    attempt: int = 0
    timed_out: bool = False  # an instance was silent: a second silence is not retried
    broke: bool = False  # an instance closed a stream before its body began: a second such close is not retried
    root: str | None = None  # the instance of the latest attempt
    kind: PromptKind | MessagesParts | None = None  # the body is a prompt of this kind (routing may match it), or none
    conversation: str | None = None  # the client's session, if it named one
    previous: str | None = None  # the tag of the replica the conversation's turn before went to, if it said
    prompt: Prompt | None = None  # the body as routing sees it, once read
    held: str | None = None  # the instance counting this request in flight (until the reply ends)
    counted: bool = False  # the outcome releases `held` when the reply ends


class Resender(Protocol):
    """What an Opening asks of the retrying client (`upstream.client.HttpClient`) that
    made it: whether to send the request again, and to do so."""

    name: str
    replicas: Replicas

    def resends_silent(self, request: Sending, root: str) -> bool: ...

    def resends_broken(self, request: Sending, root: str) -> bool: ...

    async def resend(self, request: Sending) -> Response: ...


class Opening:
    """A stream request whose head came from `root` and whose body has not begun yet."""

    __slots__ = ("_begun", "_client", "_request", "_resending", "_resent", "_settled", "_timeout", "_watched", "root")

    def __init__(self, client: Resender, request: Sending, root: str, timeout: float) -> None:
        self._client = client
        self._request = request
        self._timeout = timeout  # first_byte_timeout
        self.root = root
        self._resending: asyncio.Task[Response] | None = None  # the request, sent again
        self._resent: Response | None = None  # its response, once its head came
        self._watched: Response | None = None  # the response whose first bytes the watch's deadline is for
        self._begun = False
        self._settled = False  # the replicas were told how `root` did

    async def begun(self, first: Response, watch: ReadWatch) -> Response:
        """The response to read, once its body has begun: `first`, or the one of another
        instance the request went to after `first` sent no body byte in time. Raises Silence
        after each keep-alive interval without one (the caller keeps the client's stream
        alive, then calls again), or UpstreamTimeout once the request is not sent again."""
        client = self._client
        while True:
            resending = self._resending
            if resending is not None:  # its own timeouts bound it until its head
                await watch.read(asyncio.wait((resending,)))  # a Silence leaves the task running
                self._resending = None
                self._resent = self._stream_of(resending.result())
                self.root = self._request.root or self.root
                self._settled = False
            response = self._resent or first
            if self._watched is not response:
                watch.expect_by(response.sent_at + self._timeout)
                self._watched = response
            try:
                has_bytes = await watch.read(response.readable())
            except UpstreamTimeout:
                self._silent(response, watch)
                continue
            if has_bytes or not self._broken(response, watch):
                break
        self._begun = self._settled = True
        # What refers back to a response goes: a Response holds its Opening, and the cycle
        # would keep the request's body (80 KB from Claude Code) until the garbage collector runs.
        self._watched = self._resent = None
        first.opening = response.opening = None
        if has_bytes:
            client.replicas.answered(self.root)
        return response  # else it broke (`_broken`), and is not sent again: the loop's read says how

    def _broken(self, response: Response, watch: ReadWatch) -> bool:
        """`response` ended or failed before a byte of its body (its instance closed or reset the
        connection: it restarts, say). Whether the request is sent again, as for a silence."""
        client = self._client
        client.replicas.failed(self.root, silent=False)
        self._settled = True
        if not client.resends_broken(self._request, self.root):
            return False
        response.close()
        self._resending = asyncio.ensure_future(client.resend(self._request))
        watch.expect_by(math.inf)
        return True

    def _silent(self, response: Response, watch: ReadWatch) -> None:
        client = self._client
        client.replicas.failed(self.root, silent=True)
        self._settled = True
        response.close()  # the instance stops working on it
        if not client.resends_silent(self._request, self.root):
            raise UpstreamTimeout(f"upstream {client.name} timed out (no response within {self._timeout:g} s: "
                                  "the stream's head came, then nothing)")  # fmt: skip
        self._resending = asyncio.ensure_future(client.resend(self._request))
        watch.expect_by(math.inf)

    def _stream_of(self, response: Response) -> Response:
        if response.opening is None:  # 2xx, but not an event stream (a retry's refusals are raised mapped)
            response.close()
            raise UpstreamError(
                f"upstream {self._client.name} answered a stream request without a stream ({response.content_type})"
            )
        response.opening = None  # this Opening speaks for it
        return response

    def close(self) -> None:
        """The stream is over. Before its body began (the client left, or it failed): a request
        sent again is cancelled, its response closed, and a trial of the instance ends."""
        if self._begun:
            return
        self._watched = None  # no cycle back to a response (see `begun`)
        resending = self._resending
        if resending is not None:
            if not resending.done():
                resending.cancel()  # closes its connection, and its instance's trial ends (HttpClient._send)
            elif not resending.cancelled() and resending.exception() is None:
                resending.result().close()
            return
        if self._resent is not None:
            self._resent.close()
        if not self._settled:
            self._client.replicas.abandoned(self.root)
