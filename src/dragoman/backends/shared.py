"""What the backends of one gateway share: state that was once a module's global.

The gateway makes one `Shared`, hands it to every backend it builds (`backends.build`), and
closes it in its own `close()`. A test builds its own, with the settings it needs, instead of
patching a module's constants; a second gateway in the process (a reload) shares nothing with
the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dragoman.backends.fetch_budget import Held
from dragoman.core.offload import Offload
from dragoman.core.redaction import Redactor
from dragoman.upstream.gauges import LoadCollector
from dragoman.upstream.keepalive import BodyEnds
from dragoman.upstream.replicas import CoolDowns


@dataclass(frozen=True, slots=True, kw_only=True)
class Shared:
    """One gateway's process state, as its backends see it."""

    redactor: Redactor = field(default_factory=Redactor)  # the upstream keys, kept out of errors
    offload: Offload = field(default_factory=Offload)  # the slow-work threads (PDFs, large images)
    fetched: Held = field(default_factory=Held)  # the bytes the requests in flight fetched by URL and hold
    ends: BodyEnds = field(default_factory=BodyEnds)  # bodies still read after their stream's end
    clock: Callable[[], float] = time.monotonic  # seconds, for the time budgets (a PDF's reading)
    cool_downs: CoolDowns = field(default_factory=CoolDowns)  # how long a failed instance is passed over
    gauges: LoadCollector = field(default_factory=LoadCollector)  # the replicas' own load, for /metrics

    async def close(self) -> None:
        """Nothing outlives the gateway that made it."""
        await self.ends.close()
        self.offload.close()
