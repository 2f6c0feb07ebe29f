"""A long command's progress, said every few seconds: the build tool's own percentage and the
time so far. The first build of llama-server takes minutes on a small machine, and a command
that prints nothing for that long looks hung."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

Log = Callable[[str], None]
EVERY = 5.0  # seconds between two lines
_MAKE = re.compile(r"^\[\s*(\d+)%\]")  # `[ 45%] Building CXX object ...` (Unix Makefiles)
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")  # `[120/268] Building CXX object ...` (Ninja)


def percent_of(line: str) -> int | None:
    """The share of the build done, as the line says it, or None when it says nothing of it."""
    if match := _MAKE.match(line):
        return int(match.group(1))
    if (match := _NINJA.match(line)) and int(match.group(2)):
        return 100 * int(match.group(1)) // int(match.group(2))
    return None


def elapsed(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s"


class _Output:
    """What the command printed, read on a thread: its last lines and the latest percentage."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.percent: int | None = None
        self._process = process
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.tail.append(line.rstrip("\n"))
            found = percent_of(line)
            if found is not None:
                self.percent = found


def run_with_progress(command: Sequence[str | os.PathLike[str]], what: str, log: Log, *, every: float = EVERY) -> float:
    """Run `command`, logging `what: N% after XmYYs` every `every` seconds until it ends; the
    seconds it took. A failure raises RuntimeError with the output's last lines."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    output = _Output(process)
    while True:
        try:
            code = process.wait(timeout=every)
            break
        except subprocess.TimeoutExpired:
            done = "running" if output.percent is None else f"{output.percent}%"  # cmake's configure says none
            log(f"{what}: {done} after {elapsed(time.monotonic() - start)}")
    output.reader.join()
    if code != 0:
        tail = "\n".join(output.tail)
        raise RuntimeError(f"{what} failed (exit {code}): {' '.join(map(str, command))}\n{tail}")
    return time.monotonic() - start
