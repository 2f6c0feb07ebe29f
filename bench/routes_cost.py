"""CPU per request of [[routes]] alone: 20 routes evaluated, none matching (every one is tried).

    python bench/routes_cost.py                  # both shapes, 20 routes
    python bench/routes_cost.py --routes 50 --requests 20000
    python bench/routes_cost.py --without-body-paths

The conditions are the cheap ones a route table is made of (model globs, headers, subagent,
images, server tools, tool counts, thinking effort, output format, max_tokens, stream, body
paths), read from what the core decoded of the body on each path (whole when every upstream
translates, its envelope otherwise). `input_tokens` and `fits` need the request's count, which is the cost of a
`count_tokens` (the upstream's tokenizer), not of evaluation: a second line adds one such
route, counted by a backend that answers at once. Issue 33 asks at most 20 µs for 20 routes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from dragoman.calls.types import Call, Completed, Outcome, Route, UpstreamModel
from dragoman.core.capabilities import ModelCaps
from dragoman.core.config_load import from_dict
from dragoman.protocol.anthropic import MESSAGES_REQUEST
from dragoman.routes.table import Routes

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes  # noqa: E402

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
    """A backend that counts at once."""

    name, path = "bench", "translate"

    async def count_tokens(self, call: Call, route: Any) -> Completed:
        return Completed(b'{"input_tokens": 1234}')

    async def messages(self, call: Call, route: Any) -> Completed:
        raise NotImplementedError

    async def list_models(self) -> list[UpstreamModel]:
        return []

    async def close(self) -> None:
        pass


def table(count: int, counted: bool) -> Routes:
    whens = [CHEAP[i % len(CHEAP)] for i in range(count - counted)]
    if counted:
        whens.append({"input_tokens": {"gt": 500_000}})
    models = [{"name": "bench-model", "upstream": "u", "context_window": 1_000_000, "vision": True}]
    routes = [{"name": f"r{i}", "when": when, "model": "bench-model"} for i, when in enumerate(whens)]
    config = from_dict({"upstreams": {"u": {"url": "http://127.0.0.1:1/v1"}}, "models": models, "routes": routes})
    route = Route(Instant(), "u", "bench-model", ModelCaps(), 1_000_000)  # type: ignore[arg-type]

    async def resolve(name: str) -> Route:
        return route

    return Routes(config, resolve)


async def cost(shape: str, count: int, counted: bool, requests: int, path: str) -> float:
    """µs of CPU per request to pick its route (best of 3 rounds), given what the core decoded of
    the body on `path` (translate: the whole request; passthrough: its envelope)."""
    routes = table(count, counted)
    body = shapes.anthropic_body(shape, model="bench-model", max_tokens=100, stream=True)
    read = (MESSAGES_REQUEST if path == "translate" else routes.envelope).decode(body)  # as the pipeline does
    headers = {"x-claude-code-session-id": "s", "user-agent": "claude-cli/2.1.332"}
    kept = getattr(read, "__dict__", {})
    best = float("inf")
    for _round in range(3):
        started = time.process_time()
        for _ in range(requests):
            kept.clear()  # each request reads its messages once (for the passthrough backend to reuse)
            outcome = Outcome(request_id="r", endpoint="messages")
            await routes.route(body, headers, read, "messages", outcome)
        best = min(best, time.process_time() - started)
    return best / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routes", type=int, default=20)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--without-body-paths", action="store_true", help="leave out the body.<path> condition")
    args = parser.parse_args()
    if args.without_body_paths:  # a body path reads the body once more, whatever the core decoded
        CHEAP[:] = [when for when in CHEAP if "body" not in when]
    for path in ("translate", "passthrough"):
        for shape in shapes.SHAPES:
            size = len(shapes.anthropic_body(shape, model="bench-model", max_tokens=100, stream=True))
            plain = asyncio.run(cost(shape, args.routes, False, args.requests, path))
            counted = asyncio.run(cost(shape, args.routes, True, args.requests, path))
            print(f"{path:11} {shape:12} {size:>6} B  {args.routes} routes: {plain:6.1f} µs   "
                  f"with an input_tokens route: {counted:6.1f} µs")  # fmt: skip


if __name__ == "__main__":
    main()
