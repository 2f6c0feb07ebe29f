"""scripts/check-image, the manual check of the Dockerfile's image, in the parts that decide
what it asks the container engine for. It starts the image in a real container where the host
allows it: as is first, then adding one setting at a time (open-file limits, then runc), and it
names what it needed. Driven here against a fake `podman` on PATH that refuses to start a
container until it is given the flags a restricted host needs, as podman 4.3 on the development
VM did."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import resource
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "check-image"

# Refuses `run` with the error the real runtime gave until every flag in FAKE_NEEDS is given.
FAKE_ENGINE = """\
#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
command = next(arg for arg in args if not arg.startswith("-") and arg != "runc")
if command == "run":
    needs = {{"ulimit": "--ulimit", "runc": "--runtime"}}
    missing = [name for name, flag in needs.items() if name in os.environ["FAKE_NEEDS"].split(",") and flag not in args]
    if missing:
        print("Error: OCI runtime error: refused without " + missing[0], file=sys.stderr)
        sys.exit(126)
    print("0123abcd")
elif command == "version":
    print(json.dumps({{"Client": {{"Version": "4.3.1"}}}}))
elif command == "info":
    print(json.dumps({{"name": "runc", "version": "runc version 1.1.5+ds1\\ncommit: 1"}}))
"""


def load_script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("check_image", str(SCRIPT))
    spec = importlib.util.spec_from_loader("check_image", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class FakePodman:
    def __init__(self, bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin_dir, self.log = bin_dir, bin_dir / "calls.jsonl"
        engine = bin_dir / "podman"
        engine.write_text(FAKE_ENGINE.format(python=sys.executable))
        engine.chmod(0o755)
        monkeypatch.setenv("PATH", str(bin_dir))  # no real podman or runc is found
        monkeypatch.setenv("FAKE_LOG", str(self.log))
        self.monkeypatch = monkeypatch

    def refusing_without(self, needs: str, runc_installed: bool) -> None:
        self.monkeypatch.setenv("FAKE_NEEDS", needs)
        if runc_installed:
            (self.bin_dir / "runc").write_text("#!/bin/sh\n")
            (self.bin_dir / "runc").chmod(0o755)

    def calls(self) -> list[list[str]]:
        """Every call's arguments, after `podman`."""
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakePodman:
    return FakePodman(tmp_path, monkeypatch)


OPEN_FILES = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
ULIMITS = ["--ulimit", f"nofile={OPEN_FILES}:{OPEN_FILES}", "--ulimit", "nproc=4096:4096"]
SERVE = ["dragoman:check", "--upstream", "http://127.0.0.1:1/v1", "--host", "127.0.0.1", "--port", "8765"]


@pytest.mark.parametrize(
    ("needs", "engine_flags", "run_flags", "tries"),
    [
        ("", [], [], 1),  # a host that allows it gets no extra flag
        ("ulimit", [], ULIMITS, 2),
        ("ulimit,runc", ["--runtime", "runc"], ULIMITS, 3),
    ],
)
def test_the_container_starts_with_only_the_flags_the_host_needs(
    podman: FakePodman, needs: str, engine_flags: list[str], run_flags: list[str], tries: int
) -> None:
    podman.refusing_without(needs, runc_installed=True)
    running = load_script().Running("podman", {}, "http://127.0.0.1:1/v1")
    starts = [call for call in podman.calls() if "run" in call]
    assert len(starts) == tries
    started = [*engine_flags, "run", "-d", "--name", "dragoman-check", "--network", "host", *run_flags, *SERVE]
    assert starts[-1] == started
    assert running.container == "dragoman-check" and running.process is None
    assert running.how.splitlines()[0] == "in a container, podman 4.3.1 with runc version 1.1.5+ds1"
    assert ("--ulimit" in running.how, "--runtime" in running.how) == (bool(run_flags), bool(engine_flags))


def test_later_commands_use_the_runtime_the_container_started_with(podman: FakePodman) -> None:
    podman.refusing_without("ulimit,runc", runc_installed=True)
    running = load_script().Running("podman", {}, "http://127.0.0.1:1/v1")
    running.health_check(["CMD-SHELL", "true"])
    running.stop()
    assert podman.calls()[-2:] == [
        ["--runtime", "runc", "healthcheck", "run", "dragoman-check"],
        ["--runtime", "runc", "rm", "-f", "dragoman-check"],
    ]


def test_without_a_way_to_start_it_the_failures_are_listed(podman: FakePodman, monkeypatch: pytest.MonkeyPatch) -> None:
    podman.refusing_without("ulimit,runc", runc_installed=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # not root: no chroot fallback either
    with pytest.raises(SystemExit) as stopped:
        load_script().Running("podman", {}, "http://127.0.0.1:1/v1")
    message = str(stopped.value)
    assert "podman could not start a container" in message
    assert "as is: Error: OCI runtime error: refused without ulimit" in message
    assert f"with {' '.join(ULIMITS)}: Error: OCI runtime error: refused without runc" in message


@pytest.mark.parametrize(
    ("tool", "never_pull"),
    [
        ("podman", ["--pull=never"]),  # the base may be a local stand-in: never reach for a registry
        ("docker", []),  # docker's --pull is a yes/no ("pull newer"): --pull=never is refused, and unneeded
    ],
)
def test_the_build_never_pulls_in_each_engine_s_own_words(tool: str, never_pull: list[str]) -> None:
    command = load_script().build_command(tool, "-t", "dragoman:check", ".")
    assert command[:2] == [tool, "build"] and command[-3:] == ["-t", "dragoman:check", "."]
    assert [arg for arg in command if arg.startswith("--pull")] == never_pull
