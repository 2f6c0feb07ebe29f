"""The least an ASGI proxy on dragoman's stack can do: the floor under its figures.

dragoman serves with uvicorn (httptools, uvloop) and calls upstreams through its own
connection pool (`dragoman.upstream.transport.pool`: asyncio Protocols with httptools). That
stack has fixed costs of its own: uvicorn's HTTP parsing and one ASGI task per
request, one upstream request and response per call, one `send` per streamed chunk.
This is a raw ASGI app (no Starlette, no routing, no validation, no JSON, no retries
or timeouts) on exactly that stack: for any POST it reads the whole body, POSTs it to
the upstream on the same path (with content-type json and the client's `x-api-key` /
`anthropic-version`), and sends the reply back: whole, or, for `text/event-stream`,
each `readany()` chunk as it arrives. bench/run.py measures it (target `asgi-floor`)
beside the passthrough and translating paths: what a request or a chunk costs here is
the per-request and per-chunk floor of the stack; anything dragoman adds is above it.

Usage: python bench/asgi_floor.py --port 9002 --upstream http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any

import uvicorn

from dragoman.upstream.transport.pool import Pool

PASSED = (b"x-api-key", b"anthropic-version")  # client headers sent on to the upstream


def make_app(upstream: str) -> Any:
    pool = Pool([upstream], connect_timeout=10, tls=None, proxies={})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:  # lifespan.shutdown
                    await pool.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 405, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = b"content-type: application/json\r\n"
        for name, value in scope["headers"]:
            if name in PASSED:
                headers += name + b": " + value + b"\r\n"
        response = await pool.request(upstream, b"POST", scope["path"], headers, body)
        try:
            content_type = response.headers.get("content-type", "application/json").encode()
            if content_type.startswith(b"text/event-stream"):
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status,
                        "headers": [(b"content-type", content_type)],
                    }
                )
                while chunk := await response.readany():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            else:
                data = await response.read()
                await send({"type": "http.response.start", "status": response.status,
                            "headers": [(b"content-type", content_type), (b"content-length", b"%d" % len(data))]})  # fmt: skip
                await send({"type": "http.response.body", "body": data})
        finally:
            response.release()

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A minimal ASGI proxy on dragoman's stack, on 127.0.0.1 (the stack's floor)."
    )
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
