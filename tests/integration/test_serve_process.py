"""`dragoman serve` as a process: several workers on one port, graceful SIGTERM."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fakes import chunk, text_stream, usage_chunk
from tests.support.helpers import batch_path
from tests.support.serve_process import _kill, _start
from tests.support.servers import sse_frames, worker_serving
from tests.support.waiting import eventually

pytestmark = pytest.mark.heavy  # several processes: the full suite runs it, --fast leaves it out

BODY = {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "Hi"}]}


def test_several_workers_serve_one_port(upstream, stop_later):
    process, url = _start(upstream.url, "--workers", "2")
    stop_later(process)
    for _ in range(6):
        response = httpx.post(url + "/v1/messages", json=BODY, timeout=10)
        assert response.status_code == 200, response.text
        assert response.json()["content"][0]["text"] == "Hello!"


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="tells the workers apart through /proc")
def test_every_worker_writes_the_access_log(upstream, stop_later):
    process, url = _start(upstream.url, "--workers", "2")
    stop_later(process)
    port = int(url.rsplit(":", 1)[1])
    answered: dict[int, list[str]] = {}  # worker pid: the request ids it answered
    deadline = time.monotonic() + 20  # the second worker may still be starting
    while (
        len(answered) < 2 and time.monotonic() < deadline
    ):  # a new connection each time, until both workers answered (the kernel picks)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("POST", "/v1/messages", json.dumps(BODY), {"content-type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200, response.read()
            response.read()
            worker = worker_serving(process.pid, port, connection.sock.getsockname()[1])  # while the connection is open
            answered.setdefault(worker, []).append(response.headers["request-id"])
        finally:
            connection.close()
    assert len(answered) == 2, answered
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    access = [
        json.loads(line.split(": ", 1)[1]) for line in stderr.decode().splitlines() if " INFO dragoman.access: " in line
    ]
    assert all(entry["status"] == 200 for entry in access), stderr.decode()
    logged = [entry["request_id"] for entry in access]
    for worker, ids in answered.items():  # each worker logged each request it answered, once
        assert all(logged.count(request_id) == 1 for request_id in ids), (worker, ids, stderr.decode())
    assert len(logged) == sum(map(len, answered.values())), stderr.decode()


def _stream_through_sigterm(process: subprocess.Popen[bytes], url: str) -> bytes:
    """A stream's whole body, with SIGTERM sent to the gateway once its first token ("one ") came."""
    received: list[bytes] = []

    def read_stream() -> None:
        with httpx.stream("POST", url + "/v1/messages", json={**BODY, "stream": True}, timeout=10) as response:
            for data in response.iter_bytes():
                received.append(data)

    reader = threading.Thread(target=read_stream)
    reader.start()
    eventually(lambda: b"one" in b"".join(received), "the stream's first text reached the client")
    process.send_signal(signal.SIGTERM)
    reader.join(10)  # the body ends (chunked terminator) either way: httpx raises nothing
    return b"".join(received)


def test_sigterm_lets_a_stream_in_flight_finish(upstream, stop_later):
    slow = [chunk({"role": "assistant", "content": ""}), chunk({"content": "one "}), ("sleep", 1.0),
            chunk({"content": "two"}), chunk({}, "stop"), usage_chunk(5, 2)]  # fmt: skip
    upstream.stream_reply(slow)
    process, url = _start(upstream.url)
    stop_later(process)
    body = _stream_through_sigterm(process, url)
    assert b"two" in body and body.rstrip().endswith(b'{"type":"message_stop"}')
    assert process.wait(10) == 0  # a clean stop (uvicorn raises the signal again once drained: dragoman exits 0)
    with pytest.raises(httpx.TransportError):  # no longer accepting
        httpx.post(url + "/v1/messages", json=BODY, timeout=2)


def test_a_stream_outliving_the_shutdown_grace_ends_with_an_overloaded_error_event(upstream, stop_later, tmp_path):
    slow = [chunk({"role": "assistant", "content": ""}), chunk({"content": "one "}), ("sleep", 20.0), chunk({}, "stop")]
    upstream.stream_reply(slow)
    config = tmp_path / "dragoman.toml"
    config.write_text("[server]\nshutdown_grace = 0.5\n")
    process, url = _start(upstream.url, "--config", str(config))
    stop_later(process)
    frames = sse_frames(_stream_through_sigterm(process, url).decode())
    assert frames[-1][0] == "error" and frames[-1][1]["error"]["type"] == "overloaded_error"
    assert process.wait(10) == 0
    assert b"Exception in ASGI application" not in process.stderr.read()  # type: ignore[union-attr]


def test_a_request_outliving_the_shutdown_grace_gets_an_overloaded_error_not_a_plain_500(
    upstream, stop_later, tmp_path
):
    from tests.support.fakes import Reply, completion

    upstream.queue(Reply(body=completion("late"), hang=20.0))
    config = tmp_path / "dragoman.toml"
    config.write_text("[server]\nshutdown_grace = 0.5\n")
    process, url = _start(upstream.url, "--config", str(config))
    stop_later(process)
    answers: list[httpx.Response] = []
    caller = threading.Thread(target=lambda: answers.append(httpx.post(url + "/v1/messages", json=BODY, timeout=10)))
    caller.start()
    eventually(lambda: upstream.requests, "the upstream saw it")  # in flight, waiting for the upstream
    process.send_signal(signal.SIGTERM)
    caller.join(10)
    assert answers[0].status_code == 529, answers[0].text
    assert answers[0].json()["error"]["type"] == "overloaded_error"
    assert answers[0].headers["request-id"] == answers[0].json()["request_id"]
    assert process.wait(10) == 0
    stderr = process.stderr.read().decode()  # type: ignore[union-attr]
    assert "Exception in ASGI application" not in stderr
    assert '"status":529' in stderr and '"error":"overloaded_error"' in stderr  # logged like any other answer


def test_text_stream_sanity(upstream, stop_later):
    upstream.stream_reply(text_stream("a", "b"))
    process, url = _start(upstream.url)
    stop_later(process)
    with httpx.stream("POST", url + "/v1/messages", json={**BODY, "stream": True}, timeout=10) as response:
        assert b"message_stop" in response.read()


def _batch(url: str, n: int) -> str:
    requests = [
        {"custom_id": f"r{i}", "params": {**BODY, "messages": [{"role": "user", "content": f"say <<m{i}>>"}]}}
        for i in range(n)
    ]
    response = httpx.post(url + "/v1/messages/batches", json={"requests": requests}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def _ended(url: str, batch_id: str, timeout: float = 15.0) -> dict:
    def ended() -> dict | None:
        batch = httpx.get(f"{url}/v1/messages/batches/{batch_id}", timeout=5).json()
        return batch if batch["processing_status"] == "ended" else None

    return eventually(ended, f"batch {batch_id} ended", timeout=timeout, every=0.05)


def test_every_worker_answers_for_a_batch(upstream, stop_later):
    process, url = _start(upstream.url, "--workers", "2")
    stop_later(process)
    batch_id = _batch(url, 3)
    for _ in range(8):  # a new connection each time: both workers answer some
        assert httpx.get(f"{url}/v1/messages/batches/{batch_id}", timeout=5).status_code == 200
    assert _ended(url, batch_id)["request_counts"]["succeeded"] == 3
    for _ in range(4):
        lines = httpx.get(f"{url}/v1/messages/batches/{batch_id}/results", timeout=5).text.splitlines()
        assert sorted(json.loads(line)["custom_id"] for line in lines) == ["r0", "r1", "r2"]


def test_a_batch_survives_its_process_being_killed(upstream, stop_later):
    from tests.support.batches import marker_of
    from tests.support.fakes import Reply, completion

    upstream.responder = lambda body: Reply(body=completion("late"), hang=30.0 if marker_of(body) == "m1" else 0.0)
    process, url = _start(upstream.url)
    stop_later(process)
    batch_id = _batch(url, 3)
    results = batch_path(Path(os.environ["XDG_DATA_HOME"]) / "dragoman" / "batches", batch_id) / "results.jsonl"
    settled = lambda: results.exists() and results.read_bytes().count(b"\n") == 2  # noqa: E731
    eventually(settled, "r0 and r2 settled, r1 in flight", timeout=10)
    _kill(process)  # SIGKILL: no clean-up of any kind; the kernel frees the batch's lock

    upstream.responder = lambda body: Reply(body=completion("answer"))
    process, url = _start(upstream.url)
    stop_later(process)
    batch = _ended(url, batch_id)
    assert batch["request_counts"] == {"processing": 0, "succeeded": 3, "errored": 0, "canceled": 0, "expired": 0}
    lines = httpx.get(f"{url}/v1/messages/batches/{batch_id}/results", timeout=5).text.splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in lines) == ["r0", "r1", "r2"]
    assert sorted(marker_of(b) for b in upstream.requests) == ["m0", "m1", "m1", "m2"]
