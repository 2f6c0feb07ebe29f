"""A program in a pseudo-terminal, read as a person reads it: the screen it draws.

Full-screen programs (Claude Code's interactive UI) move the cursor and redraw, so their
raw output is not the text on screen; pyte, a VT100 emulator, keeps the screen they draw.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pyte

ROWS, COLUMNS = 40, 120
DOWN = "\x1b[B"
ENTER = "\r"


class Terminal:
    """`command` started in a pseudo-terminal of ROWS x COLUMNS, with exactly `env`."""

    def __init__(self, command: Sequence[str], *, env: dict[str, str], cwd: Path) -> None:
        self.screen = pyte.Screen(COLUMNS, ROWS)
        self._stream = pyte.ByteStream(self.screen)
        self.exited = False
        pid, fd = pty.fork()
        if pid == 0:  # the child: never returns
            try:
                os.chdir(cwd)
                os.execve(command[0], list(command), env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))

    def text(self) -> str:
        """The screen's non-empty lines, right-trimmed."""
        return "\n".join(line.rstrip() for line in self.screen.display if line.strip())

    def read(self, seconds: float) -> None:
        """Draw what the program writes for `seconds` (less if it exits)."""
        deadline = time.monotonic() + seconds
        while not self.exited and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.1))
            if ready:
                try:
                    self._stream.feed(os.read(self.fd, 65536))
                except OSError:  # EIO: the program has exited and the terminal is closed
                    self.exited = True

    def wait_for(self, found: Callable[[str], bool], timeout: float) -> bool:
        """Read until `found(screen text)` or `timeout` seconds have passed (or the program exits)."""
        deadline = time.monotonic() + timeout
        while not found(self.text()):
            if self.exited or time.monotonic() > deadline:
                return found(self.text())
            self.read(0.2)
        return True

    def type(self, keys: str) -> None:
        """Keys as a person types them, then a moment for the program to draw the result."""
        os.write(self.fd, keys.encode())
        self.read(0.5)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        os.close(self.fd)
