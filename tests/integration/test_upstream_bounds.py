"""Upstream replies that would cost the gateway unbounded memory or time end as
Anthropic errors instead: a gzip bomb mid-stream is an `error` event."""

from __future__ import annotations

import json

import httpx
import pytest

from dragoman.backends import connection
from tests.fakes import Reply, chunk
from tests.samples import MiB, gzip_bomb
from tests.servers import sse_frames

USER = [{"role": "user", "content": "Hello"}]
VALID = {"model": "test-model", "max_tokens": 10, "messages": USER}


def _post(url: str, body: dict, *, key: str = "k", timeout: float = 20) -> httpx.Response:
    headers = {"content-type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"}
    return httpx.post(f"{url}/v1/messages", content=json.dumps(body).encode(), headers=headers, timeout=timeout)


# -- the translating path ------------------------------------------------------------------


def test_a_gzip_bomb_mid_stream_ends_with_an_error_event(gateway, upstream, monkeypatch: pytest.MonkeyPatch):
    """A stream may be long, so its bound is MAX_INFLATED (256 MiB, made small here) and
    backpressure. What came before the bomb reaches the client."""
    monkeypatch.setattr(connection, "MAX_INFLATED", 4 * MiB)
    first = b"data: " + json.dumps(chunk({"role": "assistant", "content": "partial"})).encode() + b"\n\n"
    upstream.queue(Reply(chunks=[gzip_bomb(64, b"\n", prefix=first)], headers={"content-encoding": "gzip"}, done=False))
    response = _post(gateway.url, {**VALID, "stream": True})
    assert response.status_code == 200
    frames = sse_frames(response.text)
    assert frames[-1][0] == "error" and frames[-1][1]["error"]["type"] == "api_error"
    assert "inflates past 4 MiB" in frames[-1][1]["error"]["message"]
    assert "".join(d["delta"]["text"] for e, d in frames if e == "content_block_delta") == "partial"
