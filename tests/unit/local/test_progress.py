"""The first build of llama-server says how far it is every few seconds (dragoman_local.progress)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from dragoman_local.progress import elapsed, percent_of, run_with_progress

# A build that moves on only once the progress line for its last step was logged: no timing.
BUILD = """
import pathlib, sys, time
here = pathlib.Path(sys.argv[1])
for step, percent in enumerate((10, 50)):
    print(f"[{percent:3d}%] Building CXX object step{step}.o", flush=True)
    while not (here / f"seen-{percent}").exists():
        time.sleep(0.01)
print("[100%] Built target llama-server", flush=True)
"""


def test_the_build_says_its_percentage_and_time_until_it_ends(tmp_path: Path) -> None:
    said: list[str] = []

    def log(message: str) -> None:
        said.append(message)
        if match := re.search(r"(\d+)% after", message):
            (tmp_path / f"seen-{match.group(1)}").touch()

    took = run_with_progress([sys.executable, "-c", BUILD, str(tmp_path)], "building llama-server", log, every=0.02)
    assert took >= 0
    shown = [m for m in said if "%" in m]
    assert all(re.fullmatch(r"building llama-server: (10|50|100)% after \dm\d\ds", m) for m in shown), said
    # in order, each at least once (100% only if a line came between the last print and the exit)
    assert [m.split()[2] for m in dict.fromkeys(shown)] in (["10%", "50%"], ["10%", "50%", "100%"]), said


def test_a_failed_build_raises_with_its_last_lines(tmp_path: Path) -> None:
    failing = "import sys; print('[ 20%] Building x.o'); print('error: no such file'); sys.exit(3)"
    with pytest.raises(RuntimeError) as caught:
        run_with_progress([sys.executable, "-c", failing], "building llama-server", lambda _: None, every=0.02)
    assert "building llama-server failed (exit 3)" in str(caught.value)
    assert str(caught.value).endswith("[ 20%] Building x.o\nerror: no such file")


@pytest.mark.parametrize(
    ("line", "percent"),
    [("[ 45%] Building CXX object a.o", 45), ("[100%] Built target llama-server", 100),
     ("[120/240] Building CXX object a.o", 50), ("-- Configuring done", None), ("[0/0] nothing", None)],
)  # fmt: skip
def test_make_and_ninja_lines_give_the_percentage(line: str, percent: int | None) -> None:
    assert percent_of(line) == percent


def test_elapsed_reads_as_minutes_and_seconds() -> None:
    assert elapsed(316.4) == "5m16s" and elapsed(7) == "0m07s"
