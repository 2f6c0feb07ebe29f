"""The real Claude Code CLI (`claude -p`) through dragoman, against a scripted upstream.

The fake upstream answers from the request it gets (`ScriptedModel`): while the
prompt's task is not done it streams the next planned tool call the way vLLM does (id
and name first, then the arguments in pieces that split JSON tokens), after the last
tool result it answers with text, and a structured-output request (the session title)
gets JSON. A recording wrapper around the gateway's ASGI app keeps every HTTP exchange
the CLI made, so a failure shows what was sent and what came back.

The CLI comes from `scripts/setup-claude-code` (pinned, cached outside the repo). When
it is missing these tests fail; `DRAGOMAN_SKIP_CLAUDE_CODE=1` skips them instead.
`DRAGOMAN_CLAUDE_CODE_RECORD=DIR` writes each run's exchanges (key headers redacted) and
the upstream's requests to DIR as JSON Lines: the material the synthetic fixtures in
tests/fixtures/claude_code/ were modelled on.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dragoman.core.config_load import from_dict
from tests.support.claude_cli import claude_binary
from tests.support.fakes import FakeUpstream, Reply, chunk, completion, text_stream, usage_chunk, web_search_call
from tests.support.search_fakes import DEFAULT_RESULTS, FakeSearch
from tests.support.servers import GatewayServer, config_for, make_config

pytestmark = pytest.mark.claude_code

CLI_TIMEOUT = 120
PROMPT = "Create a file named greeting.txt in the current directory containing the words: hello from dragoman"
FILE_NAME = "greeting.txt"
FILE_CONTENT = "hello from dragoman\n"
FINAL_TEXT = "Done: greeting.txt now says hello from dragoman."
REASONING = ("The user wants one small file. ", "Writing it with the file tool.")
TITLE = "Greeting file via dragoman"
SMALL_MODEL = "claude-haiku-4-5-20251001"
SEARCH_QUERY = "dragoman gateway"
SECRET_HEADERS = {"x-api-key", "authorization"}
BASE_ENV = {
    "ANTHROPIC_API_KEY": "test",
    "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK": "1",  # broken streaming must fail, not fall back
    "DISABLE_AUTOUPDATER": "1",
    "LANG": "C.UTF-8",
}
QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


# -- recording the CLI's exchanges at the gateway -----------------------------------


@dataclass
class Exchange:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    status: int | None = None
    response: bytearray = field(default_factory=bytearray)

    def json(self) -> dict[str, Any]:
        return json.loads(self.body) if self.method == "POST" and self.body else {}

    def events(self) -> list[str]:
        """The `event:` names of an SSE response."""
        return [
            line[6:].strip()
            for line in self.response.decode(errors="replace").splitlines()
            if line.startswith("event:")
        ]

    @property
    def prewarm(self) -> bool:
        """The CLI's fire-and-forget connection warm-up: no key, any status will do."""
        return self.method == "HEAD" and not SECRET_HEADERS & self.headers.keys()

    def summary(self) -> str:
        head = f"{self.method} {self.path}{'?' + self.query if self.query else ''} -> {self.status}"
        if self.status is None or self.status >= 400:
            head += f" {self.response[:400].decode(errors='replace')}"
        return head

    def record(self) -> dict[str, Any]:
        headers = {k: ("<redacted>" if k in SECRET_HEADERS else v) for k, v in self.headers.items()}
        return {"method": self.method, "path": self.path, "query": self.query, "headers": headers, "body_bytes": len(self.body),
                "body": self.json() or None, "status": self.status, "events": self.events()}  # fmt: skip


class Recorder:
    """ASGI wrapper that keeps each HTTP request and its response, as the client saw them."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        exchange = Exchange(scope["method"], scope["path"], scope["query_string"].decode(), headers)
        self.exchanges.append(exchange)

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                exchange.body += message.get("body", b"")
            return message

        async def recording_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            elif message["type"] == "http.response.body":
                exchange.response += message.get("body", b"")
            await send(message)

        await self.app(scope, recording_receive, recording_send)


class RecordingGateway(GatewayServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recorder = Recorder(self.app)
        self.server.config.app = self.recorder  # uvicorn loads the app when it starts

    def cli_exchanges(self) -> list[Exchange]:
        return [e for e in self.recorder.exchanges if e.path != "/metrics"]

    def requests_total(self) -> list[tuple[dict[str, str], float]]:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        return [
            (sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "dragoman_requests_total"
        ]


# -- the scripted model -----------------------------------------------------------


def vllm_tool_call_stream(
    call_id: str, name: str, arguments: dict[str, Any], reasoning: tuple[str, ...] = ()
) -> list[Any]:
    """vLLM's shape: optional reasoning deltas, then id, type and name in the first
    tool-call delta, then the arguments in 7-byte pieces that split JSON tokens, then
    finish_reason, then a usage-only chunk."""
    encoded = json.dumps(arguments)
    chunks: list[Any] = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": piece}) for piece in reasoning]
    chunks.append(
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
                ]
            }
        )
    )
    for start in range(0, len(encoded), 7):
        chunks.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": encoded[start : start + 7]}}]}))
    chunks += [chunk({}, "tool_calls"), usage_chunk(prompt=2000, completion_tokens=40)]
    return chunks


def sample_of(schema: dict[str, Any]) -> Any:
    """A value for a small JSON schema such as the session title's."""
    kind = schema.get("type")
    if kind == "object":
        return {
            name: TITLE if name == "title" else sample_of(sub) for name, sub in schema.get("properties", {}).items()
        }
    return {"array": [], "integer": 1, "number": 1, "boolean": True}.get(str(kind), "text")


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


class ScriptedModel:
    """Answers the gateway's chat requests from what they contain. A request that holds
    the prompt and n tool results gets the n-th step of `plan` as a tool call; after the
    plan, the final text. "write" is `Write`, or `Bash` where no `Write` is offered
    (`claude --bare`)."""

    def __init__(self, workdir: Path, plan: tuple[str, ...] = ("write",)) -> None:
        self.workdir = workdir
        self.plan = plan
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.offered: list[set[str]] = []  # tool names of each main-loop request
        self.side_requests: list[list[dict[str, Any]]] = []  # the web search side requests' messages

    def _call(self, step: str, tools: set[str]) -> tuple[str, dict[str, Any]]:
        path = str(self.workdir / FILE_NAME)
        if step == "write" and "Write" in tools:
            return "Write", {"file_path": path, "content": FILE_CONTENT}
        if step == "write":
            command = f"printf '%s\\n' {shlex.quote(FILE_CONTENT.strip())} > {shlex.quote(path)}"
            return "Bash", {"command": command, "description": "Write greeting.txt"}
        if step == "ToolSearch":
            return "ToolSearch", {"query": "select:WebFetch"}
        if step == "WebSearch":  # loaded first where it is deferred
            if "WebSearch" in tools:
                return "WebSearch", {"query": SEARCH_QUERY}
            return "ToolSearch", {"query": "select:WebSearch"}
        raise AssertionError(f"no such step {step!r}")

    def __call__(self, body: dict[str, Any]) -> Reply:
        stream = bool(body.get("stream"))
        messages = body.get("messages", [])
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        format_ = body.get("response_format")
        done = sum(m.get("role") == "tool" for m in messages)
        main_loop = bool(tools) and any(m.get("role") == "user" and PROMPT in text_of(m) for m in messages)
        if main_loop:
            self.offered.append(tools)
        if tools == {"web_search"}:  # Claude Code's search side request, run by the gateway
            return self._search_side_request(messages)
        if main_loop and any(name == "WebSearch" for name, _ in self.calls) and done:
            # after the search: the answer quotes what Claude Code handed back (the links it read)
            text = "Search said: " + text_of(messages[-1])
            return Reply(chunks=text_stream(text)) if stream else Reply(body=completion(text))
        if format_ and format_.get("type") == "json_schema":
            text = json.dumps(sample_of(format_["json_schema"]["schema"]))
        elif main_loop and done < len(self.plan):
            name, arguments = call = self._call(self.plan[done], tools)
            self.calls.append(call)
            call_id = f"chatcmpl-tool-{len(self.calls):04x}e1f2a3b4c5d6"
            if stream:
                return Reply(chunks=vllm_tool_call_stream(call_id, name, arguments, REASONING))
            tool_call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            return Reply(body=completion(None, finish="tool_calls", tool_calls=[tool_call]))
        else:
            text = FINAL_TEXT if main_loop else "OK"
        if stream:
            middle = max(1, len(text) // 2)
            return Reply(chunks=text_stream(text[:middle], text[middle:]))
        return Reply(body=completion(text))

    def _search_side_request(self, messages: list[dict[str, Any]]) -> Reply:
        """`Perform a web search for the query: ...`: the gateway's web_search function called
        once, then a short summary."""
        self.side_requests.append(messages)
        if not any(m.get("role") == "tool" for m in messages):
            return web_search_call(SEARCH_QUERY, "chatcmpl-tool-search")
        return Reply(chunks=text_stream("Here are ", "the results."))


# -- running the CLI --------------------------------------------------------------


@dataclass
class Harness:
    binary: Path
    workdir: Path
    home: Path
    upstream: FakeUpstream
    request: pytest.FixtureRequest
    gateway: RecordingGateway | None = None

    def start_gateway(self, config: Any, plan: tuple[str, ...] = ("write",)) -> ScriptedModel:
        """Script the upstream with `plan` and start the gateway; the model records its calls."""
        model = ScriptedModel(self.workdir, plan)
        self.upstream.responder = model
        self.gateway = RecordingGateway(config)
        self.gateway.start()
        return model

    def run(self, env: dict[str, str], *args: str, stdin: list[dict[str, Any]] | None = None) -> Run:
        """`claude -p PROMPT --output-format json`, or with `stdin` the SDK's stream-json
        protocol (those messages in, one JSON message per output line)."""
        assert self.gateway is not None
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "ANTHROPIC_BASE_URL": self.gateway.url,
            **BASE_ENV,
            **env,
        }
        if stdin is None:
            command = [str(self.binary), "-p", PROMPT, "--output-format", "json"]
        else:
            command = [
                str(self.binary),
                "-p",
                "--input-format",
                "stream-json",
                "--output-format",
                "stream-json",
                "--verbose",
            ]
        command += ["--permission-mode", "acceptEdits", *args]
        feed = "".join(json.dumps(line) + "\n" for line in stdin or ())
        started = time.monotonic()
        try:
            result = subprocess.run(
                command, cwd=self.workdir, env=env, input=feed, capture_output=True, text=True, timeout=CLI_TIMEOUT
            )
        except subprocess.TimeoutExpired as timeout:  # subprocess.run has killed the CLI
            exchanges = "\n".join(f"  {e.summary()}" for e in self.gateway.cli_exchanges())
            pytest.fail(
                f"claude -p did not finish in {CLI_TIMEOUT}s; exchanges so far:\n{exchanges}\nstdout: {timeout.stdout!r}"
            )
        run = Run(result, time.monotonic() - started, self)
        self._save_recording()
        return run

    def _save_recording(self) -> None:
        directory = os.environ.get("DRAGOMAN_CLAUDE_CODE_RECORD")
        if not directory or self.gateway is None:
            return
        Path(directory).mkdir(parents=True, exist_ok=True)
        name = self.request.node.name.replace("[", "-").replace("]", "")
        with open(Path(directory) / f"{name}.jsonl", "w") as out:
            out.writelines(json.dumps(e.record()) + "\n" for e in self.gateway.cli_exchanges())
        with open(Path(directory) / f"{name}.upstream.jsonl", "w") as out:
            out.writelines(json.dumps(body) + "\n" for body in self.upstream.requests)


@dataclass
class Run:
    process: subprocess.CompletedProcess[str]
    seconds: float
    harness: Harness

    @property
    def messages(self) -> list[dict[str, Any]]:
        decoded = []
        for line in self.process.stdout.splitlines():
            try:
                decoded.append(json.loads(line))
            except ValueError:
                pass
        return decoded

    @property
    def results(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == "result"]

    @property
    def result(self) -> dict[str, Any]:
        """The result of the prompt's task: the first one."""
        return (self.results or [{}])[0]

    @property
    def exchanges(self) -> list[Exchange]:
        assert self.harness.gateway is not None
        return self.harness.gateway.cli_exchanges()

    def explain(self) -> str:
        lines = [f"exit {self.process.returncode} after {self.seconds:.1f}s; exchanges at the gateway:"]
        lines += [f"  {e.summary()}" for e in self.exchanges]
        lines += [f"stdout: {self.process.stdout[-1500:]}", f"stderr: {self.process.stderr[-1500:]}"]
        return "\n".join(lines)

    def check(self, *, min_requests: int) -> None:
        """The task ran, the final text came back, and nothing the CLI asked for got an error."""
        why = self.explain()
        assert self.process.returncode == 0, why
        assert self.result.get("is_error") is False, why
        written = self.harness.workdir / FILE_NAME
        assert written.is_file(), f"the tool did not run\n{why}"
        assert written.read_text() == FILE_CONTENT, why
        assert self.result.get("result", "").strip() == FINAL_TEXT, why

        failed = [e.summary() for e in self.exchanges if not e.prewarm and (e.status is None or e.status >= 400)]
        assert not failed, why
        assert self.harness.gateway is not None
        samples = self.harness.gateway.requests_total()
        assert [labels for labels, value in samples if value and labels["status"] != "200"] == [], samples
        assert sum(value for _, value in samples) >= min_requests, samples
        for exchange in self.exchanges:  # every stream the CLI read was a whole Anthropic stream
            if exchange.json().get("stream"):
                events = exchange.events()
                assert events[:1] == ["message_start"] and events[-1:] == ["message_stop"], (exchange.summary(), events)

    def main_loop(self) -> list[dict[str, Any]]:
        return [body for e in self.exchanges if e.path == "/v1/messages" and (body := e.json()).get("tools")]


@pytest.fixture
def harness(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    binary = claude_binary()
    (tmp_path / "work").mkdir()
    (tmp_path / "home").mkdir()
    upstream = FakeUpstream().start()
    state = Harness(binary, tmp_path / "work", tmp_path / "home", upstream, request)
    try:
        yield state
    finally:
        if state.gateway is not None:
            state.gateway.stop()
        upstream.stop()


def reasoning_config(url: str) -> Any:
    """Every claude-* name served by one reasoning model, so thinking round-trips."""
    return make_config(
        url, models=[{"name": "test-model", "upstream": "default", "reasoning": True, "aliases": ["claude-*"]}]
    )


def echoed_tool_use(body: dict[str, Any]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Block types of the last assistant turn, its tool_use, and the tool_result answering it."""
    assistant = [m for m in body["messages"] if m["role"] == "assistant"][-1]
    tool_use = next(b for b in assistant["content"] if b["type"] == "tool_use")
    result = next(b for b in body["messages"][-1]["content"] if b["type"] == "tool_result")
    return [b["type"] for b in assistant["content"]], tool_use, result


# -- the tests --------------------------------------------------------------------


@pytest.mark.parametrize("bare", [False, True], ids=["default", "bare"])
def test_claude_code_writes_a_file_through_the_gateway(harness: Harness, bare: bool) -> None:
    model = harness.start_gateway(reasoning_config(harness.upstream.url))
    run = harness.run(QUIET, *(["--bare"] if bare else []))
    run.check(min_requests=2)

    assert [name for name, _ in model.calls] == (["Bash"] if bare else ["Write"]), run.explain()
    turns = run.main_loop()
    assert len(turns) == 2, run.explain()
    # the streamed tool call came back as Claude Code's history: thinking, then tool_use, paired with its result
    types, tool_use, result = echoed_tool_use(turns[-1])
    assert types == ["thinking", "tool_use"], types
    assert tool_use["input"] == model.calls[0][1]
    assert result["tool_use_id"] == tool_use["id"]
    # and reached the upstream as an OpenAI tool call and tool message
    last = harness.upstream.requests[-1]["messages"]
    assert [m["role"] for m in last[-2:]] == ["assistant", "tool"]
    assert last[-1]["tool_call_id"] == last[-2]["tool_calls"][0]["id"] == tool_use["id"]


def test_claude_code_side_requests_get_no_errors(harness: Harness) -> None:
    """Non-essential traffic allowed, model discovery on, and through the SDK protocol:
    a session title (structured output on the small model), the task, then `/context`
    (a burst of count_tokens calls)."""
    harness.start_gateway(config_for(harness.upstream.url, default_model="test-model"))
    env = {
        "ANTHROPIC_SMALL_FAST_MODEL": SMALL_MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": SMALL_MODEL,
        "CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY": "1",
    }
    title = {
        "type": "control_request",
        "request_id": "title-1",
        "request": {"subtype": "generate_session_title", "description": PROMPT, "persist": False},
    }
    run = harness.run(env, stdin=[title, {"type": "user", "message": {"role": "user", "content": PROMPT}},
                                  {"type": "user", "message": {"role": "user", "content": "/context"}}])  # fmt: skip
    run.check(min_requests=4)

    answer = next(m for m in run.messages if m.get("type") == "control_response")["response"]
    assert answer.get("response") == {"title": TITLE}, answer
    titles = [e.json() for e in run.exchanges if "format" in (e.json().get("output_config") or {})]
    assert [body["model"] for body in titles] == [SMALL_MODEL], run.explain()
    assert titles[0]["tools"] == []
    upstream_title = next(body for body in harness.upstream.requests if body.get("response_format"))
    assert upstream_title["response_format"]["json_schema"]["schema"] == titles[0]["output_config"]["format"]["schema"]
    assert "tools" not in upstream_title
    context = run.results[-1]
    assert context.get("local_command") == "context" and context.get("is_error") is not True, context
    paths = [e.path for e in run.exchanges]
    assert paths.count("/v1/messages/count_tokens") >= 1, run.explain()
    assert "/v1/models" in paths, run.explain()


def test_claude_code_loads_a_deferred_tool_through_tool_search(harness: Harness) -> None:
    """Claude Code offers most tools deferred (`defer_loading`) behind its ToolSearch
    tool; the search's result carries `tool_reference` blocks naming the tools to load."""
    model = harness.start_gateway(reasoning_config(harness.upstream.url), plan=("ToolSearch", "write"))
    run = harness.run(QUIET)
    run.check(min_requests=3)
    assert [name for name, _ in model.calls] == ["ToolSearch", "Write"], run.explain()
    assert "WebFetch" in model.offered[1], model.offered


def test_claude_code_searches_the_web_through_the_gateway(harness: Harness) -> None:
    """WebSearch: Claude Code's side request (only the web_search server tool) is run by the
    gateway against a fake SearXNG; Claude Code reads the result blocks and hands their links
    to its model, whose answer quotes them."""
    search = FakeSearch().start()
    try:
        data = {"upstreams": {"default": {"url": harness.upstream.url, "max_retries": 0}},
                "models": [{"name": "test-model", "upstream": "default", "reasoning": True, "aliases": ["claude-*"]}],
                "web_search": {"provider": "searxng", "url": search.url}}  # fmt: skip
        model = harness.start_gateway(from_dict(data), plan=("WebSearch", "WebSearch"))
        run = harness.run(QUIET, "--allowedTools", "WebSearch")
    finally:
        search.stop()
    why = run.explain()
    assert run.process.returncode == 0 and run.result.get("is_error") is False, why
    assert model.side_requests and search.queries, why
    assert SEARCH_QUERY in search.queries[0]["q"], search.queries
    side = [
        e
        for e in run.exchanges
        if any(t.get("type", "").startswith("web_search_") for t in e.json().get("tools") or [])
    ]
    assert side and all(e.status == 200 for e in side), why
    output = run.result.get("result", "")
    assert "Did 0 searches" not in output, why
    assert DEFAULT_RESULTS[0].url in output or DEFAULT_RESULTS[0].title in output, why
