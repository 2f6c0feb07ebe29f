"""OpenAI chat.completion.chunk objects in, Anthropic stream events out.

A pure state machine: no I/O, clock or randomness (ids come in). The shell calls
`start()` once the upstream has accepted the request, `feed()` per chunk and
`finish()` at the end; `done` turns true when a stop sequence matched, and the
shell then closes the upstream so the backend stops generating.

Blocks are emitted strictly one after another (the SDKs append blocks in order
and attribute deltas to the last one), reasoning first, then text and tool calls
in the order they arrive. Tool calls whose argument fragments interleave come out one
after another too, in the order they began (see `_tool_call`).
"""

from __future__ import annotations

from collections.abc import Callable

from msgspec import UNSET

from dragoman.core.error_mapping import from_stream_error
from dragoman.core.errors import UpstreamError
from dragoman.core.redaction import NO_KEYS, Redactor
from dragoman.protocol import anthropic as a
from dragoman.protocol import openai
from dragoman.translate.reply import reasoning_as_answer, stop_reason_of, usage_of
from dragoman.translate.stops import PrefillEcho, StopMatcher
from dragoman.translate.thinking import signature_for
from dragoman.translate.tool_args import completion_suffix
from dragoman.translate.tool_calls import ToolCall, arguments_complete, open_call_for
from dragoman.translate.tool_ids import client_tool_id, tagged


def message_delta(reason: a.StopReason, stop_sequence: str | None, usage: a.Usage) -> a.MessageDelta:
    """A reply's `message_delta`: why it stopped, and its usage."""
    return a.MessageDelta(
        delta=a.MessageDeltaBody(stop_reason=reason, stop_sequence=stop_sequence),
        usage=a.MessageDeltaUsage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_input_tokens=usage.cache_read_input_tokens,
            output_tokens_details=usage.output_tokens_details if usage.output_tokens_details is not None else UNSET,
        ),
    )


_NO_CALL = ToolCall(key="", index=None, id=None)  # before the first call: read, never changed (calls are begun)


class StreamTranslator:
    __slots__ = (
        "_answered",
        "_closed_tools",
        "_dropped_index",
        "_dropping",
        "_echo",
        "_finish",
        "_generated",
        "_hidden_reasoning",
        "_index",
        "_live",
        "_matching",
        "_message_id",
        "_model",
        "_new_tool_id",
        "_omit_thinking_text",
        "_open",
        "_queued",
        "_replica_tag",
        "_saw_content",
        "_saw_tool",
        "_single_tool_call",
        "_stops",
        "_surface_thinking",
        "_taken_ids",
        "_tool",
        "_tool_names",
        "_upstream",
        "_usage",
        "_window_bound",
        "done",
        "redactor",
        "upstream_ended",
    )

    def __init__(
        self,
        *,
        model: str,
        message_id: str,
        new_tool_id: Callable[[], str],
        tool_names: dict[str, str] | None = None,
        taken_tool_ids: set[str] | None = None,
        stop_sequences: list[str] | None = None,
        surface_thinking: bool = False,
        omit_thinking_text: bool = False,
        single_tool_call: bool = False,
        window_bound: bool = False,
        prefill: str = "",
        upstream: str = "upstream",
        replica_tag: Callable[[], str] = str,
        redactor: Redactor = NO_KEYS,
    ) -> None:
        self._model = model
        self._message_id = message_id
        self._new_tool_id = new_tool_id
        self._tool_names = tool_names or {}
        self._taken_ids = set() if taken_tool_ids is None else taken_tool_ids  # the conversation's, then the reply's
        self._replica_tag = replica_tag  # read at the first call: by then the replica answering is known
        self._stops = StopMatcher(stop_sequences or [])
        self._matching = bool(self._stops)  # checked per token: a plain flag, not StopMatcher.__bool__
        self._echo = PrefillEcho(prefill)
        self._surface_thinking = surface_thinking
        self._omit_thinking_text = omit_thinking_text
        self._upstream = upstream
        self.redactor = redactor  # the gateway's keys, kept out of an error the upstream streams
        self._open: str | None = None  # "thinking" | "text" | "tool"
        self._index = -1
        # The call begun last, open or not: a fragment without index or id continues it, and
        # the next call is told from it. At first none (a key no call has).
        self._tool = _NO_CALL
        self._live: ToolCall | None = None  # the call whose block is open, or waits for its name (and id, or arguments)
        self._queued: list[ToolCall] = []  # calls begun while the live one's arguments were incomplete, in order
        self._single_tool_call = single_tool_call
        self._window_bound = window_bound
        self._dropping = False  # the fragments of calls after the first, when only one may come back
        self._dropped_index: int | None = None  # the index of the call being dropped
        self._closed_tools: dict[int | str, bool] = {}  # the keys of closed calls: were their arguments complete
        self._answered = False  # a text or tool_use block was emitted
        self._saw_tool = False
        self._saw_content = False
        self._hidden_reasoning: list[str] = []
        self._finish: str | None = None
        self._usage: openai.Usage | None = None
        self._generated = 0  # upstream chunks that carried output (a token each, as servers stream)
        self.done = False
        self.upstream_ended = False  # the shell saw the upstream's `[DONE]`

    # -- public ------------------------------------------------------------------

    def start(self) -> list[a.StreamEvent]:
        message = a.Message(
            id=self._message_id,
            model=self._model,
            content=[],
            stop_reason=None,
            stop_sequence=None,
            usage=a.Usage(input_tokens=0, output_tokens=0),
        )
        return [a.MessageStart(message=message)]

    def feed(self, chunk: openai.ChatChunk) -> list[a.StreamEvent]:
        if chunk.error is not None:
            text = chunk.error if isinstance(chunk.error, str) else (chunk.error.message or chunk.error.type or "error")
            raise from_stream_error(text, upstream=self._upstream, redactor=self.redactor,
                                    status=getattr(chunk.error, "code", None))  # fmt: skip
        if chunk.usage is not None:
            self._usage = chunk.usage
        events: list[a.StreamEvent] = []
        if self.done:
            return events
        if not chunk.choices:
            return events
        choice = chunk.choices[0]
        delta = choice.delta
        content = delta.content
        if content and not (delta.reasoning or delta.reasoning_content or delta.tool_calls or delta.refusal):
            self._generated += 1  # a token of text, as most chunks are
            self._text(content, events)
        elif content or delta.reasoning or delta.reasoning_content or delta.tool_calls or delta.refusal:
            self._generated += 1
            reasoning = delta.reasoning or delta.reasoning_content
            if reasoning:
                self._reasoning(reasoning, events)
            if content:
                self._text(content, events)
            if delta.refusal:
                self._text(delta.refusal, events)
            if delta.tool_calls and not self.done:
                for call in delta.tool_calls:
                    self._tool_call(call, events)
        if choice.finish_reason:
            self._finish = choice.finish_reason
        return events

    def feed_text(self, text: str, events: list[a.StreamEvent]) -> None:
        """`feed` of a chunk of nothing but non-empty `text`, its events appended to `events`."""
        if not self.done:
            self._generated += 1
            self._text(text, events)

    def streaming_text(self, text: str) -> int:
        """`feed_text` while a text block is open, no stop sequence or prefill echo watched: the
        open block's index, under which the caller sends the text delta itself; else -1, nothing done."""
        if self._open != "text" or self.done or self._matching or not self._echo.done or not text:
            return -1
        self._generated += 1
        self._saw_content = self._answered = True
        return self._index

    def open_text(self) -> int:
        """`streaming_text`'s test alone, for many tokens: the open text block's index, under
        which the caller sends text deltas itself (each counted by `streamed`); else -1."""
        if self._open != "text" or self.done or self._matching or not self._echo.done:
            return -1
        return self._index

    def streamed(self, tokens: int) -> None:
        """`tokens` chunks of non-empty text the caller sent under `open_text`'s block."""
        self._generated += tokens
        self._saw_content = self._answered = True

    @property
    def finished_upstream(self) -> bool:
        """The upstream said why it stopped (a reply cut short never does)."""
        return self._finish is not None

    @property
    def usage(self) -> a.Usage:
        return usage_of(self._usage)

    def usage_so_far(self) -> a.Usage | None:
        """For a stream cut short: the upstream's usage if it came, else the output as one
        token per chunk received (the input unknown: None when nothing came)."""
        if self._usage is not None:
            return usage_of(self._usage)
        return a.Usage(input_tokens=0, output_tokens=self._generated) if self._generated else None

    @property
    def needs_usage(self) -> bool:
        """The reply has no usage from the upstream: a stop sequence matched here ended it
        before the upstream reported one (the upstream stream is closed to stop the
        generation), or the server reports none (it ignored `stream_options`)."""
        return self._usage is None

    def assume_usage(self, prompt_tokens: int, completion_tokens: int | None = None) -> None:
        """Usage for a reply without the upstream's: the prompt as counted, and the output
        as given, else one token for each chunk received (servers stream a token per chunk)."""
        if self._usage is None:
            output = self._generated if completion_tokens is None else completion_tokens
            self._usage = openai.Usage(prompt_tokens=prompt_tokens, completion_tokens=output)

    def finish(self) -> list[a.StreamEvent]:
        events: list[a.StreamEvent] = []
        held = self._echo.flush()
        if held and not self.done:
            self._text(held, events)
        rest = self._stops.flush()
        if rest:
            self._emit_text(rest, events)
        if not self._answered:
            # No text or tool call: the reasoning is the answer, if the model ended the reply
            # itself; otherwise a thinking block alone, or an empty text block. Content that
            # a stop sequence cut to nothing is an answer too, an empty one.
            as_answer = reasoning_as_answer(self._finish, saw_content=self._saw_content)
            text = "".join(self._hidden_reasoning) if as_answer else ""
            if text:
                self._emit_text(text, events)
            elif not (self._surface_thinking and self._hidden_reasoning):
                self._open_block("text", a.OutTextBlock(text=""), events)
        self._close(events)
        reason = stop_reason_of(
            self._finish, tool_calls=self._saw_tool, matched=self._stops.matched, window_bound=self._window_bound
        )
        events.append(message_delta(reason, self._stops.matched, usage_of(self._usage)))
        events.append(a.MessageStop())
        return events

    def text_end(self) -> tuple[int, a.StopReason, a.Usage] | None:
        """`finish` of a reply whose text block is open, nothing held back (no stop sequence
        watched, no prefill echo pending, no tool call waiting): the block closed, its index,
        the stop reason and the usage, from which the caller writes `finish`'s three events
        (`content_block_stop`, `message_delta` without a stop sequence, `message_stop`)
        itself. None, nothing done, for any other reply."""
        if self._open != "text" or self._matching or not self._echo.done or self._live is not None or self._queued:
            return None
        self._open = None
        reason = stop_reason_of(self._finish, tool_calls=self._saw_tool, matched=None, window_bound=self._window_bound)
        return self._index, reason, usage_of(self._usage)

    # -- blocks ------------------------------------------------------------------

    def _open_block(self, kind: str, block: a.ContentBlock, events: list[a.StreamEvent]) -> None:
        self._close(events)
        self._index += 1
        self._open = kind
        events.append(a.ContentBlockStart(index=self._index, content_block=block))

    def _close(self, events: list[a.StreamEvent]) -> None:
        """Close the open block; tool calls that wait behind it come out after it, each whole."""
        self._close_block(events)
        while self._queued:
            self._promote(events)
            self._close_block(events)

    def _close_block(self, events: list[a.StreamEvent]) -> None:
        if self._live is not None and not self._live.started:
            self._start_tool(events)  # other output follows a call that never got its name
        if self._open is None:
            return
        if self._open == "thinking":  # (the one thinking block: all the reasoning so far is its own)
            signature = signature_for("".join(self._hidden_reasoning), omitted=self._omit_thinking_text)
            events.append(a.ContentBlockDelta(index=self._index, delta=a.SignatureDelta(signature=signature)))
        elif self._open == "tool":
            self._finish_tool_arguments(events)
        events.append(a.ContentBlockStop(index=self._index))
        self._open = None

    def _reasoning(self, text: str, events: list[a.StreamEvent]) -> None:
        if not self._surface_thinking:
            self._hidden_reasoning.append(text)
            return
        if self._open != "thinking":
            if self._answered:
                self._hidden_reasoning.append(text)  # late reasoning cannot precede the answer any more
                return
            self._open_block("thinking", a.OutThinkingBlock(thinking="", signature=""), events)
        if not self._omit_thinking_text:
            events.append(a.ContentBlockDelta(index=self._index, delta=a.ThinkingDelta(thinking=text)))
        self._hidden_reasoning.append(text)

    def _text(self, text: str, events: list[a.StreamEvent]) -> None:
        self._saw_content = True
        if not self._echo.done:
            text = self._echo.feed(text)
        if self._matching:
            text = self._stops.feed(text)
            if self._stops.matched is not None:
                self.done = True
        if text:
            self._emit_text(text, events)

    def _emit_text(self, text: str, events: list[a.StreamEvent]) -> None:
        if self._open != "text":
            self._open_block("text", a.OutTextBlock(text=""), events)
        self._answered = True
        events.append(a.ContentBlockDelta(index=self._index, delta=a.TextDelta(text=text)))

    def _tool_call(self, call: openai.ResponseToolCall, events: list[a.StreamEvent]) -> None:
        """A fragment continues the call it names unless it names another call: a new
        `index`, or (for servers that omit or reuse indices) an `id` other than the
        call's. A call's block starts once its name and its id (or its first arguments)
        are known: some servers send the id first, others the name before the id.

        Calls come one after another from most servers, and each call's block streams as
        its fragments arrive. Some introduce several calls at once and then interleave
        their fragments; a call begun while the live one's arguments are not yet a whole
        JSON object waits (queued, its fragments gathered) until they are, or until other
        output or the end comes: then the live block closes and the next call comes out,
        its arguments so far as one delta, and streams from there."""
        function = call.function or openai.ResponseFunction()
        # The call this fragment is told against: the one begun last, or, with calls waiting,
        # the open call it names.
        target = self._tool if not self._queued else self._open_call_named(call)
        # An id other than the call's, or, for a call whose id has not come, an id that comes
        # with a name while the call has its name (a server without indices: the next call).
        other_id = call.id is not None and (
            call.id != target.id if target.id is not None else bool(function.name and target.name)
        )
        if self._dropping and self._drops(call, target):
            return  # a fragment of a call after the first
        if self._live is not None and not other_id and (call.index is None or call.index == target.index):
            if target.id is None:
                target.id = call.id  # the upstream's id came after the name (the block has ours)
        else:
            begun = self._begin_call(call, function, target, other_id, events)
            if begun is None:
                return
            target = begun
        if not target.started and function.name and not target.name:
            target.name = self._tool_names.get(function.name, function.name)
        arguments = function.arguments
        if isinstance(arguments, dict):  # Ollama-style: a whole object instead of JSON text
            arguments = openai.ENCODER.encode(arguments).decode()
        if arguments and not target.pieces:
            arguments = arguments.lstrip()  # the SDKs parse every prefix: one of only whitespace fails
        if arguments:
            target.pieces.append(arguments)
            if target.started:
                events.append(a.ContentBlockDelta(index=self._index, delta=a.InputJSONDelta(partial_json=arguments)))
        if not target.started and target is self._live:
            self._start_when_ready(events)
        # With calls waiting, the live call's arguments may have just become whole (an object's
        # last fragment ends with its brace: only then is it worth decoding them).
        if self._queued and target is self._live and arguments and arguments.rstrip().endswith("}"):
            self._advance(events)

    def _drops(self, call: openai.ResponseToolCall, target: ToolCall) -> bool:
        """Whether a fragment, while calls after the first are dropped, is one of theirs; the
        first call's next fragment ends the dropping."""
        kept = call.id == target.id if call.id is not None else (
            call.index is not None and call.index == target.index and call.index != self._dropped_index
        )  # fmt: skip
        if kept:
            self._dropping = False
        return not kept

    def _begin_call(
        self,
        call: openai.ResponseToolCall,
        function: openai.ResponseFunction,
        target: ToolCall,
        other_id: bool,
        events: list[a.StreamEvent],
    ) -> ToolCall | None:
        """The call a fragment begins, keyed by its index or its id (servers without indices), else
        by its place; live at once, or queued behind the live one. None when nothing of it goes
        out: a call after the first when only one may come back, or whitespace after a call's
        whole arguments."""
        key = call.id if (other_id and (call.index is None or call.index == target.index)) else call.index
        if key is None:
            key = call.id or f"call-{len(self._closed_tools)}"
        if self._single_tool_call and self._saw_tool:
            self._dropping = True  # the client asked for one call (`disable_parallel_tool_use`)
            self._dropped_index = call.index
            return None
        if key in self._closed_tools:
            rest = function.arguments
            if self._closed_tools[key] and not isinstance(rest, dict) and not (rest or "").strip():
                return None  # whitespace after a call's whole arguments: nothing the client needs
            raise UpstreamError(f"upstream {self._upstream} sent more of tool call {key!r} after the call had ended")
        begun = self._tool = ToolCall(key=key, index=call.index, id=call.id)
        self._answered = self._saw_tool = True
        if self._live is None:
            self._close(events)
            self._live = begun
        else:
            self._queued.append(begun)
            self._advance(events)  # the live call may be whole (the common case: calls one after another)
        return begun

    def _open_call_named(self, call: openai.ResponseToolCall) -> ToolCall:
        assert self._live is not None  # calls wait only behind a live one
        return open_call_for(call.index, call.id, [self._live, *self._queued])

    def _start_when_ready(self, events: list[a.StreamEvent]) -> None:
        live = self._live
        assert live is not None
        if live.name and (live.id is not None or live.pieces):
            self._start_tool(events)  # an id still missing once arguments flow will not come: ours

    def _advance(self, events: list[a.StreamEvent]) -> None:
        """Close the live call once its arguments are whole, and bring out the calls waiting
        behind it (each one whole already closes at once)."""
        while self._queued and self._live is not None and arguments_complete(self._live.args):
            self._close_block(events)
            self._promote(events)

    def _promote(self, events: list[a.StreamEvent]) -> None:
        """The first waiting call becomes the live one (no block is open)."""
        self._live = self._queued.pop(0)
        self._start_when_ready(events)

    def _start_tool(self, events: list[a.StreamEvent]) -> None:
        """The live call's block, with the arguments that came before it started."""
        live = self._live
        assert live is not None
        live.started = True
        self._index += 1
        self._open = "tool"
        tag = self._replica_tag()
        tool_id = client_tool_id(live.id, self._taken_ids, tag) if live.id else tagged(self._new_tool_id(), tag)
        block = a.OutToolUseBlock(id=tool_id, name=live.name, input={})
        events.append(a.ContentBlockStart(index=self._index, content_block=block))
        if live.args:
            events.append(a.ContentBlockDelta(index=self._index, delta=a.InputJSONDelta(partial_json=live.args)))

    def _finish_tool_arguments(self, events: list[a.StreamEvent]) -> None:
        live = self._live
        assert live is not None
        self._live = None
        complete = arguments_complete(live.args)
        self._closed_tools[live.key] = complete
        text = live.args.strip()
        if complete or not text:
            return  # no delta: whole already, or none (the SDKs keep the block's `input: {}`)
        suffix = completion_suffix(text)
        if suffix is None:
            # Not JSON: the model's words stand as it wrote them. Claude Code answers the model
            # with a validation error and it tries again; an error event here would end the turn
            # and send the client into retries that generate the whole reply again and again.
            return
        if suffix:  # a prefix of JSON (cut by max_tokens): closed
            events.append(a.ContentBlockDelta(index=self._index, delta=a.InputJSONDelta(partial_json=suffix)))
