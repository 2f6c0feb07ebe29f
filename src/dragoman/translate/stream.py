"""OpenAI chat.completion.chunk objects in, Anthropic stream events out.

A pure state machine: no I/O, clock or randomness (ids come in). The shell calls
`start()` once the upstream has accepted the request, `feed()` per chunk and
`finish()` at the end; `done` turns true when a stop sequence matched, and the
shell then closes the upstream so the backend stops generating.

Blocks are emitted strictly one after another (the SDKs append blocks in order
and attribute deltas to the last one), reasoning first, then text and tool calls
in the order they arrive.
"""

from __future__ import annotations

from collections.abc import Callable

from msgspec import UNSET

from dragoman.errors import UpstreamError, from_stream_error
from dragoman.protocol import anthropic as a
from dragoman.protocol import openai
from dragoman.translate.reply import reasoning_as_answer, stop_reason_of, usage_of
from dragoman.translate.stops import PrefillEcho, StopMatcher
from dragoman.translate.thinking import signature_for
from dragoman.translate.tool_args import completion_suffix
from dragoman.translate.tool_ids import client_tool_id


class StreamTranslator:
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
    ) -> None:
        self._model = model
        self._message_id = message_id
        self._new_tool_id = new_tool_id
        self._tool_names = tool_names or {}
        self._taken_ids = set() if taken_tool_ids is None else taken_tool_ids  # the conversation's tool ids, then the reply's
        self._stops = StopMatcher(stop_sequences or [])
        self._matching = bool(self._stops)  # checked per token: a plain flag, not StopMatcher.__bool__
        self._echo = PrefillEcho(prefill)
        self._surface_thinking = surface_thinking
        self._omit_thinking_text = omit_thinking_text
        self._upstream = upstream
        self._open: str | None = None  # "thinking" | "text" | "tool"
        self._index = -1
        self._tool_key: int | str | None = None  # identifies the open tool call (index, else id)
        self._tool_key_index: int | None = None  # its upstream tool_calls[].index
        self._tool_id: str | None = None  # its upstream id
        self._tool_name = ""
        self._tool_args = ""
        self._tool_waiting = False  # a call begun whose block waits for its name (and id, or arguments)
        self._single_tool_call = single_tool_call
        self._window_bound = window_bound
        self._dropping = False  # the fragments of calls after the first, when only one may come back
        self._dropped_index: int | None = None  # the index of the call being dropped
        self._closed_tools: set[int | str] = set()
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
            raise from_stream_error(text, upstream=self._upstream)
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

    @property
    def finished_upstream(self) -> bool:
        """The upstream said why it stopped (a reply cut short never does)."""
        return self._finish is not None

    @property
    def usage(self) -> a.Usage:
        return usage_of(self._usage)

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
        if self._tool_waiting:
            self._start_tool(events)  # the block goes out with the name and id it has
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
        usage = usage_of(self._usage)
        reason = stop_reason_of(self._finish, tool_calls=self._saw_tool, matched=self._stops.matched, window_bound=self._window_bound)
        events.append(
            a.MessageDelta(
                delta=a.MessageDeltaBody(stop_reason=reason, stop_sequence=self._stops.matched),
                usage=a.MessageDeltaUsage(
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    cache_read_input_tokens=usage.cache_read_input_tokens,
                    output_tokens_details=usage.output_tokens_details if usage.output_tokens_details is not None else UNSET,
                ),
            )
        )
        events.append(a.MessageStop())
        return events

    # -- blocks ------------------------------------------------------------------

    def _open_block(self, kind: str, block: a.ContentBlock, events: list[a.StreamEvent]) -> None:
        self._close(events)
        self._index += 1
        self._open = kind
        events.append(a.ContentBlockStart(index=self._index, content_block=block))

    def _close(self, events: list[a.StreamEvent]) -> None:
        if self._tool_waiting:
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
        """A fragment continues the current call unless it names another call: a new
        `index`, or (for servers that omit or reuse indices) an `id` other than the
        call's. A call's block starts once its name and its id (or its first arguments)
        are known: some servers send the id first, others the name before the id."""
        function = call.function or openai.ResponseFunction()
        current = self._open == "tool" or self._tool_waiting
        # An id other than the call's, or, for a call whose id has not come, an id that comes
        # with a name while the call has its name (a server without indices: the next call).
        other_id = call.id is not None and (
            call.id != self._tool_id if self._tool_id is not None else bool(function.name and self._tool_name)
        )
        if self._dropping:
            kept = call.id == self._tool_id if call.id is not None else (
                call.index is not None and call.index == self._tool_key_index and call.index != self._dropped_index
            )  # fmt: skip
            if not kept:
                return  # a fragment of a call after the first
            self._dropping = False
        if current and not other_id and (call.index is None or call.index == self._tool_key_index):
            if self._tool_id is None:
                self._tool_id = call.id  # the upstream's id came after the name (the block has ours)
        else:
            key = call.id if (other_id and (call.index is None or call.index == self._tool_key_index)) else call.index
            if key is None:
                key = call.id or f"call-{len(self._closed_tools)}"
            if self._single_tool_call and self._saw_tool:
                self._dropping = True  # the client asked for one call (`disable_parallel_tool_use`)
                self._dropped_index = call.index
                return
            if key in self._closed_tools:
                raise UpstreamError(f"upstream {self._upstream} interleaved the arguments of parallel tool calls")
            self._close(events)
            self._tool_key, self._tool_key_index, self._tool_id = key, call.index, call.id
            self._tool_name, self._tool_args = "", ""
            self._tool_waiting = True
            self._answered = self._saw_tool = True
        if self._tool_waiting and function.name and not self._tool_name:
            self._tool_name = self._tool_names.get(function.name, function.name)
        arguments = function.arguments
        if isinstance(arguments, dict):  # Ollama-style: a whole object instead of JSON text
            arguments = openai.ENCODER.encode(arguments).decode()
        if arguments and not self._tool_args:
            arguments = arguments.lstrip()  # the SDKs parse every prefix: one of only whitespace fails
        if arguments:
            self._tool_args += arguments
            if not self._tool_waiting:
                events.append(a.ContentBlockDelta(index=self._index, delta=a.InputJSONDelta(partial_json=arguments)))
        if self._tool_waiting and self._tool_name and (self._tool_id is not None or self._tool_args):
            self._start_tool(events)  # an id still missing once arguments flow will not come: ours

    def _start_tool(self, events: list[a.StreamEvent]) -> None:
        """The current call's block, with the arguments that came before its name."""
        self._tool_waiting = False
        self._index += 1
        self._open = "tool"
        tool_id = client_tool_id(self._tool_id, self._taken_ids) if self._tool_id else self._new_tool_id()
        block = a.OutToolUseBlock(id=tool_id, name=self._tool_name, input={})
        events.append(a.ContentBlockStart(index=self._index, content_block=block))
        if self._tool_args:
            events.append(a.ContentBlockDelta(index=self._index, delta=a.InputJSONDelta(partial_json=self._tool_args)))

    def _finish_tool_arguments(self, events: list[a.StreamEvent]) -> None:
        if self._tool_key is not None:
            self._closed_tools.add(self._tool_key)
        text = self._tool_args.strip()
        if not text:
            return  # no delta: the SDKs keep the block's `input: {}`
        suffix = completion_suffix(text)
        if suffix is None:
            # Not JSON: the model's words stand as it wrote them. Claude Code answers the model
            # with a validation error and it tries again; an error event here would end the turn
            # and send the client into retries that generate the whole reply again and again.
            return
        if suffix:  # a prefix of JSON (cut by max_tokens): closed
            events.append(a.ContentBlockDelta(index=self._index, delta=a.InputJSONDelta(partial_json=suffix)))
