"""CPU per request of [limits] alone, in a loop: admit, the reply's headers, settle.

    python bench/limits_cost.py                 # in-process buckets
    python bench/limits_cost.py --redis URL     # buckets in Redis (one round trip each)
    python bench/limits_cost.py --app           # the gateway's ASGI app, limits on against off

The whole-gateway cells (`bench/run.py`, targets limits-local and limits-redis) carry
the noise of a shared machine; this isolates the limits' own cost. Process CPU time
per request, over `--requests` requests, for each shape's body as sent.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from dragoman.calls.types import Call, Completed, Outcome, UpstreamModel
from dragoman.core.config_load import from_dict
from dragoman.limits import gate
from dragoman.protocol.anthropic import MESSAGES_REQUEST

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes  # noqa: E402

LIMITS: dict[str, Any] = {
    "requests_per_minute": 10**9,
    "input_tokens_per_minute": 10**12,
    "output_tokens_per_minute": 10**12,
}


async def cost(shape: str, requests: int, redis_url: str | None, concurrency: int = 1) -> float:
    """µs of CPU per request (admit + headers + settle) for `shape`, decoded whole as the translating path has it;
    `concurrency` requests at once (their Redis calls then share round trips). Best of 3 rounds."""
    table = dict(LIMITS)
    if redis_url:
        table |= {"redis_url": redis_url, "redis_prefix": f"dragoman-bench:{uuid.uuid4().hex[:8]}:"}
    limits = gate.build(from_dict({"limits": table}).limits)
    assert limits is not None
    body = shapes.anthropic_body(shape, model="bench-model", max_tokens=100, stream=False)
    request = MESSAGES_REQUEST.decode(body)

    async def one_by_one(count: int) -> None:
        for _ in range(count):
            outcome = Outcome(request_id="r", endpoint="messages")
            call = Call(body=body, model="bench-model", upstream_model="bench-model", headers={}, request_id="r",
                        outcome=outcome, request=request)  # fmt: skip
            admission = await limits.admit(None, None, call, "messages")
            admission.headers()
            outcome.status, outcome.input_tokens, outcome.output_tokens = 200, 10, 90
            admission.settle(outcome)

    best = float("inf")
    try:
        for _round in range(4):  # the first warms up (plans, scripts loaded, connections)
            started = time.process_time()
            await asyncio.gather(*(one_by_one(requests // concurrency) for _ in range(concurrency)))
            if _round:
                best = min(best, time.process_time() - started)
    finally:
        await limits.close()
    return best / requests * 1e6


class Instant:
    """A backend that answers at once: what is left is the gateway's own work."""

    name, path = "default", "translate"

    async def messages(self, call: Call, route: Any) -> Completed:
        assert call.outcome is not None
        call.outcome.input_tokens, call.outcome.output_tokens = 10, 90
        return Completed(body=b'{"id":"msg_1","type":"message"}')

    async def count_tokens(self, call: Call, route: Any) -> Completed:
        raise NotImplementedError

    async def list_models(self) -> list[UpstreamModel]:
        return [UpstreamModel("bench-model")]

    async def close(self) -> None:
        pass


async def app_cost(shape: str, limited: bool, requests: int, redis_url: str | None = None) -> float:
    """µs of CPU per POST /v1/messages through the ASGI app (no sockets but Redis's), best of 3 rounds."""
    from dragoman.server.app import create_app

    data: dict[str, Any] = {"upstreams": {"default": {"url": "http://127.0.0.1:1/v1"}},
                            "models": [{"name": "bench-model", "upstream": "default"}]}  # fmt: skip
    if limited:
        data["limits"] = dict(LIMITS)
        if redis_url:
            data["limits"] |= {"redis_url": redis_url, "redis_prefix": f"dragoman-bench:{uuid.uuid4().hex[:8]}:"}
    app = create_app(from_dict(data), backends={"default": Instant()})  # type: ignore[dict-item]
    await app.gateway.discover_all(app.gateway.backends)
    scope, receive = asgi_post(shapes.anthropic_body(shape, model="bench-model", max_tokens=100, stream=False))

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"status {message['status']}")

    best = float("inf")
    for _round in range(3):
        started = time.process_time()
        for _ in range(requests):
            await app(dict(scope, state={}), receive, send)
        best = min(best, (time.process_time() - started) / requests * 1e6)
    await app.gateway.close()
    return best


def asgi_post(body: bytes) -> tuple[dict[str, Any], Any]:
    """The scope and `receive` of a POST /v1/messages carrying `body`, for calling the app directly."""
    scope = {"type": "http", "method": "POST", "path": "/v1/messages", "query_string": b"", "http_version": "1.1",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "scheme": "http", "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2), "root_path": "", "extensions": {}}  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return scope, receive


def run(main: Any) -> Any:
    """On uvloop where it is installed, as the gateway runs."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--redis", metavar="URL", help="buckets in this Redis (default: in-process)")
    parser.add_argument(
        "--app", action="store_true", help="the whole ASGI app, limits on against off (in-process, or --redis)"
    )
    parser.add_argument("--concurrency", type=int, default=1, help="requests at once (default 1)")
    args = parser.parse_args()
    if args.app:
        for shape in shapes.SHAPES:
            off, on = (run(app_cost(shape, limited, args.requests // 5, args.redis)) for limited in (False, True))
            where = "app, redis" if args.redis else "app"
            print(f"{shape:12} {where:10} {off:8.1f} µs without limits, {on:8.1f} with: {on - off:+.1f} µs per request")
        return
    for shape in shapes.SHAPES:
        count = args.requests if not args.redis else args.requests // 10
        figure = run(cost(shape, count, args.redis, args.concurrency))
        print(
            f"{shape:12} {'redis' if args.redis else 'in-process':10} c={args.concurrency:<3} {figure:8.1f} µs CPU per request"
        )


if __name__ == "__main__":
    main()
