"""Documents given by URL: refused unless the operator enables fetching, and then
only from public addresses (or private ones when explicitly allowed)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import httpx
import pytest

from dragoman.backends.fetch_budget import MAX_DOCUMENTS, PARALLEL_FETCHES
from tests.support.envelopes import error_of, raw_error
from tests.support.samples import TINY_PNG

TEXT = "The launch code is 1234."


def _held(gateway) -> int:
    """The bytes the gateway's requests in flight hold of what they fetched."""
    return gateway.app.gateway.shared.fetched.bytes


HANG = 1.0  # seconds /hang.txt takes


class _Handler(BaseHTTPRequestHandler):
    lock = threading.Condition()
    running = 0  # /slow.txt requests held now
    most = 0  # the most held at once
    gave_up = False  # a hold ended without PARALLEL_FETCHES requests here at once: hold no more
    served = 0

    def do_GET(self) -> None:  # noqa: N802
        with _Handler.lock:
            _Handler.served += 1
        self.path = self.path.partition("?")[0]  # a query only makes a URL distinct
        if self.path == "/slow.txt":
            self._hold()
            self.path = "/doc.txt"
        elif self.path == "/hang.txt":  # slower than the request's fetches may take together
            time.sleep(HANG)
            self.path = "/doc.txt"
        self._answer()

    def _hold(self) -> None:
        """Until PARALLEL_FETCHES requests were here at once (or, once, for up to 5 s), so fetches
        the gateway runs at once are seen at once however slowly they come; then 0.1 s more, so
        that more fetches at once than that would be seen too. A request counts until its
        answer starts: a fetch counted is one whose slot the gateway still holds."""
        with _Handler.lock:
            _Handler.running += 1
            _Handler.most = max(_Handler.most, _Handler.running)
            _Handler.lock.notify_all()
            if not _Handler.lock.wait_for(lambda: _Handler.most >= PARALLEL_FETCHES or _Handler.gave_up, timeout=5):
                _Handler.gave_up = True
                _Handler.lock.notify_all()
        time.sleep(0.1)
        with _Handler.lock:
            _Handler.running -= 1

    def _answer(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("location", "/doc.txt")
            self.end_headers()
            return
        if self.path == "/pieces.txt":  # a document that arrives in several reads
            pieces = [f"part {n} of the memo. ".encode() * 200 for n in range(3)]
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(sum(map(len, pieces))))
            self.end_headers()
            for piece in pieces:
                self.wfile.write(piece)
                self.wfile.flush()
                time.sleep(0.05)
            return
        if self.path in ("/raw-text", "/raw-binary"):  # a server that labels everything octet-stream
            self._send(
                TEXT.encode() if self.path == "/raw-text" else b"PK\x03\x04\x00\x01\x02" * 10,
                "application/octet-stream",
            )
            return
        if self.path == "/png":
            self._send(TINY_PNG, "image/png")
            return
        self._send(TEXT.encode() if self.path == "/doc.txt" else b"x" * 5000, "text/plain; charset=utf-8")

    def _send(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def docs_server() -> Iterator[str]:
    _Handler.running = _Handler.most = _Handler.served = 0
    _Handler.gave_up = False
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()  # the listening socket: shutdown() only ends serve_forever


def _body(url: str, copies: int = 1, distinct: bool = False) -> dict:
    """A request naming the document at `url` `copies` times (with `distinct`, each by a URL of its own)."""
    urls = [f"{url}?n={n}" if distinct else url for n in range(copies)]
    content = [{"type": "document", "source": {"type": "url", "url": u}, "title": "Memo"} for u in urls]
    content.append({"type": "text", "text": "Summarise."})
    return {"model": "test-model", "max_tokens": 20, "messages": [{"role": "user", "content": content}]}


def test_url_documents_are_refused_by_default(gateway, upstream, docs_server):
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/doc.txt"))
    assert response.status_code == 400
    assert "fetch_documents" in response.json()["error"]["message"]
    assert upstream.requests == []


def test_private_addresses_are_refused_even_when_fetching_is_on(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True})
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/doc.txt"))
    assert response.status_code == 400
    assert "private, loopback or reserved" in response.json()["error"]["message"]
    assert upstream.requests == []


def test_a_url_document_spelled_with_json_escapes_is_held_to_the_same_rule(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True})
    raw = json.dumps(_body(docs_server + "/doc.txt")).replace('"url"', '"\\u0075rl"').encode()
    assert b'"url"' not in raw
    response = httpx.post(gateway.url + "/v1/messages", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "private, loopback or reserved" in response.json()["error"]["message"]
    assert upstream.requests == []


def test_fetched_documents_reach_the_model_as_text(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True})
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/redirect"))
    assert response.status_code == 200, response.text
    sent = upstream.requests[0]["messages"][0]["content"]
    assert TEXT in sent and 'title="Memo"' in sent


def test_a_text_document_served_as_octet_stream_is_read_by_its_bytes(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True})
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/raw-text"))
    assert response.status_code == 200, response.text
    assert TEXT in upstream.requests[0]["messages"][0]["content"]

    refused = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/raw-binary"))
    assert refused.status_code == 400
    assert "application/octet-stream' is not a PDF or text" in refused.json()["error"]["message"]


def test_a_document_that_arrives_in_pieces_is_fetched_whole(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True})
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/pieces.txt"))
    assert response.status_code == 200, response.text
    sent = upstream.requests[0]["messages"][0]["content"]
    assert "part 0 of the memo" in sent and "part 2 of the memo" in sent


def test_a_request_fetches_a_few_documents_at_a_time(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True})
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/slow.txt", copies=12, distinct=True),
                          timeout=30)  # fmt: skip
    assert response.status_code == 200, response.text
    assert _Handler.served == 12
    assert _Handler.most == PARALLEL_FETCHES  # never more at once, and not one after another


def test_a_request_may_have_at_most_so_many_documents_fetched(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True})
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/doc.txt", copies=MAX_DOCUMENTS + 1))
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(f"messages.0.content.{MAX_DOCUMENTS}.source: at most")
    assert _Handler.served == 0 and upstream.requests == []


def test_the_documents_of_a_request_are_bounded_together(make_gateway, upstream, docs_server):
    # Each 5000-byte document is within fetch_max_bytes; the two together pass the request's limit
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True, "max_request_bytes": 9000})
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/big.txt", copies=2))
    assert response.status_code == 400
    assert "together pass server.max_request_bytes (9000 bytes)" in response.json()["error"]["message"]
    assert upstream.requests == []


def test_fetch_size_limit(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True, "fetch_max_bytes": 1000})
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/big.txt"))
    assert response.status_code == 400
    assert "1000-byte limit" in response.json()["error"]["message"]


def _images_and_documents(server: str, copies: int) -> list[dict]:
    image = {"type": "image", "source": {"type": "url", "url": server + "/png"}}
    document = {"type": "document", "source": {"type": "url", "url": server + "/doc.txt"}}
    return [{"role": "user", "content": [image, document] * copies + [{"type": "text", "text": "Compare."}]}]


def test_each_distinct_url_is_fetched_once_per_request(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True})
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    messages = _images_and_documents(docs_server, MAX_DOCUMENTS)  # 100 images and 100 documents, from 2 URLs
    client.messages.create(model="test-model", max_tokens=10, messages=messages)  # type: ignore[arg-type]
    assert _Handler.served == 2
    sent = json.dumps(upstream.requests[0])
    assert sent.count(TEXT) == MAX_DOCUMENTS and sent.count("data:image/png;base64,") == MAX_DOCUMENTS
    client.messages.count_tokens(model="test-model", messages=messages)  # type: ignore[arg-type]
    assert _Handler.served == 4
    assert _held(gateway) == 0  # given back once answered


def test_the_passthrough_path_fetches_each_distinct_url_once_too(native, gateway_from, docs_server):
    """Documents as text for llama-server: fetched one by one, each URL once all the same."""
    gateway = gateway_from({
        "server": {"fetch_documents": True, "fetch_allow_private": True},
        "upstreams": {"native": {"url": native.url + "/v1", "protocol": "anthropic", "documents": "as_text",
                                 "max_retries": 0}},
        "models": [{"name": "claude-test", "upstream": "native", "upstream_model": "claude-test"}],
    })  # fmt: skip
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    client.messages.create(model="claude-test", max_tokens=10, messages=_images_and_documents(docs_server, 10))  # type: ignore[arg-type]
    assert _Handler.served == 2
    (sent,) = [json.dumps(body) for path, body, _ in native.requests if path.endswith("/messages")]
    assert sent.count(TEXT) == 10 and sent.count('"type": "base64"') == 10
    assert _held(gateway) == 0


def test_a_url_named_again_counts_again_against_the_request(make_gateway, upstream, docs_server):
    """Fetched once, but sent on for each place: 2 x 5000 bytes pass 9000."""
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True, "max_request_bytes": 9000})
    response = httpx.post(gateway.url + "/v1/messages", json=_body(docs_server + "/big.txt", copies=2))
    assert "together pass server.max_request_bytes (9000 bytes)" in raw_error(response, 400, "invalid_request_error")
    assert _Handler.served == 1 and upstream.requests == []


def test_past_what_the_process_may_hold_a_request_is_answered_529(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True, "fetch_max_held_bytes": 4000})
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model="test-model", max_tokens=10, messages=_body(docs_server + "/big.txt")["messages"])
    assert "server.fetch_max_held_bytes (4000 bytes)" in error_of(caught, 529, "overloaded_error")
    client.messages.create(model="test-model", max_tokens=10, messages=_body(docs_server + "/doc.txt")["messages"])
    assert upstream.requests and _held(gateway) == 0


def test_all_of_a_request_s_fetches_end_within_one_deadline(make_gateway, upstream, docs_server):
    """8 fetches of a second each, 4 at a time, each within fetch_timeout: the request's deadline ends them."""
    gateway = make_gateway(
        server={"fetch_documents": True, "fetch_allow_private": True, "fetch_total_timeout": HANG / 2}
    )
    body = _body(docs_server + "/hang.txt", copies=2 * PARALLEL_FETCHES, distinct=True)
    response = httpx.post(gateway.url + "/v1/messages", json=body, timeout=30)
    message = raw_error(response, 400, "invalid_request_error")
    assert "/hang.txt?n=" in message and f"server.fetch_total_timeout ({HANG / 2:g} s)" in message
    assert upstream.requests == [] and _held(gateway) == 0


def test_a_name_that_resolves_to_a_private_address_is_refused(make_gateway, upstream, docs_server):
    # The check runs on the address the connection would use, not on the name.
    gateway = make_gateway(server={"fetch_documents": True})
    url = docs_server.replace("127.0.0.1", "localhost") + "/doc.txt"
    response = httpx.post(gateway.url + "/v1/messages", json=_body(url))
    assert response.status_code == 400
    assert "private, loopback or reserved" in response.json()["error"]["message"]


def test_a_host_in_full_width_digits_is_refused(make_gateway, upstream, docs_server):
    # "１２７.０.０.１" is 127.0.0.1 to aiohttp, which connects to a literal address without resolving it
    gateway = make_gateway(server={"fetch_documents": True})
    response = httpx.post(
        gateway.url + "/v1/messages",
        json=_body(docs_server.replace("127.0.0.1", "\uff11\uff12\uff17.0.0.1") + "/doc.txt"),
    )
    assert response.status_code == 400
    assert "private, loopback or reserved" in response.json()["error"]["message"]
    assert upstream.requests == []


def test_count_tokens_fetches_url_documents_too(make_gateway, upstream, docs_server):
    gateway = make_gateway(server={"fetch_documents": True, "fetch_allow_private": True})
    body = _body(docs_server + "/doc.txt")
    del body["max_tokens"]
    response = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["input_tokens"] > len(TEXT) // 4


def _forging_pdf() -> bytes:
    """A PDF whose page repeats a key (pypdf warns about it, quoting the key) that holds an
    escaped newline and a log line."""
    forged = b"/X#0A2026-11-30#2000:00:00,000#20ERROR#20dragoman:#20FORGED"
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 9 9] " + forged + b" 1 " + forged + b" 2 >>"]  # fmt: skip
    out, offsets = b"%PDF-1.4\n", []
    for number, obj in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, obj)
    xref = len(out)
    out += b"xref\n0 4\n0000000000 65535 f \n" + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size 4 /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % xref


def test_a_pdf_that_makes_pypdf_warn_puts_nothing_of_it_in_the_log(gateway, upstream, caplog):
    import base64
    import logging

    caplog.set_level(logging.DEBUG)
    pdf = base64.b64encode(_forging_pdf()).decode()
    content = [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}},
        {"type": "text", "text": "hi"},
    ]
    response = httpx.post(f"{gateway.url}/v1/messages/count_tokens", json={"model": "test-model", "messages": [{"role": "user", "content": content}]},
                          headers={"x-api-key": "k"}, timeout=10)  # fmt: skip

    assert response.status_code == 200
    assert [r.name for r in caplog.records if r.name.startswith("pypdf")] == []
    assert not any("FORGED" in r.getMessage() for r in caplog.records)
