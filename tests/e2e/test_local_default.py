"""`dragoman serve` with nothing configured: the local model it starts, answers with, and
stops with it, whichever way the gateway is told to stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import pytest

from dragoman_local.localmodel import DEFAULT_LOCAL_MODEL


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return children


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # exited, not yet reaped


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_local_model_answers_and_stops_with_the_gateway(tmp_path: Path, stop: signal.Signals) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAGOMAN_") or k == "DRAGOMAN_CACHE_DIR"}
    gateway = subprocess.Popen(
        [sys.executable, "-m", "dragoman", "serve", "--port", str(port)], cwd=tmp_path, env={**env, "XDG_DATA_HOME": str(tmp_path)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    llama: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert gateway.poll() is None, gateway.stderr.read().decode()[-2000:] if gateway.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.2)
        llama += _children(gateway.pid)
        assert len(llama) == 1

        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused", max_retries=0)
        with client.messages.stream(
            model="claude-sonnet-4-6", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        ) as stream:
            message = stream.get_final_message()
        assert message.model == "claude-sonnet-4-6" and message.usage.output_tokens > 0  # served by the default model
        assert message.stop_reason in ("end_turn", "max_tokens")

        gateway.send_signal(stop)
        assert gateway.wait(timeout=40) in (0, 128 + stop, -stop)
        deadline = time.monotonic() + 10
        while not _gone(llama[0]):
            assert time.monotonic() < deadline, f"llama-server ({DEFAULT_LOCAL_MODEL}) outlived the gateway"
            time.sleep(0.1)
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()
        for pid in llama:  # never left running, whatever failed
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
