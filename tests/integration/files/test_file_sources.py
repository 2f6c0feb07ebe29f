"""Image and document blocks whose source is `{"type": "file"}`: on the translating
path (an `image_url` data URL, a PDF's text, a text file's text), inside tool results, in
count_tokens and in batches; uploads of raw bytes used as what their bytes show; on the
passthrough path the resolved content is forwarded, never the file_id. A file id the gateway
does not have is a 404 on the translating path and is forwarded as sent on the passthrough
path (an Anthropic upstream may know it)."""

from __future__ import annotations

import base64
import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.envelopes import error_of, raw_error
from tests.support.fakes import completion
from tests.support.files_scaffold import KEY, MODEL, PNG, ask, document_file, image_file, sdk
from tests.support.samples import pdf_bytes
from tests.support.waiting import eventually

GIF = bytes.fromhex("47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b")  # 1x1 GIF


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("mime", "data", "sent_as"),
    [
        ("image/png", PNG, "image/png"),
        ("image/gif", GIF, "image/gif"),
        ("image/jpeg", PNG, "image/png"),
        ("image/webp", PNG, "image/png"),
    ],
    ids=["png", "gif", "png-uploaded-as-jpeg", "png-uploaded-as-webp"],
)
def test_an_image_file_reaches_the_model_as_a_data_url(start, upstream, mime, data, sent_as):
    client = sdk(start())
    meta = client.beta.files.upload(file=("picture", data, mime))
    upstream.json_reply(completion("a dot"))

    reply = client.messages.create(model=MODEL, max_tokens=20, messages=ask(image_file(meta.id)))

    assert reply.content[0].text == "a dot"
    parts = upstream.requests[0]["messages"][0]["content"]
    assert parts[0] == {"type": "image_url", "image_url": {"url": f"data:{sent_as};base64,{b64(data)}"}}
    assert parts[1] == {"type": "text", "text": "What is this?"}
    assert meta.id not in json.dumps(upstream.requests[0])


def test_a_pdf_file_reaches_the_model_as_its_text(start, upstream):
    client = sdk(start())
    meta = client.beta.files.upload(file=("report.pdf", pdf_bytes("Quarterly revenue rose"), "application/pdf"))
    upstream.json_reply(completion("It rose."))

    client.messages.create(
        model=MODEL, max_tokens=20, messages=ask(document_file(meta.id, title="Report", context="From finance"))
    )

    sent = json.dumps(upstream.requests[0]["messages"][0]["content"])
    assert "Quarterly revenue rose" in sent and 'title=\\"Report\\"' in sent and "From finance" in sent
    assert meta.id not in json.dumps(upstream.requests[0])


@pytest.mark.parametrize("mime", ["text/plain", "text/markdown; charset=utf-8", "text/csv", "application/json"])
def test_a_text_file_reaches_the_model_as_its_text(start, upstream, mime):
    client = sdk(start())
    content = "The launch code is 1234. Ünïcode kept."
    meta = client.beta.files.upload(file=("memo", content.encode(), mime))
    upstream.json_reply(completion("1234"))

    client.messages.create(
        model=MODEL, max_tokens=20, messages=ask(document_file(meta.id, title="Memo"), text="The code?")
    )

    sent = upstream.requests[0]["messages"][0]["content"]
    text = sent if isinstance(sent, str) else "\n".join(p["text"] for p in sent if p["type"] == "text")
    assert content in text and 'title="Memo"' in text and "The code?" in text


@pytest.mark.parametrize("charset", ["iso-8859-1", "windows-1252", '"utf-16"'])
def test_a_text_file_is_read_in_the_charset_it_was_uploaded_with(start, upstream, charset):
    client = sdk(start())
    content = "Café, naïve, Ünïcode"
    meta = client.beta.files.upload(
        file=("memo.txt", content.encode(charset.strip('"')), f"text/plain; charset={charset}")
    )

    client.messages.create(model=MODEL, max_tokens=20, messages=ask(document_file(meta.id)))

    assert content in json.dumps(upstream.requests[0]["messages"][0]["content"], ensure_ascii=False)


@pytest.mark.parametrize("charset", ["base64", "zlib", "idna", "no-such-charset"])
def test_a_declared_charset_that_is_no_text_encoding_reads_as_utf8(start, upstream, charset):
    client = sdk(start())
    content = "Café note"
    meta = client.beta.files.upload(file=("memo.txt", content.encode(), f"text/plain; charset={charset}"))

    client.messages.create(model=MODEL, max_tokens=20, messages=ask(document_file(meta.id)))  # not a 500

    assert content in json.dumps(upstream.requests[0]["messages"][0]["content"], ensure_ascii=False)


def test_the_sdks_beta_messages_with_the_files_beta(start, upstream):
    client = sdk(start())
    meta = client.beta.files.upload(file=("dot.png", PNG, "image/png"), betas=["files-api-2025-04-14"])
    upstream.json_reply(completion("a dot"))

    reply = client.beta.messages.create(
        model=MODEL, max_tokens=20, messages=ask(image_file(meta.id)), betas=["files-api-2025-04-14"]
    )

    assert reply.content[0].text == "a dot"
    assert upstream.requests[0]["messages"][0]["content"][0]["image_url"]["url"] == f"data:image/png;base64,{b64(PNG)}"


def test_a_streamed_request_gets_the_file_too(start, upstream):
    client = sdk(start())
    meta = client.beta.files.upload(file=("memo.txt", b"streamed memo text", "text/plain"))
    with client.messages.stream(model=MODEL, max_tokens=20, messages=ask(document_file(meta.id))) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "Hello!"
    assert "streamed memo text" in json.dumps(upstream.requests[0]["messages"])


def test_file_sources_in_tool_results_are_resolved(start, upstream):
    client = sdk(start())
    shot = client.beta.files.upload(file=("shot.png", PNG, "image/png"))
    log = client.beta.files.upload(file=("log.txt", b"disk almost full", "text/plain"))
    upstream.json_reply(completion("I see"))
    tools = [
        {
            "name": "screenshot",
            "description": "Take a screenshot.",
            "input_schema": {"type": "object", "properties": {}},
        }
    ]
    turns = [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_shot", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_shot", "content": [
            {"type": "text", "text": "captured"}, image_file(shot.id), document_file(log.id)]}]},
    ]  # fmt: skip

    client.messages.create(model=MODEL, max_tokens=20, tools=tools, messages=turns)

    sent = upstream.requests[0]["messages"]
    assert sent[2]["role"] == "tool" and sent[2]["tool_call_id"] == "toolu_shot"
    assert "disk almost full" in json.dumps(sent)
    images = [p for m in sent if isinstance(m.get("content"), list) for p in m["content"] if p["type"] == "image_url"]
    assert images == [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}}]
    assert shot.id not in json.dumps(sent) and log.id not in json.dumps(sent)

    turns[2]["content"][0]["content"][1] = image_file("file_011Missing")
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model=MODEL, max_tokens=20, tools=tools, messages=turns)
    assert "messages.2.content.0.content.1.source.file_id" in error_of(caught, 404, "not_found_error")
    assert len(upstream.requests) == 1


def test_bad_file_sources_are_refused_naming_the_field(start, upstream):
    client = sdk(start())
    text = client.beta.files.upload(file=("memo.txt", b"just text", "text/plain"))
    image = client.beta.files.upload(file=("dot.png", PNG, "image/png"))
    binary = client.beta.files.upload(file=("blob.bin", b"\x00\x01", "application/octet-stream"))
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]

    def refused(block: dict[str, Any], status: int, error_type: str) -> str:
        messages = [*history, {"role": "user", "content": [{"type": "text", "text": "look"}, block]}]
        error: type[anthropic.APIStatusError] = anthropic.NotFoundError if status == 404 else anthropic.BadRequestError
        with pytest.raises(error) as caught:
            client.messages.create(model=MODEL, max_tokens=10, messages=messages)
        return error_of(caught, status, error_type)

    field = "messages.2.content.1.source.file_id"
    message = refused(image_file("file_011Missing"), 404, "not_found_error")
    assert message.startswith(field) and "file_011Missing" in message
    assert refused(document_file("file_011Missing"), 404, "not_found_error").startswith(field)
    message = refused(image_file(text.id), 400, "invalid_request_error")
    assert message.startswith(field) and "text/plain" in message
    assert refused(document_file(image.id), 400, "invalid_request_error").startswith(field)
    assert refused(document_file(binary.id), 400, "invalid_request_error").startswith(field)
    bad_id = {"type": "document", "source": {"type": "file", "file_id": 42}}
    assert refused(bad_id, 400, "invalid_request_error").startswith(field)
    assert upstream.requests == []

    broken = httpx.post(f"{client.base_url}".rstrip("/") + "/v1/messages", headers={"x-api-key": KEY}, timeout=5,
                        content=b'{"model": "eyes", "messages": [{"role": "user", "content": [{"source": {"file_id": ')  # fmt: skip
    raw_error(broken, 400, "invalid_request_error")  # malformed JSON naming a file: the usual 400, not a 500
    assert upstream.requests == []

    upstream.json_reply(completion("fine"))  # the same files, each in its place, pass
    client.messages.create(model=MODEL, max_tokens=10, messages=ask(image_file(image.id), document_file(text.id)))
    assert len(upstream.requests) == 1
    mention = 'a "file_id": "file_011Missing" in plain text is only text'
    client.messages.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": mention}], extra_body={"temperature": 0.25}
    )
    assert upstream.requests[-1]["messages"][-1]["content"] == mention and upstream.requests[-1]["temperature"] == 0.25


def test_count_tokens_counts_the_files_content(start, upstream):
    client = sdk(start())
    short = client.beta.files.upload(file=("short.txt", b"tiny", "text/plain"))
    long = client.beta.files.upload(file=("long.txt", b"lorem ipsum dolor " * 200, "text/plain"))

    small = client.messages.count_tokens(model=MODEL, messages=ask(document_file(short.id)))
    big = client.messages.count_tokens(model=MODEL, messages=ask(document_file(long.id)))

    assert big.input_tokens > small.input_tokens + 400  # the file's 600 words are counted
    assert upstream.requests == []  # counting never runs the model
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.count_tokens(model=MODEL, messages=ask(image_file("file_011Missing")))
    assert "messages.0.content.0.source.file_id" in error_of(caught, 404, "not_found_error")


RAW_TEXT = "Raw notes: the launch code is 1234. Ünïcode kept.\n"


def test_raw_byte_uploads_reach_the_model_as_what_their_bytes_show(start, upstream):
    """`files.upload(file=bytes)` sends no filename and `application/octet-stream`: a PDF, a
    text or an image uploaded so is used as it would be had it been typed. Its metadata says
    what was uploaded, as on Anthropic."""
    client = sdk(start())
    pdf = client.beta.files.upload(file=pdf_bytes("Sniffed revenue rose"))
    text = client.beta.files.upload(file=RAW_TEXT.encode("utf-16"))  # with its byte order mark
    jsonl = client.beta.files.upload(file=("rows.jsonl", b'{"code": 1234}\n'))  # an extension mimetypes does not know
    image = client.beta.files.upload(file=PNG)
    assert (pdf.filename, pdf.mime_type) == ("unnamed", "application/octet-stream")
    assert (jsonl.filename, jsonl.mime_type) == ("rows.jsonl", "application/octet-stream")
    upstream.json_reply(completion("read"))

    client.messages.create(model=MODEL, max_tokens=20, messages=ask(document_file(pdf.id, title="Report"), document_file(text.id),
                                                                    document_file(jsonl.id), image_file(image.id)))  # fmt: skip

    parts = upstream.requests[0]["messages"][0]["content"]
    sent = "\n".join(part["text"] for part in parts if part["type"] == "text")
    assert "Sniffed revenue rose" in sent and 'title="Report"' in sent
    assert RAW_TEXT.strip() in sent and '{"code": 1234}' in sent
    assert {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}} in parts
    assert "file_" not in json.dumps(upstream.requests[0])


def test_passthrough_gets_raw_byte_uploads_as_it_gets_typed_ones(start, native):
    client = sdk(start(native=native))
    pdf, jpeg = pdf_bytes("Native raw report"), b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(32)
    blocks = []
    for data, typed, block in [(pdf, "application/pdf", document_file), (RAW_TEXT.encode(), "text/plain", document_file),
                               (PNG, "image/png", image_file), (jpeg, "image/jpeg", image_file), (GIF, "image/gif", image_file)]:  # fmt: skip
        raw = client.beta.files.upload(file=data)
        named = client.beta.files.upload(file=("named", data, typed))
        blocks += [block(raw.id), block(named.id)]

    client.messages.create(model="claude-test", max_tokens=10, messages=ask(*blocks))

    sent = native.requests[0][1]["messages"][0]["content"]
    for raw_block, typed_block in zip(sent[0:-1:2], sent[1:-1:2], strict=True):
        assert raw_block == typed_block  # the upstream cannot tell them apart
    assert [block["source"].get("media_type") for block in sent[0:-1:2]] == ["application/pdf", "text/plain", "image/png",
                                                                                "image/jpeg", "image/gif"]  # fmt: skip
    assert sent[2]["source"] == {"type": "text", "media_type": "text/plain", "data": RAW_TEXT}


def test_raw_bytes_that_show_no_usable_type_are_still_refused(start, upstream):
    client = sdk(start())
    archive = client.beta.files.upload(file=b"PK\x03\x04\x14\x00\x00\x00\x08\x00")
    text = client.beta.files.upload(file=RAW_TEXT.encode())
    for block, words in [(document_file(archive.id), "application/octet-stream; a document must be a PDF or text"),
                         (image_file(text.id), "is text/plain, not an image")]:  # fmt: skip
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=MODEL, max_tokens=10, messages=ask(block))
        message = error_of(caught, 400, "invalid_request_error")
        assert message.startswith("messages.0.content.0.source.file_id") and words in message
    assert upstream.requests == []


def test_passthrough_upstream_gets_the_files_content_never_the_file_id(start, native):
    client = sdk(start(native=native))
    image = client.beta.files.upload(file=("dot.png", PNG, "image/png"))
    pdf = pdf_bytes("Native report")
    report = client.beta.files.upload(file=("report.pdf", pdf, "application/pdf"))
    memo = client.beta.files.upload(file=("memo.txt", "a memo, ü".encode(), "text/plain; charset=utf-8"))

    reply = client.messages.create(
        model="claude-test", max_tokens=10,
        messages=ask(image_file(image.id), document_file(report.id, title="Report", citations={"enabled": True}), document_file(memo.id)),
        extra_body={"some_future_field": {"x": 1}},
    )  # fmt: skip

    assert reply.content[0].text == "Hi" and reply.model == "claude-test"
    path, body, headers = native.requests[0]
    assert path == "/v1/messages" and body["model"] == "native-model"
    assert body["some_future_field"] == {"x": 1}
    blocks = body["messages"][0]["content"]
    assert blocks[0] == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    assert blocks[1] == {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(pdf)},
                         "title": "Report", "citations": {"enabled": True}}  # fmt: skip
    assert blocks[2] == {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "a memo, ü"},
    }
    assert blocks[3] == {"type": "text", "text": "What is this?"}
    assert "file_id" not in json.dumps(body)
    assert headers["x-api-key"] == "upstream-secret"


def test_passthrough_gets_the_content_of_a_file_inside_a_content_document(start, native):
    client = sdk(start(native=native))
    image = client.beta.files.upload(file=("dot.png", PNG, "image/png"))
    inner = [{"type": "text", "text": "a figure"}, image_file(image.id)]
    in_tool_result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "document", "source": {"type": "content", "content": inner}}],
    }
    messages = [{"role": "user", "content": "look"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "see", "input": {}}]},
                {"role": "user", "content": [in_tool_result, {"type": "document", "source": {"type": "content", "content": inner}}]}]  # fmt: skip

    client.messages.create(model="claude-test", max_tokens=10, messages=messages)

    _, body, _ = native.requests[0]
    resolved = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    assert body["messages"][2]["content"][0]["content"][0]["source"]["content"][1] == resolved
    assert body["messages"][2]["content"][1]["source"]["content"][1] == resolved
    assert "file_id" not in json.dumps(body)  # an Anthropic upstream does not know the gateway's files


def test_passthrough_count_tokens_and_unknown_files(start, native):
    client = sdk(start(native=native))
    memo = client.beta.files.upload(file=("memo.txt", b"count these words", "text/plain"))

    client.messages.count_tokens(model="claude-test", messages=ask(document_file(memo.id)))

    path, body, _ = native.requests[0]
    assert path == "/v1/messages/count_tokens"
    assert body["messages"][0]["content"][0]["source"] == {
        "type": "text",
        "media_type": "text/plain",
        "data": "count these words",
    }
    client.messages.create(model="claude-test", max_tokens=10, messages=ask(image_file("file_011Missing")))
    assert native.requests[1][1]["messages"][0]["content"][0]["source"] == {
        "type": "file",
        "file_id": "file_011Missing",
    }  # not ours: forwarded as sent


def test_a_batch_request_naming_a_file_gets_its_content(start, upstream):
    client = sdk(start())
    memo = client.beta.files.upload(file=("memo.txt", b"the batch memo", "text/plain"))
    upstream.responder = lambda body: None  # every request: completion("Hello!")

    def params(*blocks: dict[str, Any]) -> dict[str, Any]:
        return {"model": MODEL, "max_tokens": 10, "messages": ask(*blocks)}

    created = client.messages.batches.create(requests=[
        {"custom_id": "with-file", "params": params(document_file(memo.id))},
        {"custom_id": "missing", "params": params(image_file("file_011Missing"))},
    ])  # fmt: skip
    eventually(lambda: client.messages.batches.retrieve(created.id).processing_status == "ended", "the batch ended", 10)

    results = {line.custom_id: line.result for line in client.messages.batches.results(created.id)}
    assert results["with-file"].type == "succeeded"
    assert results["missing"].type == "errored"
    assert results["missing"].error.error.type == "not_found_error"
    assert "messages.0.content.0.source.file_id" in results["missing"].error.error.message
    assert len(upstream.requests) == 1
    assert "the batch memo" in json.dumps(upstream.requests[0]["messages"])
