"""Each replica's own load, read from its /metrics (dragoman.upstream.gauges): the figures of
vLLM, SGLang and llama-server in their own formats, and the reader that hands them to routing
in the background, quietly for a replica that publishes none."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dragoman.core.config import CacheRouting
from dragoman.upstream.gauges import LoadCollector, Reading, ReplicaLoads, parse
from dragoman.upstream.placement import Placement
from tests.support import backend_metrics
from tests.support.waiting import eventually_async

ROOTS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]


# -- what each server publishes --------------------------------------------------------------


def test_vllm_engines_add_up_their_requests_and_average_their_kv_cache() -> None:
    assert parse(backend_metrics.VLLM) == Reading(running=21.0, waiting=4.0, kv_usage=pytest.approx(0.83))


def test_a_vllm_before_0_9_is_read_by_its_old_kv_cache_name() -> None:
    assert parse(backend_metrics.VLLM_V0) == Reading(running=4.0, waiting=0.0, kv_usage=0.3125)


def test_sglang_ranks_that_repeat_the_queue_count_once_and_a_longer_name_is_another_metric() -> None:
    # tp_rank 1 repeats rank 0's figures; num_running_reqs_offline_batch is not num_running_reqs.
    assert parse(backend_metrics.SGLANG) == Reading(running=7.0, waiting=5.0, kv_usage=0.62)


def test_llama_server_publishes_slots_processing_and_requests_deferred_but_no_kv_cache() -> None:
    assert parse(backend_metrics.LLAMACPP) == Reading(running=4.0, waiting=2.0, kv_usage=None)
    assert parse(backend_metrics.LLAMACPP_OLD) == Reading(running=1.0, waiting=0.0, kv_usage=0.25)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<html><body>Not Found</body></html>",
        '{"error": "This server does not support metrics endpoint. Start it with `--metrics`"}',
        "# HELP process_cpu_seconds_total Total user and system CPU time\nprocess_cpu_seconds_total 12.5\n",
        'vllm:num_requests_running{engine="0"} not-a-number\nvllm:num_requests_waiting NaN\n',
    ],
)
def test_a_text_without_any_servers_load_figures_has_no_reading(text: str) -> None:
    assert parse(text) is None


def test_crlf_lines_timestamps_and_a_label_holding_a_brace_are_read() -> None:
    text = 'vllm:num_requests_running{model_name="a}b",engine="0"} 3 1712345678000\r\nvllm:num_requests_waiting 1\r\n'
    assert parse(text) == Reading(3.0, 1.0, None)


# -- the reader ------------------------------------------------------------------------------


class Replica:
    """A scripted /metrics: (status, body) by root, counting the reads."""

    def __init__(self, answers: dict[str, tuple[int, str] | Exception]) -> None:
        self.answers = answers
        self.reads = dict.fromkeys(answers, 0)

    async def __call__(self, root: str) -> tuple[int, bytes]:
        self.reads[root] += 1
        answer = self.answers[root]
        if isinstance(answer, Exception):
            raise answer
        status, text = answer
        return status, text.encode()


def test_a_reading_reaches_routing_and_is_believed_for_three_intervals() -> None:
    now = [100.0]
    place = Placement(ROOTS, "least_loaded", CacheRouting(), clock=lambda: now[0])
    loads = ReplicaLoads("up", place, Replica({ROOTS[0]: (200, backend_metrics.VLLM), ROOTS[1]: (404, "")}),
                         interval=1.0, clock=lambda: now[0])  # fmt: skip
    assert asyncio.run(loads.read(ROOTS[0])) is None
    assert asyncio.run(loads.read(ROOTS[1])) == "status 404"
    assert place.load(ROOTS[0], now[0]) == 25.0  # 21 running, 4 waiting
    assert place.load(ROOTS[1], now[0]) == 0  # no figures: this gateway's own in flight
    assert dict(loads.fresh()) == {ROOTS[0]: Reading(21.0, 4.0, pytest.approx(0.83))}
    now[0] += 3.5
    assert place.load(ROOTS[0], now[0]) == 0 and not dict(loads.fresh())  # too old to believe


def test_a_replica_without_metrics_is_logged_once_and_asked_less_and_less_often(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replica = Replica({ROOTS[0]: (200, backend_metrics.LLAMACPP), ROOTS[1]: ConnectionRefusedError("refused")})
    place = Placement(ROOTS, "cache_aware", CacheRouting())
    loads = ReplicaLoads("up", place, replica, interval=0.01)

    async def main() -> None:
        loads.start()
        await eventually_async(lambda: replica.reads[ROOTS[0]] >= 15, "15 reads of the replica with metrics")
        await loads.stop()

    with caplog.at_level(logging.INFO, logger="dragoman.upstream"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert ROOTS[1] in lines[0] and "ConnectionRefusedError: refused" in lines[0] and "in flight" in lines[0]
    assert replica.reads[ROOTS[1]] <= 6  # in the time of 15 reads: 0.02, 0.04, 0.08, 0.16, 0.32 s apart, backing off


def test_a_replica_that_publishes_again_is_said_to_and_read_every_interval_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replica = Replica({ROOTS[0]: (503, "starting"), ROOTS[1]: (200, backend_metrics.SGLANG)})
    place = Placement(ROOTS, "cache_aware", CacheRouting())
    loads = ReplicaLoads("up", place, replica, interval=0.01)

    def running() -> float | None:
        reading = dict(loads.fresh()).get(ROOTS[0])
        return reading.running if reading is not None else None

    async def main() -> None:
        loads.start()
        await eventually_async(lambda: replica.reads.get(ROOTS[0]), "the 503 read")
        replica.answers[ROOTS[0]] = (200, backend_metrics.VLLM)
        await eventually_async(lambda: running() == 21.0, "the replica read again")
        await loads.stop()

    with caplog.at_level(logging.INFO, logger="dragoman.upstream"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "status 503" in lines[0] and "again" in lines[1], lines
    assert dict(loads.fresh())[ROOTS[0]].running == 21.0


def test_stopping_ends_every_read_even_one_waiting_on_a_silent_replica() -> None:
    asked = asyncio.Event()

    async def silent(root: str) -> tuple[int, bytes]:
        asked.set()
        await asyncio.Event().wait()  # never answers
        raise AssertionError("unreachable")

    async def main() -> list[asyncio.Task[object]]:
        place = Placement(ROOTS, "cache_aware", CacheRouting())
        loads = ReplicaLoads("up", place, silent, interval=1.0)
        loads.start()
        loads.start()  # once only
        await asyncio.wait_for(asked.wait(), 1.0)  # a read waits on the silent replica
        await asyncio.wait_for(loads.stop(), 1.0)
        loads.start()  # not after stop
        return [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]

    assert asyncio.run(main()) == []


def test_the_collector_shows_fresh_readings_by_upstream_and_replica_while_reading() -> None:
    registry, collector = CollectorRegistry(), LoadCollector()
    registry.register(collector)
    replica = Replica({ROOTS[0]: (200, backend_metrics.VLLM), ROOTS[1]: (200, backend_metrics.LLAMACPP)})
    loads = ReplicaLoads("local", Placement(ROOTS, "cache_aware", CacheRouting()), replica, interval=10.0,
                         shown_by=collector)  # fmt: skip

    async def main() -> tuple[str, str]:
        loads.start()
        await eventually_async(lambda: len(dict(loads.fresh())) == 2, "both replicas read")
        while_reading = generate_latest(registry).decode()
        await loads.stop()
        return while_reading, generate_latest(registry).decode()

    shown, after = asyncio.run(main())
    assert f'dragoman_replica_requests_waiting{{replica="{ROOTS[0]}",upstream="local"}} 4.0' in shown
    assert f'dragoman_replica_requests_running{{replica="{ROOTS[1]}",upstream="local"}} 4.0' in shown
    assert f'dragoman_replica_kv_cache_usage{{replica="{ROOTS[0]}",upstream="local"}} 0.83' in shown
    assert f'dragoman_replica_kv_cache_usage{{replica="{ROOTS[1]}"' not in shown  # llama-server publishes none
    assert "dragoman_replica_requests_running{" not in after
