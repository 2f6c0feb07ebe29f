"""CPU per request of [limits] alone, in a loop: admit, the reply's headers, settle.

    python bench/limits_cost.py                 # in-process buckets
    python bench/limits_cost.py --redis URL     # buckets in Redis (one round trip each)

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

from dragoman.core.config import from_dict
from dragoman.core.types import Call, Outcome
from dragoman.limits import gate
from dragoman.protocol.anthropic import MESSAGES_REQUEST

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shapes  # noqa: E402

LIMITS: dict[str, Any] = {
    "requests_per_minute": 10**9,
    "input_tokens_per_minute": 10**12,
    "output_tokens_per_minute": 10**12,
}


async def cost(shape: str, requests: int, redis_url: str | None) -> float:
    """µs of CPU per request (admit + headers + settle) for `shape`, decoded whole as the translating path has it."""
    table = dict(LIMITS)
    if redis_url:
        table |= {"redis_url": redis_url, "redis_prefix": f"dragoman-bench:{uuid.uuid4().hex[:8]}:"}
    limits = gate.build(from_dict({"limits": table}).limits)
    assert limits is not None
    body = shapes.anthropic_body(shape, model="bench-model", max_tokens=100, stream=False)
    request = MESSAGES_REQUEST.decode(body)
    try:
        for _round in range(2):  # the first warms up (plans, scripts loaded, connections)
            started = time.process_time()
            for _ in range(requests):
                outcome = Outcome(request_id="r", endpoint="messages")
                call = Call(body=body, model="bench-model", upstream_model="bench-model", headers={}, request_id="r",
                            outcome=outcome, request=request)  # fmt: skip
                admission = await limits.admit(None, None, call, "messages")
                admission.headers()
                outcome.status, outcome.input_tokens, outcome.output_tokens = 200, 10, 90
                admission.settle(outcome)
            spent = time.process_time() - started
    finally:
        await limits.store.close()
    return spent / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--redis", metavar="URL", help="buckets in this Redis (default: in-process)")
    args = parser.parse_args()
    for shape in shapes.SHAPES:
        figure = asyncio.run(cost(shape, args.requests if not args.redis else args.requests // 10, args.redis))
        print(f"{shape:12} {'redis' if args.redis else 'in-process':10} {figure:8.1f} µs CPU per request")


if __name__ == "__main__":
    main()
