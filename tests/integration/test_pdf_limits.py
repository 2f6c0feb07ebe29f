"""PDFs a client sends are read within limits, off the event loop and off the threads the
rest of the gateway uses: a PDF past a limit is a 400 naming the field, and PDFs being
read hold up neither /health nor the Files API."""

from __future__ import annotations

import base64
import concurrent.futures
import os
import threading
from typing import Any

import anthropic
import httpx
import pytest

from dragoman.core import offload
from dragoman.translate import content
from tests.support.envelopes import error_of
from tests.support.samples import pdf_bytes, shared_stream_pdf


def _with_pdf(raw: bytes) -> dict:
    document = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                                "data": base64.b64encode(raw).decode()}}  # fmt: skip
    return {"model": "test-model", "max_tokens": 10,
            "messages": [{"role": "user", "content": [document, {"type": "text", "text": "Summarize"}]}]}  # fmt: skip


def test_a_pdf_past_a_limit_is_a_400_naming_its_data(client, upstream):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**_with_pdf(shared_stream_pdf(300, 2000)))  # 47 KB that once took 49 s to read
    message = error_of(caught, 400, "invalid_request_error")
    assert message.startswith("messages.0.content.0.source.data: the PDF has 300 pages; at most 100")
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.count_tokens(
            **{k: v for k, v in _with_pdf(shared_stream_pdf(100, 2500)).items() if k != "max_tokens"}
        )
    assert "draw more than 4 MiB of content" in error_of(caught, 400, "invalid_request_error")
    assert upstream.requests == []
    client.messages.create(**_with_pdf(pdf_bytes("fine")))
    assert "fine" in str(upstream.requests[-1]["messages"])


def test_pdfs_being_read_hold_up_neither_health_nor_the_files_api(gateway, client, monkeypatch):
    """More PDFs at once than the default executor has threads: each one's reading blocks
    until released. They wait on the slow-work threads, so the Files API's storage work
    (on the default executor) still runs."""
    release, reading = threading.Event(), threading.Semaphore(0)

    def blocked(raw: bytes, where: str, clock: Any) -> str:
        reading.release()
        release.wait(30)
        return "text"

    monkeypatch.setattr(content, "pdf_text", blocked)
    flood = min(32, (os.cpu_count() or 1) + 4) + 2  # asyncio's default executor size, and more
    with concurrent.futures.ThreadPoolExecutor(flood) as senders:
        sent = [senders.submit(client.messages.create, **_with_pdf(pdf_bytes("x"))) for _ in range(flood)]
        try:
            for _ in range(offload.WORKERS):
                assert reading.acquire(timeout=10)  # the slow-work threads are all busy
            assert httpx.get(f"{gateway.url}/health", timeout=5).status_code == 200
            assert client.with_options(timeout=10).beta.files.list().data == []
        finally:
            release.set()
        assert all(future.result(timeout=30).content[0].text == "Hello!" for future in sent)
