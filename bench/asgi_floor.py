"""The least an ASGI proxy on dragoman's stack can do: the floor under its figures.

dragoman serves with uvicorn (httptools, uvloop) and calls upstreams with one
pooled aiohttp ClientSession. That stack has fixed costs of its own: uvicorn's
HTTP parsing and one ASGI task per request, aiohttp's request and response
handling per upstream call, one `send` per streamed chunk. This is a raw ASGI app
(no Starlette, no routing, no validation, no JSON) on exactly that stack: for any
POST it reads the whole body, POSTs it to the upstream on the same path (with
content-type json and the client's `x-api-key` / `anthropic-version`), and sends
the reply back: whole, or, for `text/event-stream`, each `readany()` chunk as it
arrives. bench/run.py measures it (target `asgi-floor`) beside the passthrough
and translating paths: what a request or a chunk costs here is the per-request
and per-chunk floor of uvicorn + aiohttp; anything dragoman adds is above it.

Usage: python bench/asgi_floor.py --port 9002 --upstream http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any

import aiohttp
import uvicorn

PASSED = (b"x-api-key", b"anthropic-version")  # client headers sent on to the upstream


def make_app(upstream: str) -> Any:
    session: aiohttp.ClientSession | None = None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal session
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:  # lifespan.shutdown
                    if session is not None:
                        await session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 405, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if session is None:  # in the server's loop
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), skip_auto_headers=("user-agent",))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {"content-type": "application/json"}
        for name, value in scope["headers"]:
            if name in PASSED:
                headers[name.decode()] = value.decode()
        async with session.post(upstream + scope["path"], data=body, headers=headers) as response:
            content_type = response.headers.get("content-type", "application/json").encode()
            if content_type.startswith(b"text/event-stream"):
                await send({"type": "http.response.start", "status": response.status, "headers": [(b"content-type", content_type)]})
                while chunk := await response.content.readany():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            else:
                data = await response.read()
                await send({"type": "http.response.start", "status": response.status,
                            "headers": [(b"content-type", content_type), (b"content-length", b"%d" % len(data))]})  # fmt: skip
                await send({"type": "http.response.body", "body": data})

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A minimal uvicorn + aiohttp ASGI proxy on 127.0.0.1 (the stack's floor).")
    parser.add_argument("--port", type=int, required=True, help="where clients connect")
    parser.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:9000 (the request's path is appended)")
    args = parser.parse_args(argv)
    upstream = args.upstream.rstrip("/")
    if urllib.parse.urlsplit(upstream).hostname != "127.0.0.1":
        parser.error("--upstream must be on 127.0.0.1")
    uvicorn.run(make_app(upstream), host="127.0.0.1", port=args.port, loop="uvloop", http="httptools",
                access_log=False, log_level="warning")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
