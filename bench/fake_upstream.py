"""A lean fake model server for the benchmark: it must never be the bottleneck.

Speaks just enough HTTP/1.1 (keep-alive, chunked replies; parsed by httptools on a
raw asyncio Protocol, uvloop when installed) to serve:

- `POST /v1/chat/completions`: OpenAI Chat Completions, canned JSON or an SSE
  stream of one chunk per token, a finish chunk, a usage chunk and `[DONE]`;
- `GET /v1/models`: the model list (`bench-model`, `bench-model-paced`, `bench-model-slow`);
- `POST /v1/messages`: Anthropic Messages, JSON or the exact Anthropic SSE event
  sequence (message_start, content_block_start, ping, deltas, content_block_stop,
  message_delta, message_stop), for the passthrough path;
- `POST /v1/messages/count_tokens`.

A reply has `--tokens` tokens, or the request's `max_tokens` if that is smaller
(the benchmark picks 100 or 500 per request that way). With `--delay-ms 0` a
stream is written at once (one chunked-encoding frame per event, one write);
with a delay, one shared timer per delay writes the next token to every open
stream on each tick, so a thousand paced streams cost one wake-up per tick. Models
whose name ends in `-paced` or `-slow` use `--paced-delay-ms` (tokens that arrive
one by one, as from a real model) or `--slow-delay-ms` (idle-stream tests).

Usage: python bench/fake_upstream.py --port 9000 [--tokens 100] [--delay-ms 0]
Prints `ready <port>` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

import httptools
import msgspec

MODELS = ("bench-model", "bench-model-paced", "bench-model-slow")
CREATED = 1700000000
# A fixed vocabulary of short words; token i is WORDS[i % len(WORDS)].
WORDS = [
    " the", " gateway", " forwards", " each", " token", " as", " soon", " as", " it", " arrives",
    " and", " keeps", " the", " event", " loop", " free", " of", " blocking", " work", ".",
]  # fmt: skip


class _Request(msgspec.Struct):
    """The few request fields the fake looks at; msgspec skips the rest quickly."""

    model: str = "bench-model"
    stream: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


_decode = msgspec.json.Decoder(_Request).decode
_json = msgspec.json.encode


def _frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunked-encoding frame."""
    return b"%x\r\n%s\r\n" % (len(data), data)


_END = b"0\r\n\r\n"
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _json_reply(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body)


class Canned:
    """Pre-encoded reply fragments, per model name (a handful at most)."""

    def __init__(self, model: str) -> None:
        m = _json(model)
        self.oa_first = _frame(
            b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":%d,"model":%s,'
            b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
            % (CREATED, m)
        )
        self.oa_tokens = [
            _frame(
                b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":%d,"model":%s,'
                b'"choices":[{"index":0,"delta":{"content":%s},"logprobs":null,"finish_reason":null}]}\n\n'
                % (CREATED, m, _json(w))
            )
            for w in WORDS
        ]
        self.oa_finish = _frame(
            b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":%d,"model":%s,'
            b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}\n\n' % (CREATED, m)
        )
        self.an_tokens = [
            _frame(
                b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                b'"delta":{"type":"text_delta","text":%s}}\n\n' % _json(w)
            )
            for w in WORDS
        ]
        self.an_block_start = _frame(
            b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
            b'"content_block":{"type":"text","text":""}}\n\n'
        )
        self.an_ping = _frame(b'event: ping\ndata: {"type": "ping"}\n\n')
        self.an_block_stop = _frame(b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n')
        self.an_stop = _frame(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        self.model = m
        self._runs: dict[tuple[str, int], bytes] = {}

    def run(self, kind: str, n: int) -> bytes:
        """The n token frames, joined (cached: the benchmark uses two or three sizes)."""
        key = (kind, n)
        run = self._runs.get(key)
        if run is None:
            tokens = self.oa_tokens if kind == "oa" else self.an_tokens
            run = b"".join(tokens[i % len(tokens)] for i in range(n))
            if len(self._runs) < 64:
                self._runs[key] = run
        return run

    def text(self, n: int) -> str:
        return "".join(WORDS[i % len(WORDS)] for i in range(n))

    # -- OpenAI ----------------------------------------------------------------

    def oa_json(self, n: int, prompt: int) -> bytes:
        body = (
            b'{"id":"chatcmpl-bench","object":"chat.completion","created":%d,"model":%s,"choices":[{"index":0,'
            b'"message":{"role":"assistant","content":%s},"logprobs":null,"finish_reason":"stop"}],'
            b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}'
            % (CREATED, self.model, _json(self.text(n)), prompt, n, prompt + n)
        )
        return _json_reply(body)

    def oa_tail(self, n: int, prompt: int) -> bytes:
        usage = _frame(
            b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":%d,"model":%s,"choices":[],'
            b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n'
            % (CREATED, self.model, prompt, n, prompt + n)
        )
        return self.oa_finish + usage + _frame(b"data: [DONE]\n\n") + _END

    # -- Anthropic -------------------------------------------------------------

    def an_json(self, n: int, prompt: int) -> bytes:
        body = (
            b'{"id":"msg_bench","type":"message","role":"assistant","model":%s,'
            b'"content":[{"type":"text","text":%s}],"stop_reason":"end_turn","stop_sequence":null,'
            b'"usage":{"input_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":%d}}'
            % (self.model, _json(self.text(n)), prompt, n)
        )
        return _json_reply(body)

    def an_head(self, prompt: int) -> bytes:
        start = _frame(
            b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_bench","type":"message",'
            b'"role":"assistant","model":%s,"content":[],"stop_reason":null,"stop_sequence":null,'
            b'"usage":{"input_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}\n\n'
            % (self.model, prompt)
        )
        return start + self.an_block_start + self.an_ping

    def an_tail(self, n: int) -> bytes:
        delta = _frame(
            b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
            b'"usage":{"output_tokens":%d}}\n\n' % n
        )
        return self.an_block_stop + delta + self.an_stop + _END


class Stream:
    """A paced stream: token k is due `k * delay` after the stream started."""

    __slots__ = ("conn", "tokens", "sent", "n", "tail", "start")

    def __init__(self, conn: Conn, tokens: list[bytes], n: int, tail: bytes, start: float) -> None:
        self.conn, self.tokens, self.sent, self.n, self.tail, self.start = conn, tokens, 0, n, tail, start


class Ticker:
    """One timer per delay: each tick writes every open stream's due tokens. A late
    tick (timers have millisecond granularity; a busy machine delays them) sends the
    tokens that fell due meanwhile together, so a stream of n tokens still ends about
    n * delay after it began."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        self.loop, self.delay = loop, delay
        self.streams: set[Stream] = set()
        self._handle: asyncio.TimerHandle | None = None

    def add(self, stream: Stream) -> None:
        self.streams.add(stream)
        if self._handle is None:
            self._handle = self.loop.call_at(stream.start + self.delay, self._tick)

    def discard(self, stream: Stream) -> None:
        self.streams.discard(stream)

    def _tick(self) -> None:
        now = self.loop.time()
        finished = []
        for stream in self.streams:
            transport = stream.conn.transport
            if transport is None or transport.is_closing():
                finished.append(stream)
                continue
            due = min(stream.n, int((now - stream.start) / self.delay + 1e-6))
            if due <= stream.sent:
                continue
            tokens = stream.tokens
            count = len(tokens)
            if due - stream.sent == 1:
                transport.write(tokens[stream.sent % count])
            else:
                transport.write(b"".join(tokens[i % count] for i in range(stream.sent, due)))
            stream.sent = due
            if due >= stream.n:
                finished.append(stream)
                transport.write(stream.tail)
                stream.conn.finish_stream()
        for stream in finished:
            self.streams.discard(stream)
        if self.streams:
            self._handle = self.loop.call_at(now + self.delay, self._tick)
        else:
            self._handle = None


class Server:
    def __init__(self, tokens: int, delay_ms: float, paced_delay_ms: float, slow_delay_ms: float) -> None:
        self.tokens = tokens
        self.delay = delay_ms / 1000
        self.delays = {"-paced": paced_delay_ms / 1000, "-slow": slow_delay_ms / 1000}
        self.canned: dict[str, Canned] = {}
        self.tickers: dict[float, Ticker] = {}
        models = [{"id": m, "object": "model", "created": CREATED, "owned_by": "bench"} for m in MODELS]
        self.models_reply = _json_reply(_json({"object": "list", "data": models}))

    def canned_for(self, model: str) -> Canned:
        canned = self.canned.get(model)
        if canned is None:
            if len(self.canned) > 16:
                self.canned.clear()
            canned = self.canned[model] = Canned(model)
        return canned

    def ticker(self, delay: float) -> Ticker:
        ticker = self.tickers.get(delay)
        if ticker is None:
            ticker = self.tickers[delay] = Ticker(asyncio.get_running_loop(), delay)
        return ticker


class Conn(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.keep_alive = True
        self.stream: Stream | None = None
        self.ticker: Ticker | None = None

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None and self.ticker is not None:
            self.ticker.discard(self.stream)
        self.transport = None
        self.stream = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(_json_reply(b'{"error":"bad request"}', b"400 Bad Request"))
                self.transport.close()

    # -- httptools callbacks ---------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        try:
            self.handle(self.parser.get_method(), self.url.split(b"?", 1)[0], b"".join(self.body))
        except Exception as error:  # a broken request must not kill the fake
            self.reply(
                _json_reply(
                    _json({"error": {"message": str(error), "type": "fake_error"}}), b"500 Internal Server Error"
                )
            )

    # -- routing -----------------------------------------------------------------

    def reply(self, data: bytes) -> None:
        transport = self.transport
        if transport is None:
            return
        transport.write(data)
        if not self.keep_alive:
            transport.close()

    def finish_stream(self) -> None:
        self.stream = None
        self.ticker = None
        if self.transport is not None:
            if self.keep_alive:
                self.transport.resume_reading()
            else:
                self.transport.close()

    def handle(self, method: bytes, path: bytes, body: bytes) -> None:
        server = self.server
        if path.startswith(b"/v1/v1/"):
            path = path[3:]
        if method == b"GET" and path == b"/v1/models":
            self.reply(server.models_reply)
            return
        if method != b"POST" or path not in (b"/v1/chat/completions", b"/v1/messages", b"/v1/messages/count_tokens"):
            self.reply(_json_reply(b'{"error":{"message":"not found","type":"not_found"}}', b"404 Not Found"))
            return
        request = _decode(body)
        prompt = max(len(body) // 4, 1)
        if path == b"/v1/messages/count_tokens":
            self.reply(_json_reply(b'{"input_tokens":%d}' % prompt))
            return
        limit = request.max_completion_tokens or request.max_tokens
        n = min(server.tokens, limit) if limit else server.tokens
        n = max(n, 1)
        canned = server.canned_for(request.model)
        openai = path == b"/v1/chat/completions"
        if not request.stream:
            self.reply(canned.oa_json(n, prompt) if openai else canned.an_json(n, prompt))
            return
        head = canned.oa_first if openai else canned.an_head(prompt)
        tail = canned.oa_tail(n, prompt) if openai else canned.an_tail(n)
        delay = server.delays.get(request.model[request.model.rfind("-") :], server.delay)
        transport = self.transport
        if transport is None:
            return
        if delay <= 0:
            transport.write(_SSE_HEAD + head + canned.run("oa" if openai else "an", n) + tail)
            if not self.keep_alive:
                transport.close()
            return
        transport.write(_SSE_HEAD + head)
        transport.pause_reading()  # one request at a time per connection
        self.stream = Stream(
            self, canned.oa_tokens if openai else canned.an_tokens, n, tail, asyncio.get_running_loop().time()
        )
        self.ticker = server.ticker(delay)
        self.ticker.add(self.stream)


async def serve(
    host: str, port: int, tokens: int, delay_ms: float, paced_delay_ms: float, slow_delay_ms: float
) -> None:
    loop = asyncio.get_running_loop()
    server = Server(tokens, delay_ms, paced_delay_ms, slow_delay_ms)
    listener = await loop.create_server(lambda: Conn(server), host, port, backlog=4096, reuse_address=True)
    bound = listener.sockets[0].getsockname()[1]
    print(f"ready {bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    listener.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000, help="0 picks a free port (printed)")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per reply (the request's max_tokens caps it)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="per-token delay of streams (0: write at once)")
    parser.add_argument("--paced-delay-ms", type=float, default=1.0, help="per-token delay for models named *-paced")
    parser.add_argument("--slow-delay-ms", type=float, default=1000.0, help="per-token delay for models named *-slow")
    args = parser.parse_args(argv)
    coro = serve(args.host, args.port, args.tokens, args.delay_ms, args.paced_delay_ms, args.slow_delay_ms)
    try:
        try:
            import uvloop
        except ImportError:
            asyncio.run(coro)
        else:
            uvloop.run(coro)
    except KeyboardInterrupt:
        pass
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
