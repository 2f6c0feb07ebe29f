"""What a client receives from a translated stream, fed upstream reads as the pump does:
through `feed`, or (once the stream started, with `direct`) straight through `feed_to`."""

from __future__ import annotations

import asyncio
from typing import Any

from dragoman.backends.openai.backend import _sse
from dragoman.backends.openai.stream import Translation
from dragoman.core.errors import GatewayError
from tests.support.stream_cases import translator


def client_bytes(reads: list[bytes], options: dict[str, Any], direct: bool) -> bytes:
    """The client's bytes for `reads`; an error the translation raises ends them, named."""
    out: list[bytes] = []

    class Writer:
        def write(self, data: bytes) -> None:
            out.append(data)

    t = Translation("up", translator(**options), None, _sse, None, sse=True)
    try:
        for read in reads:
            if t.ended:
                break
            if direct and t.started:
                t.feed_to(read, Writer())  # type: ignore[arg-type]
            else:
                out.extend(t.feed(read))

        async def finish() -> None:
            out.extend([piece async for piece in t.finish()])

        asyncio.run(finish())
    except GatewayError as error:
        out.append(f"{type(error).__name__}: {error}".encode())
    return b"".join(out)
