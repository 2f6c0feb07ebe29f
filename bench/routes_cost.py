"""CPU per request of [[routes]] alone: 20 routes evaluated, none matching (every one is tried).

    python bench/routes_cost.py                  # both shapes, 20 routes
    python bench/routes_cost.py --routes 50 --requests 20000
    python bench/routes_cost.py --without-body-paths

The conditions are the cheap ones a route table is made of (model globs, headers, subagent,
images, server tools, tool counts, thinking effort, output format, max_tokens, stream, body
paths), read from what the core decoded of the body on each path (whole when every upstream
translates, its envelope otherwise). `input_tokens` and `fits` need the request's count, which is the cost of a
`count_tokens` (the upstream's tokenizer), not of evaluation: a second line adds one such
route, counted by a backend that answers at once (passed through, its body spliced from the
envelope's parts, as a passthrough upstream's count is). Issue 33 asks at most 20 µs for 20 routes.

A passed-through body's tools and system prompt are read once per distinct bytes (`routes.memo`):
the `unseen` line empties the memos before each request. Claude Code's tools hold nothing of
its session (the working directory and date are in the system prompt), so a process sees new
tools once per Claude Code version and set of MCP servers, not once per session. A table
that asks their facts and needs none of their bytes has its envelope read them in its own pass
(`routes.shape.routed_envelope`): what the table's envelope costs more than the plain one a
gateway without routes reads is counted in, on every passed-through line.

Passed through, `images` reads the messages' blocks, which the URL-image check of the
passthrough backend then reuses (`protocol.blocks`): `net` is the cost less that read, which
every passed-through request pays, routed or not. The endpoint's `Outcome` is made untimed, and
the headers are Starlette's, as the endpoint hands them on.

With a count, `call` is the count's own call, timed alone: its body spliced, the `Call` made,
the backend called and its answer read. A real upstream's count is a round trip over HTTP on
top; `evaluation` is the line less that call: what evaluating the routes costs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from starlette.datastructures import Headers

from dragoman.backends.images import may_have_url_images
from dragoman.calls.types import Call, Completed, Outcome, Route, UpstreamModel
from dragoman.core.capabilities import ModelCaps
from dragoman.core.config_load import from_dict
from dragoman.protocol.anthropic import ENVELOPE, MESSAGES_REQUEST
from dragoman.routes.memo import Memo
from dragoman.routes.shape import Shape
from dragoman.routes.table import Routes

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes  # noqa: E402

# What Claude Code sends, as the endpoint hands it on (Starlette's `Headers`: a lookup is a scan)
HEADERS = {"host": "gateway:8080", "accept": "application/json", "content-type": "application/json",
           "user-agent": "claude-cli/2.1.332 (external, cli)", "x-app": "cli", "anthropic-version": "2023-06-01",
           "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
           "anthropic-dangerous-direct-browser-access": "true", "authorization": "Bearer sk-dragoman-bench",
           "x-claude-code-session-id": "0f6e1c9a-bench", "x-stainless-arch": "x64", "x-stainless-lang": "js",
           "x-stainless-os": "Linux", "x-stainless-package-version": "0.60.0", "x-stainless-retry-count": "0",
           "x-stainless-runtime": "node", "x-stainless-runtime-version": "v22.17.0", "x-stainless-timeout": "600",
           "accept-encoding": "gzip, deflate, br, zstd", "content-length": "78647", "connection": "keep-alive"}  # fmt: skip

CHEAP: list[dict[str, Any]] = [
    {"model": "claude-haiku-*"},
    {"header": {"x-team": "red-*"}},
    {"subagent": True},
    {"images": True},
    {"server_tool": "web_search_*"},
    {"tools": 0, "output_format": "json_schema"},
    {"thinking": {"effort": ["max"]}},
    {"max_tokens": 1, "stream": False},
    {"body": {"metadata": {"user_id": {"glob": "ci-*"}}}},
    {"any": [{"tools": {"gt": 500}}, {"header.x-priority": True}]},
]


class Instant:
    """A backend that counts at once, on the bench's path (passed through: the count's body is
    spliced from the envelope's parts)."""

    name = "bench"

    def __init__(self, path: str = "translate") -> None:
        self.path = path

    async def count_tokens(self, call: Call, route: Any) -> Completed:
        return Completed(b'{"input_tokens": 1234}')

    async def messages(self, call: Call, route: Any) -> Completed:
        raise NotImplementedError

    async def list_models(self) -> list[UpstreamModel]:
        return []

    async def close(self) -> None:
        pass


def table(count: int, counted: bool, path: str = "translate") -> Routes:
    whens = [CHEAP[i % len(CHEAP)] for i in range(count - counted)]
    if counted:
        whens.append({"input_tokens": {"gt": 500_000}})
    models = [{"name": "bench-model", "upstream": "u", "context_window": 1_000_000, "vision": True}]
    routes = [{"name": f"r{i}", "when": when, "model": "bench-model"} for i, when in enumerate(whens)]
    config = from_dict({"upstreams": {"u": {"url": "http://127.0.0.1:1/v1"}}, "models": models, "routes": routes})
    route = Route(Instant(path), "u", "bench-model", ModelCaps(), 1_000_000)  # type: ignore[arg-type]

    async def resolve(name: str) -> Route:
        return route

    return Routes(config, resolve)


def request(routes: Routes, shape: str, path: str) -> tuple[bytes, Any, Headers]:
    """A request of `shape`: its body, what the core decodes of it on `path` (the whole request, or
    the table's envelope), and its headers as the endpoint hands them on."""
    body = shapes.anthropic_body(shape, model="bench-model", max_tokens=100, stream=True)
    read = (MESSAGES_REQUEST if path == "translate" else routes.envelope).decode(body)  # as the pipeline does
    return body, read, Headers(raw=[(k.encode("latin-1"), v.encode("latin-1")) for k, v in HEADERS.items()])


async def cost(shape: str, count: int, counted: bool, requests: int, path: str, unseen: bool = False) -> float:
    """µs of CPU per request to pick its route (best of 3 rounds), given what the core decoded of
    the body on `path` (translate: the whole request; passthrough: its envelope). `unseen`: the
    body's tools and system prompt are new to the table each time (its memos emptied)."""
    routes = table(count, counted, path)
    memos = [m for m in (routes._reader.tools, routes._reader.subagent) if isinstance(m, Memo)] if unseen else []
    body, read, headers = request(routes, shape, path)
    kept = getattr(read, "__dict__", {})
    best = float("inf")
    for _round in range(3):
        outcomes = [Outcome(request_id="r", endpoint="messages") for _ in range(requests)]  # the endpoint's, not timed
        started = time.process_time()
        for outcome in outcomes:
            kept.clear()  # each request reads its messages once (for the passthrough backend to reuse)
            for memo in memos:
                memo.clear()
            await routes.route(body, headers, read, "messages", outcome)
        best = min(best, time.process_time() - started)
    return best / requests * 1e6 + (0.0 if path == "translate" else extra_read(routes, body, requests))


async def count_call(shape_name: str, path: str, requests: int) -> float:
    """µs of CPU per request of the count's own call (`Routes._count`), the shape it reads made untimed."""
    routes = table(20, True, path)
    body, read, headers = request(routes, shape_name, path)
    route = await routes._resolve("bench-model")

    async def own() -> Route:
        return route

    best = float("inf")
    for _round in range(3):
        made = [Shape("bench-model", headers, body, read, routes._reader) for _ in range(requests)]
        started = time.process_time()
        for shape in made:
            await routes._count(shape, own, headers, "messages")
        best = min(best, time.process_time() - started)
    return best / requests * 1e6


def extra_read(routes: Routes, body: bytes, requests: int) -> float:
    """µs of CPU the table's envelope costs more than the plain one (best of 5 interleaved rounds each)."""
    best = {decoder: float("inf") for decoder in (routes.envelope, ENVELOPE)}
    for _round in range(5):
        for decoder in best:
            started = time.process_time()
            for _ in range(requests):
                decoder.decode(body)
            best[decoder] = min(best[decoder], time.process_time() - started)
    return (best[routes.envelope] - best[ENVELOPE]) / requests * 1e6


def shared(shape: str, requests: int, envelope: msgspec.json.Decoder[Any]) -> float:
    """µs of CPU per request the passthrough backend's URL-image check spends without routes."""
    body = shapes.anthropic_body(shape, model="bench-model", max_tokens=100, stream=True)
    read = envelope.decode(body)
    best = float("inf")
    for _round in range(3):
        started = time.process_time()
        for _ in range(requests):
            vars(read).clear()
            may_have_url_images(body, read)
        best = min(best, time.process_time() - started)
    return best / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routes", type=int, default=20)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--without-body-paths", action="store_true", help="leave out the body.<path> condition")
    parser.add_argument("--path", action="append", choices=("translate", "passthrough"), help="only this path")
    parser.add_argument("--shape", action="append", choices=shapes.SHAPES, help="only this request shape")
    args = parser.parse_args()
    if args.without_body_paths:  # a body path reads the body once more, whatever the core decoded
        CHEAP[:] = [when for when in CHEAP if "body" not in when]
    for path in args.path or ("translate", "passthrough"):
        for shape in args.shape or shapes.SHAPES:
            size = len(shapes.anthropic_body(shape, model="bench-model", max_tokens=100, stream=True))
            plain = asyncio.run(cost(shape, args.routes, False, args.requests, path))
            counted = asyncio.run(cost(shape, args.routes, True, args.requests, path))
            call = asyncio.run(count_call(shape, path, args.requests))
            line = f"{path:11} {shape:12} {size:>6} B  {args.routes} routes: {plain:6.1f} µs   "
            line += f"with an input_tokens route: {counted:6.1f} µs (call {call:.1f})"
            if path == "passthrough":
                paid = shared(shape, args.requests, table(1, False).envelope)
                line += f"   net of the URL-image check's read ({paid:.1f} µs): {plain - paid:6.1f} µs"
                line += f", with the count {counted - paid:6.1f}, evaluation {counted - paid - call:6.1f} µs"
            print(line)
            if path == "passthrough" and shape != "tiny":  # tools and system prompt not yet seen (memos emptied)
                plain = asyncio.run(cost(shape, args.routes, False, args.requests, path, unseen=True))
                counted = asyncio.run(cost(shape, args.routes, True, args.requests, path, unseen=True))
                line = f"{path:11} {shape + ' unseen':19} {args.routes} routes: {plain:6.1f} µs   "
                line += f"with an input_tokens route: {counted:6.1f} µs"
                line += f"   net: {plain - paid:6.1f} µs, {counted - paid:6.1f} µs"
                print(line + f", evaluation {counted - paid - call:6.1f} µs")


if __name__ == "__main__":
    main()
