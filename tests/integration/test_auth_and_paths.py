"""Client authentication, the URL shapes clients use, and the models API."""

from __future__ import annotations

import http.client
import json

import anthropic
import httpx
import pytest

from tests.support.fakes import completion, text_stream

USER = [{"role": "user", "content": "Hello"}]
VALID = {"model": "test-model", "max_tokens": 10, "messages": USER}


def _assert_error(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type
    assert body["request_id"] == response.headers["request-id"]
    return body["error"]["message"]


# -- authentication ---------------------------------------------------------------------


@pytest.fixture
def keyed(make_gateway):
    return make_gateway(server={"api_keys": ["sk-good-1", "sk-good-2"]})


def test_missing_key_is_401(keyed, upstream):
    response = httpx.post(f"{keyed.url}/v1/messages", json=VALID, timeout=5)
    message = _assert_error(response, 401, "authentication_error")
    assert "x-api-key" in message
    assert response.headers.get("x-should-retry") == "false"
    _assert_error(httpx.get(f"{keyed.url}/v1/models", timeout=5), 401, "authentication_error")
    _assert_error(
        httpx.post(f"{keyed.url}/v1/messages/count_tokens", json=VALID, timeout=5), 401, "authentication_error"
    )
    assert upstream.requests == []


def test_wrong_key_is_401(keyed, upstream):
    client = anthropic.Anthropic(base_url=keyed.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client.messages.create(**VALID)
    assert caught.value.status_code == 401
    assert caught.value.body["error"]["type"] == "authentication_error"
    bearer = anthropic.Anthropic(base_url=keyed.url, api_key=None, auth_token="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as by_bearer:
        bearer.messages.create(**VALID)
    assert (
        by_bearer.value.body["error"]["message"] == "invalid API key in the authorization header"
    )  # the header it came in
    by_header = httpx.post(f"{keyed.url}/v1/messages", json=VALID, headers={"x-api-key": "sk-wrong"}, timeout=5)
    assert _assert_error(by_header, 401, "authentication_error") == "invalid x-api-key"
    # Auth is checked before the body is even read.
    response = httpx.post(f"{keyed.url}/v1/messages", content=b"{broken", headers={"x-api-key": "nope"}, timeout=5)
    _assert_error(response, 401, "authentication_error")
    assert upstream.requests == []


def test_two_x_api_key_headers_are_refused_whichever_is_right(keyed, upstream):
    for keys in (["sk-good-1", "sk-wrong"], ["sk-wrong", "sk-good-1"], ["sk-good-1", "sk-good-1"]):
        headers = [("x-api-key", key) for key in keys] + [("content-type", "application/json")]
        response = httpx.post(
            f"{keyed.url}/v1/messages", content=json.dumps(VALID).encode(), headers=headers, timeout=5
        )
        assert "more than once" in _assert_error(response, 401, "authentication_error")
    assert upstream.requests == []


def test_x_api_key_and_bearer_are_both_accepted(keyed, upstream):
    by_key = anthropic.Anthropic(base_url=keyed.url, api_key="sk-good-1", max_retries=0)
    by_bearer = anthropic.Anthropic(base_url=keyed.url, api_key=None, auth_token="sk-good-2", max_retries=0)
    assert by_key.messages.create(**VALID).content[0].text == "Hello!"
    assert by_bearer.messages.create(**VALID).content[0].text == "Hello!"
    with by_bearer.messages.stream(**VALID) as stream:
        stream.until_done()
    assert by_key.models.list().data
    assert len(upstream.requests) == 3
    # The client's key is never forwarded to the upstream.
    for headers in upstream.headers:
        assert "sk-good" not in str(headers)


PROTECTED = [
    ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"), ("GET", "/v1/models"),
    ("GET", "/v1/models/test-model"), ("POST", "/v1/messages/batches"), ("GET", "/v1/messages/batches"),
    ("GET", "/v1/messages/batches/msgbatch_x"), ("DELETE", "/v1/messages/batches/msgbatch_x"),
    ("POST", "/v1/messages/batches/msgbatch_x/cancel"), ("GET", "/v1/messages/batches/msgbatch_x/results"),
    ("POST", "/v1/files"), ("GET", "/v1/files"), ("GET", "/v1/files/file_x"), ("DELETE", "/v1/files/file_x"),
    ("GET", "/v1/files/file_x/content"), ("POST", "/v1/v1/messages"), ("GET", "/v1/v1/models"),
]  # fmt: skip


@pytest.mark.parametrize("host", ["x/?", "x/?/health", "x#"])
def test_a_host_header_that_makes_the_url_read_as_an_open_path_still_needs_a_key(keyed, upstream, host):
    """CVE-2026-48710: before Starlette 1.0.1 `Host: x/?` made `request.url.path` read `/`."""
    for method, path in PROTECTED:
        connection = http.client.HTTPConnection("127.0.0.1", keyed.port, timeout=5)
        try:
            connection.putrequest(method, path, skip_host=True)
            connection.putheader("Host", host)
            connection.putheader("content-type", "application/json")
            connection.putheader("content-length", str(len(json.dumps(VALID))))
            connection.endheaders(json.dumps(VALID).encode())
            response = connection.getresponse()
            body = json.loads(response.read())
        finally:
            connection.close()
        assert response.status == 401, (method, path, body)
        assert body["error"]["type"] == "authentication_error"
    assert upstream.requests == []


def test_open_paths_need_no_key(keyed):
    assert httpx.get(f"{keyed.url}/", timeout=5).status_code == 200
    assert httpx.head(f"{keyed.url}/", timeout=5).status_code == 200
    assert httpx.get(f"{keyed.url}/health", timeout=5).status_code == 200


def test_api_keys_from_the_environment(make_gateway, monkeypatch):
    monkeypatch.setenv("DRAGOMAN_TEST_KEYS", "env-key-1, env-key-2")
    gateway = make_gateway(server={"api_keys_env": "DRAGOMAN_TEST_KEYS"})
    ok = anthropic.Anthropic(base_url=gateway.url, api_key="env-key-2", max_retries=0)
    assert ok.messages.create(**VALID).content
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gateway.url, api_key="other", max_retries=0).messages.create(**VALID)


def test_without_keys_there_is_no_auth(gateway):
    response = httpx.post(f"{gateway.url}/v1/messages", json=VALID, timeout=5)
    assert response.status_code == 200
    response = httpx.post(f"{gateway.url}/v1/messages", json=VALID, headers={"x-api-key": "anything"}, timeout=5)
    assert response.status_code == 200


# -- paths ----------------------------------------------------------------------------


def test_beta_query_string(gateway, client, upstream):
    message = client.beta.messages.create(**VALID, betas=["context-management-2025-06-27"])
    assert message.content[0].text == "Hello!"
    response = httpx.post(f"{gateway.url}/v1/messages?beta=true", json=VALID, timeout=5)
    assert response.status_code == 200 and response.json()["type"] == "message"


def test_doubled_v1_prefix(gateway, upstream):
    # A base URL that already ends in /v1.
    client = anthropic.Anthropic(base_url=f"{gateway.url}/v1", api_key="k", max_retries=0)
    assert client.messages.create(**VALID).content[0].text == "Hello!"
    upstream.stream_reply(text_stream("streamed"))
    with client.messages.stream(**VALID) as stream:
        assert stream.get_final_message().content
    assert client.models.list().data[0].id == "test-model"
    assert client.messages.count_tokens(model="test-model", messages=USER).input_tokens > 0


def test_head_and_get_root(gateway):
    head = httpx.head(f"{gateway.url}/", timeout=5)
    assert head.status_code == 200
    assert head.headers["request-id"].startswith("req_")
    assert httpx.get(f"{gateway.url}/", timeout=5).status_code == 200


def test_health(gateway):
    assert httpx.get(f"{gateway.url}/health", timeout=5).json() == {"status": "ok"}


def test_trailing_slash_and_unknown_subpaths(gateway):
    response = httpx.post(f"{gateway.url}/v1/complete", json=VALID, timeout=5)
    _assert_error(response, 404, "not_found_error")
    slash = httpx.post(f"{gateway.url}/v1/messages/", json=VALID, timeout=5)  # not a redirect without a body
    assert "/v1/messages/" in _assert_error(slash, 404, "not_found_error")


def test_count_tokens(client, upstream):
    count = client.messages.count_tokens(model="test-model", messages=USER, system="Be brief.")
    assert count.input_tokens > 0
    bigger = client.messages.count_tokens(model="test-model", messages=[{"role": "user", "content": "Hello " * 200}])
    assert bigger.input_tokens > count.input_tokens


# -- models API ---------------------------------------------------------------------------


MODELS = [{"id": f"model-{name}", "object": "model", "owned_by": "vllm"} for name in ("a", "b", "c")]


@pytest.fixture
def three_models(upstream, make_gateway):
    upstream.models = MODELS  # before the gateway starts and discovers them
    return make_gateway()


def test_models_list_in_anthropic_shape(three_models, upstream):
    response = httpx.get(f"{three_models.url}/v1/models", headers={"anthropic-version": "2023-06-01"}, timeout=5)
    assert response.status_code == 200
    page = response.json()
    assert set(page) >= {"data", "has_more", "first_id", "last_id"}
    assert [m["id"] for m in page["data"]] == ["model-a", "model-b", "model-c"]
    assert page["has_more"] is False and page["first_id"] == "model-a" and page["last_id"] == "model-c"
    for info in page["data"]:
        assert info["type"] == "model"
        assert info["display_name"]
        assert info["created_at"].endswith("Z")
        assert info["lifecycle"] == "active"  # the fields the TypeScript SDK types as present
        assert {k: info[k] for k in ("capabilities", "deprecated_at", "retires_at", "line")} == dict.fromkeys(
            ("capabilities", "deprecated_at", "retires_at", "line")
        )


@pytest.mark.parametrize(("query", "ids"), [("lifecycle=retired", []), ("lifecycle=deprecated,retired", []),
                                            ("lifecycle=active", ["model-a", "model-b", "model-c"]),
                                            ("lifecycle[]=retired&lifecycle[]=active", ["model-a", "model-b", "model-c"])])  # fmt: skip
def test_models_list_filters_on_lifecycle(three_models, query, ids):
    page = httpx.get(f"{three_models.url}/v1/models?{query}", timeout=5).json()
    assert [m["id"] for m in page["data"]] == ids


def test_models_list_refuses_an_unknown_lifecycle(three_models):
    response = httpx.get(f"{three_models.url}/v1/models?lifecycle=sunset", timeout=5)
    assert _assert_error(response, 400, "invalid_request_error").startswith("lifecycle: 'sunset'")


def test_models_pagination_with_the_sdk(three_models):
    client = anthropic.Anthropic(base_url=three_models.url, api_key="k", max_retries=0)
    first = client.models.list(limit=2)
    assert [m.id for m in first.data] == ["model-a", "model-b"]
    assert first.has_more is True and first.last_id == "model-b"
    assert [m.id for m in client.models.list(limit=2, after_id="model-b").data] == ["model-c"]
    assert [m.id for m in client.models.list(limit=1, before_id="model-c").data] == ["model-b"]
    assert [m.id for m in client.models.list(limit=1)] == ["model-a", "model-b", "model-c"]  # auto-pagination


def test_models_list_bad_parameters(three_models):
    _assert_error(httpx.get(f"{three_models.url}/v1/models?limit=0", timeout=5), 400, "invalid_request_error")
    _assert_error(httpx.get(f"{three_models.url}/v1/models?limit=abc", timeout=5), 400, "invalid_request_error")
    first = httpx.get(f"{three_models.url}/v1/models?limit=1", timeout=5).json()["first_id"]
    both = httpx.get(f"{three_models.url}/v1/models?after_id={first}&before_id={first}", timeout=5)
    assert _assert_error(both, 400, "invalid_request_error").startswith("before_id, after_id:")


def test_model_retrieve(three_models):
    client = anthropic.Anthropic(base_url=three_models.url, api_key="k", max_retries=0)
    info = client.models.retrieve("model-b")
    assert info.id == "model-b" and info.type == "model"
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.models.retrieve("model-z")
    assert caught.value.body["error"]["type"] == "not_found_error"


def test_model_ids_with_slashes(upstream, make_gateway):
    upstream.models = [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm"}]
    gateway = make_gateway()
    upstream.json_reply(completion("hi"))
    response = httpx.get(f"{gateway.url}/v1/models/Qwen/Qwen3-8B", timeout=5)
    assert response.status_code == 200 and response.json()["id"] == "Qwen/Qwen3-8B"
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    assert client.messages.create(model="Qwen/Qwen3-8B", max_tokens=5, messages=USER).model == "Qwen/Qwen3-8B"
    assert upstream.requests[-1]["model"] == "Qwen/Qwen3-8B"


def test_configured_models_and_aliases_are_listed(make_gateway):
    gateway = make_gateway(
        models=[
            {
                "name": "claude-sonnet-4-6",
                "upstream": "default",
                "upstream_model": "test-model",
                "aliases": ["sonnet", "claude-*"],
                "context_window": 32768,
            }
        ]  # fmt: skip
    )
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    ids = [m.id for m in client.models.list()]
    assert ids[:2] == ["claude-sonnet-4-6", "sonnet"]
    assert "claude-*" not in ids  # wildcards route but are not models
    assert client.models.retrieve("claude-sonnet-4-6").max_input_tokens == 32768


@pytest.mark.parametrize("name", ["claude-3-5-haiku-latest", "claude-opus-4-1-20250805"])
def test_a_name_served_by_a_wildcard_alias_is_retrieved_though_not_listed(make_gateway, name):
    gateway = make_gateway(
        models=[{"name": "coder", "upstream": "default", "upstream_model": "test-model", "aliases": ["claude-*"]}]
    )
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    assert name not in [m.id for m in client.models.list(limit=1000)]
    info = client.models.retrieve(name)
    assert info.id == name and "test-model" in info.display_name


def test_a_name_served_by_the_default_model_is_retrieved(make_gateway):
    gateway = make_gateway(server={"default_model": "test-model"})
    client = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    assert client.models.retrieve("claude-sonnet-4-5").id == "claude-sonnet-4-5"


def test_a_compressed_request_body_is_refused_naming_the_header(gateway, upstream):
    import gzip

    body = gzip.compress(json.dumps(VALID).encode())
    response = httpx.post(f"{gateway.url}/v1/messages", content=body, headers={"content-encoding": "gzip", "content-type": "application/json"},
                          timeout=5)  # fmt: skip
    assert _assert_error(response, 400, "invalid_request_error").startswith("content-encoding: 'gzip'")
    assert upstream.requests == []
