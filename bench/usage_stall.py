"""How long one flush of usage records to PostgreSQL holds the event loop.

    python bench/usage_stall.py [--url postgresql://postgres@127.0.0.1:5432/test] [--records 2500] [--keys 50]

A ticker on the loop wakes every 0.1 ms and notes the longest gap between its wakes while
`PostgresStore.write` stores a batch (the records of a second at 2,500 requests a second):
that gap is what a request arriving then waits. Also the loop's own CPU during the write
(the thread's, not the server's). Best of `--rounds` batches, in a schema of its own,
dropped afterwards. Gaps are wall time: on a loaded machine they carry its noise.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
import urllib.parse

import asyncpg

from dragoman.usage.postgres import PostgresStore
from dragoman.usage.records import UsageRecord


def batch(count: int, keys: int = 50) -> list[UsageRecord]:
    now = time.time()
    return [UsageRecord(at=now - i * 0.0004, request_id=f"req_{secrets.token_hex(12)}", endpoint="messages",
                        key_id=f"key_{i % keys}", tenant=f"team-{i % 5}", model="claude-sonnet-4-5",
                        upstream_model="qwen3-coder", upstream="default", replica="http://10.0.0.1:8000",
                        input_tokens=1200 + i, cache_read_tokens=800, output_tokens=300, status=200,
                        error_type=None, disconnected=False, duration=0.8, ttft=0.12)
            for i in range(count)]  # fmt: skip


async def longest_gap(work: asyncio.Future[None]) -> tuple[float, float]:
    """The longest gap (s) between the ticker's wakes until `work` is done: in wall time, and
    in the loop thread's CPU time (what the loop itself did in that gap: not the machine's noise)."""
    longest = longest_cpu = 0.0
    last, last_cpu = time.perf_counter(), time.thread_time()
    while not work.done():
        await asyncio.sleep(0.0001)
        now, cpu = time.perf_counter(), time.thread_time()
        longest, longest_cpu = max(longest, now - last), max(longest_cpu, cpu - last_cpu)
        last, last_cpu = now, cpu
    return longest, longest_cpu


async def main(url: str, records: int, rounds: int, keys: int) -> None:
    schema = f"bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(url)
    await admin.execute(f"CREATE SCHEMA {schema}")
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.urlencode({"options": f"-c search_path={schema}"})
    store = PostgresStore(urllib.parse.urlunsplit(parts._replace(query=query)))
    try:
        await store.open()
        await store.write(batch(10))  # warm: statements prepared
        gaps, slices, cpus = [], [], []
        for _ in range(rounds):
            records_ = batch(records, keys)
            started = time.thread_time()
            task = asyncio.ensure_future(store.write(records_))
            gap, cpu_slice = await longest_gap(task)
            await task
            gaps.append(gap)
            slices.append(cpu_slice)
            cpus.append(time.thread_time() - started)
        quiet = min(
            [(await longest_gap(idle))[0] for idle in (asyncio.ensure_future(asyncio.sleep(0.05)) for _ in range(3))]
        )
        print(f"{records} records of {keys} keys a flush, best of {rounds}: the loop's longest stretch of CPU {min(slices) * 1e3:.2f} ms "
              f"(median {sorted(slices)[rounds // 2] * 1e3:.2f}); longest wall-clock gap {min(gaps) * 1e3:.2f} ms "
              f"(median {sorted(gaps)[rounds // 2] * 1e3:.2f}; {quiet * 1e3:.2f} with no write); the loop thread's CPU "
              f"{min(cpus) * 1e3:.2f} ms ({min(cpus) / records * 1e6:.2f} µs a record)")  # fmt: skip
    finally:
        await store.close()
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--records", type=int, default=2500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--keys", type=int, default=50, help="keys the records are spread over (rollup rows)")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.records, args.rounds, args.keys))
