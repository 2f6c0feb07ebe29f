"""The package as the Dockerfile builds it: a wheel, installed into a clean environment,
whose `dragoman` command starts and answers. (No Docker engine runs on the machines
the suite runs on, so the image itself is not built here; this covers its steps.)"""

from __future__ import annotations

import subprocess
import sys
import time
import venv
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.packaging


def test_the_wheel_installs_into_a_clean_environment_and_serves(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)], check=True, timeout=300
    )
    (wheel,) = wheels.glob("dragoman-*.whl")
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)], check=True, timeout=600
    )
    version = subprocess.run(
        [str(env_dir / "bin" / "dragoman"), "--version"], capture_output=True, text=True, check=True
    )
    assert "dragoman" in version.stdout
    port = free_port()
    server = subprocess.Popen(
        [str(env_dir / "bin" / "dragoman"), "serve", "--upstream", "http://127.0.0.1:9/v1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json() == {"status": "ok"}
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.poll() is None, (
                    server.stderr.read() if server.stderr else ""
                )
                time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(10)
