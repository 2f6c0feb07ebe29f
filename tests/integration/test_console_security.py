"""The console's doors, over a real socket: sessions, roles, forged requests, cookie flags."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.console import DATA, PAGES, csrf, form_token, session, signin
from tests.support.fakes import FakeUpstream, completion
from tests.support.keys import ADMIN, ask, create, keys_config, retrieve, update
from tests.support.postgres import pg_url  # noqa: F401 (fixture)


@pytest.fixture
def url(upstream: FakeUpstream, gateway_from: Any) -> str:
    return gateway_from(keys_config(upstream.url, server={"default_model": "test-model"})).url


def test_the_console_is_off_without_an_admin_key_and_says_how_to_turn_it_on(gateway: Any) -> None:
    for path in ("/console", "/console/signin", "/console/data/overview"):
        answer = httpx.get(gateway.url + path, follow_redirects=False)
        assert answer.status_code == 404
        assert "admin key" in answer.json()["error"]["message"] and "[admin]" in answer.json()["error"]["message"]


def test_without_a_session_pages_redirect_to_sign_in_and_data_is_a_401(url: str) -> None:
    for path in (*PAGES, "/console/me"):
        answer = httpx.get(url + path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"] == "/console/signin", path
    for name in DATA:
        answer = httpx.get(f"{url}/console/data/{name}")
        assert answer.status_code == 401 and answer.json()["error"]["type"] == "authentication_error", name
    assert httpx.post(f"{url}/console/data/keys", json={"name": "x"}).status_code == 401


def test_the_session_cookie_carries_its_flags_and_never_the_key(url: str) -> None:
    with httpx.Client(base_url=url, follow_redirects=False) as client:
        answer = signin(client, ADMIN)
        assert answer.status_code == 303 and answer.headers["location"] == "/console"
        cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith("dragoman_console="))
        flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
        assert {"httponly", "max-age", "path"} <= flags and "samesite=strict" in cookie.lower()
        assert "secure" not in flags  # plain HTTP: a Secure cookie would never come back
        assert ADMIN not in cookie and ADMIN not in answer.headers.get("location", "")
        page = client.get("/console/keys")
        assert page.status_code == 200 and ADMIN not in page.text
        policy = page.headers["content-security-policy"]
        assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy and "unsafe" not in policy
        assert page.headers["cache-control"] == "no-store" and page.headers["x-frame-options"] == "DENY"
        assert client.get("/console/signin").headers["location"] == "/console"  # signed in already
    with httpx.Client(base_url=url, follow_redirects=False) as behind_tls:
        answer = signin(behind_tls, ADMIN, **{"x-forwarded-proto": "https"})
        cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith("dragoman_console="))
        assert "secure" in {part.strip().lower() for part in cookie.split(";")}


def test_a_wrong_or_revoked_key_cannot_sign_in(url: str) -> None:
    with httpx.Client(base_url=url, follow_redirects=False) as client:
        answer = signin(client, "sk-not-a-key")
        assert answer.status_code == 401 and "not valid" in answer.text and "sk-not-a-key" not in answer.text
        made = create(url, name="gone")
        update(url, made["id"], status="inactive")
        assert signin(client, made["key"]).status_code == 401


def test_a_client_key_sees_only_its_own_page(url: str) -> None:
    made = create(url, name="alice", limits={"requests_per_minute": 7})
    with session(url, made["key"]) as (client, _):
        assert client.get("/console/me").status_code == 200
        for path in PAGES:
            assert client.get(path).status_code == 403, path
        for name in DATA:
            assert client.get(f"/console/data/{name}").status_code == 403, name
        mine = client.get("/console/data/me")
        assert mine.status_code == 200 and mine.json()["key"]["id"] == made["id"]


def test_a_forged_cross_site_post_is_refused(url: str) -> None:
    with session(url, ADMIN) as (client, token):
        forged = [
            {},  # no token: a plain cross-site form or fetch
            {"x-csrf-token": "forged"},
            {"x-csrf-token": token, "origin": "https://evil.example"},
            {"x-csrf-token": token, "sec-fetch-site": "cross-site"},
        ]
        for headers in forged:
            answer = client.post("/console/data/keys", json={"name": "forged"}, headers=headers)
            assert answer.status_code == 403 and answer.json()["error"]["type"] == "permission_error", headers
        assert all(k["name"] != "forged" for k in client.get("/console/data/keys").json()["data"])
        made = client.post("/console/data/keys", json={"name": "real"}, headers={"x-csrf-token": token, "origin": url})
        assert made.status_code == 200 and made.json()["key"].startswith("sk-dm-")
    with httpx.Client(base_url=url, follow_redirects=False) as other:
        token = form_token(other.get("/console/signin").text)  # a token, but posted from another site
        answer = other.post(
            "/console/signin", data={"key": ADMIN, "csrf": token}, headers={"origin": "https://evil.example"}
        )
        assert answer.status_code == 403 and "dragoman_console=" not in answer.headers.get("set-cookie", "")
    no_cookie = httpx.post(f"{url}/console/signin", data={"key": ADMIN, "csrf": token}, follow_redirects=False)
    assert no_cookie.status_code == 403  # the double-submit cookie missing: a forged form


def test_a_tampered_cookie_or_a_revoked_admin_key_ends_the_session(url: str) -> None:
    admin_key = create(url, name="second admin", role="admin")
    with session(url, admin_key["key"]) as (client, _):
        value = client.cookies["dragoman_console"]
        client.cookies.set(
            "dragoman_console", value[:-2] + ("AA" if not value.endswith("AA") else "BB"), path="/console"
        )
        assert client.get("/console/data/keys").status_code == 401
        client.cookies.set("dragoman_console", value, path="/console")
        assert client.get("/console/data/keys").status_code == 200
        update(url, admin_key["id"], status="inactive")
        assert client.get("/console/data/keys").status_code == 401
        assert client.get("/console/keys").status_code == 303


def test_key_changes_go_through_the_admin_api(url: str, upstream: FakeUpstream) -> None:
    with session(url, ADMIN) as (client, token):
        headers = {"x-csrf-token": token}
        made = client.post("/console/data/keys", headers=headers,
                           json={"name": "bob", "limits": {"requests_per_minute": 5}, "models": ["test-*"]}).json()  # fmt: skip
        shown = retrieve(url, made["id"])
        assert shown["limits"] == {"requests_per_minute": 5} and shown["models"] == ["test-*"]
        assert shown["created_by"]["id"] == made["created_by"]["id"]
        bad = client.post(f"/console/data/keys/{made['id']}", headers=headers, json={"limits": {"max_concurrent": 0}})
        assert bad.status_code == 400 and "limits.max_concurrent" in bad.json()["error"]["message"]
        upstream.json_reply(completion("hi"))
        assert ask(url, made["key"]).content[0].text == "hi"
        revoked = client.post(f"/console/data/keys/{made['id']}", headers=headers, json={"status": "inactive"})
        assert revoked.status_code == 200 and revoked.json()["status"] == "inactive"
        with pytest.raises(anthropic.AuthenticationError):
            ask(url, made["key"])
        assert csrf(client.get("/console/keys").text) == token  # one token for the whole session


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_session_made_on_one_replica_is_read_on_another(upstream: FakeUpstream, gateway_from: Any, database: str,
                                                          request: pytest.FixtureRequest) -> None:  # fmt: skip
    """Two gateways sharing the keys' database (its SQLite file, or PostgreSQL) share the signing secret."""
    usage = {"database_url": request.getfixturevalue("pg_url")} if database == "postgres" else {}
    config = keys_config(upstream.url, server={"default_model": "test-model"}, usage=usage)
    one, two = gateway_from(config).url, gateway_from(config).url
    with session(one, ADMIN) as (client, token):
        cookie = client.cookies["dragoman_console"]
    with httpx.Client(base_url=two, cookies={"dragoman_console": cookie}) as other:
        assert other.get("/console/data/keys").status_code == 200
        made = other.post("/console/data/keys", json={"name": "elsewhere"}, headers={"x-csrf-token": token})
        assert made.status_code == 200


def test_a_configured_secret_signs_sessions(upstream: FakeUpstream, gateway_from: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("CONSOLE_SECRET", "s" * 32)
    signed = gateway_from(keys_config(upstream.url, console={"session_secret_env": "CONSOLE_SECRET"})).url
    other = gateway_from(keys_config(upstream.url)).url  # the same database, the stored secret instead
    with session(signed, ADMIN) as (client, _):
        cookie = client.cookies["dragoman_console"]
        assert client.get("/console/data/keys").status_code == 200
    with httpx.Client(base_url=other, cookies={"dragoman_console": cookie}) as elsewhere:
        assert elsewhere.get("/console/data/keys").status_code == 401


def test_no_key_signed_in_with_or_made_in_the_console_is_written_anywhere(
    upstream: FakeUpstream, gateway_from: Any, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    usage_dir = tmp_path / "usage"
    server = gateway_from(
        keys_config(upstream.url, usage={"dir": str(usage_dir)}, server={"default_model": "test-model"})
    )
    url, seen = server.url, []
    with session(url, ADMIN) as (client, token):
        made = client.post("/console/data/keys", json={"name": "dana"}, headers={"x-csrf-token": token}).json()
        secret = made["key"]
        upstream.json_reply(completion("hi"))
        ask(url, secret)
        for path in (*PAGES, *(f"/console/data/{name}" for name in DATA)):
            answer = client.get(path)
            seen.append(answer.text + str(answer.headers))
        seen.append(str(client.cookies))
    for key in (secret, secret + "x"):
        with httpx.Client(base_url=url, follow_redirects=False) as other:
            answer = signin(other, key)
            seen += [answer.text, str(answer.headers), str(other.cookies)]
            seen += [other.get("/console/me").text, other.get("/console/data/me").text]
    server.stop()
    seen.append(caplog.text)
    stored = b"".join(p.read_bytes() for p in usage_dir.iterdir() if p.is_file())
    assert stored and secret.encode() not in stored and ADMIN.encode() not in stored
    everything = "\n".join(seen)
    assert made["id"] in everything
    for key in (secret, ADMIN, secret[6:]):
        assert key not in everything
