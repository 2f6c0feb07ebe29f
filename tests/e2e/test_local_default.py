"""`dragoman serve` with nothing configured: the local model it starts, answers with, and
stops with it, whichever way the gateway is told to stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import anthropic
import httpx
import pytest

from dragoman_local.localmodel import DEFAULT_LOCAL_MODEL, is_set_up


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
        [sys.executable, "-m", "dragoman", "serve", "--port", str(port), "--local-port", "0"], cwd=tmp_path,
        env={**env, "XDG_DATA_HOME": str(tmp_path)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
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


def _read_until(stream: IO[bytes], marker: str, timeout: float) -> str:
    """What `stream` gave until a line holding `marker` (or its end, or `timeout` seconds)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(_lines_until(stream, marker)), daemon=True)
    reader.start()
    reader.join(timeout)
    return "".join(lines)


def _lines_until(stream: IO[bytes], marker: str) -> Iterator[str]:
    for raw in stream:
        line = raw.decode(errors="replace")
        yield line
        if marker in line:
            return


def test_the_banner_gives_check_and_models_commands_for_the_local_models_port(tmp_path: Path) -> None:
    cached = is_set_up()
    port, local_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAGOMAN_") or k == "DRAGOMAN_CACHE_DIR"}
    gateway = subprocess.Popen(
        [sys.executable, "-m", "dragoman", "serve", "--port", str(port), "--local-port", str(local_port)], cwd=tmp_path,
        env={**env, "XDG_DATA_HOME": str(tmp_path)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    llama: list[int] = []
    try:
        assert gateway.stderr is not None
        banner = _read_until(gateway.stderr, " models --upstream ", timeout=120)
        llama += _children(gateway.pid)
        if cached:  # nothing is built: the banner must not say it will be
            assert "minutes" not in banner and "build" not in banner, banner
        commands = {line.split()[1]: line.split() for line in banner.splitlines() if " --upstream http" in line}
        assert set(commands) == {"check", "models"}, banner
        # the port asked for, so a configuration naming it works after a restart
        assert {words[-1] for words in commands.values()} == {f"http://127.0.0.1:{local_port}/v1"}, banner
        outputs = {}
        for name, words in commands.items():
            assert words[0] == "dragoman", banner
            shown = subprocess.run([sys.executable, "-m", "dragoman", *words[1:]], capture_output=True, text=True,
                                   timeout=60, env=env)  # fmt: skip
            assert shown.returncode == 0 and DEFAULT_LOCAL_MODEL in shown.stdout, (name, shown.stdout, shown.stderr)
            outputs[name] = shown.stdout
        assert "path=translate" in outputs["check"], outputs
    finally:
        gateway.kill()
        gateway.wait()
        for pid in llama:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
