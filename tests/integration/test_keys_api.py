"""The Admin API's keys on one gateway (SQLite beside the usage records), with the SDK."""

from __future__ import annotations

import json
import logging
from typing import Any

import anthropic
import pytest

from dragoman.keys.records import key_id
from tests.support.fakes import FakeUpstream, completion
from tests.support.keys import ADMIN, admin, ask, create, keys_config, listing, retrieve, update


@pytest.fixture
def url(upstream: FakeUpstream, gateway_from: Any) -> str:
    server = gateway_from(keys_config(upstream.url, server={"default_model": "test-model"}))
    return server.url


def test_a_key_made_through_the_api_answers_and_is_shown_without_its_secret(url: str, upstream: FakeUpstream) -> None:
    made = create(url, name="alice", tenant="team-a", limits={"requests_per_minute": 100})
    secret = made["key"]
    assert secret.startswith("sk-dm-") and made["type"] == "api_key" and made["status"] == "active"
    assert made["name"] == "alice" and made["tenant"] == "team-a" and made["source"] == "api"
    assert made["partial_key_hint"].endswith(secret[-4:]) and secret not in made["partial_key_hint"]
    assert made["created_by"]["id"].startswith("key_") and made["limits"] == {"requests_per_minute": 100}
    upstream.json_reply(completion("hello"))
    assert ask(url, secret).content[0].text == "hello"
    shown = retrieve(url, made["id"])
    assert "key" not in shown and secret not in str(shown)
    assert shown["id"] == made["id"] and shown["created_at"] == made["created_at"]


def test_revoked_or_expired_keys_are_refused_as_the_sdk_expects(url: str, upstream: FakeUpstream) -> None:
    made = create(url, name="bob")
    update(url, made["id"], status="inactive")
    with pytest.raises(anthropic.AuthenticationError, match="inactive"):
        ask(url, made["key"])
    update(url, made["id"], status="active", expires_at="2020-01-01T00:00:00Z")
    assert retrieve(url, made["id"])["status"] == "expired"
    with pytest.raises(anthropic.AuthenticationError, match="expired"):
        ask(url, made["key"])
    update(url, made["id"], expires_at=None)
    upstream.json_reply(completion("back"))
    assert ask(url, made["key"]).content[0].text == "back"


def test_a_model_outside_the_keys_models_is_a_permission_error_naming_them(url: str, upstream: FakeUpstream) -> None:
    made = create(url, name="carol", models=["test-*"])
    upstream.json_reply(completion("ok"))
    ask(url, made["key"], model="test-model")
    with pytest.raises(anthropic.PermissionDeniedError, match="test-\\*"):
        ask(url, made["key"], model="other-model")


def test_a_keys_own_rate_limit_is_a_rate_limit_error(url: str, upstream: FakeUpstream) -> None:
    made = create(url, name="dave", limits={"requests_per_minute": 1})
    upstream.json_reply(completion("one"))
    ask(url, made["key"])
    with pytest.raises(anthropic.RateLimitError, match="requests_per_minute"):
        ask(url, made["key"])


def test_a_deleted_key_is_gone_and_refused(url: str) -> None:
    made = create(url, name="erin")
    gone = admin(url).delete(f"/v1/organizations/api_keys/{made['id']}", cast_to=object)
    assert gone == {"id": made["id"], "type": "api_key_deleted"}
    with pytest.raises(anthropic.NotFoundError):
        retrieve(url, made["id"])
    with pytest.raises(anthropic.AuthenticationError):
        ask(url, made["key"])


def test_the_list_pages_as_anthropics_does(url: str) -> None:
    ids = [create(url, name=f"k{n}", tenant="t1" if n % 2 else None)["id"] for n in range(5)]
    newest_first = ids[::-1]
    page = listing(url, limit=2)
    assert [k["id"] for k in page["data"]] == newest_first[:2] and page["has_more"]
    assert page["first_id"] == newest_first[0] and page["last_id"] == newest_first[1]
    after = listing(url, limit=2, after_id=page["last_id"])
    assert [k["id"] for k in after["data"]] == newest_first[2:4]
    before = listing(url, limit=2, before_id=after["first_id"])
    assert [k["id"] for k in before["data"]] == newest_first[:2] and not before["has_more"]
    everything = listing(url, limit=1000)
    assert [k["id"] for k in everything["data"]][:5] == newest_first
    assert any(k["source"] == "config" and k["role"] == "admin" for k in everything["data"])
    assert [k["id"] for k in listing(url, tenant="t1")["data"]] == [i for i in newest_first if ids.index(i) % 2]
    update(url, ids[0], status="archived")
    assert [k["id"] for k in listing(url, status="archived")["data"]] == [ids[0]]


@pytest.mark.parametrize(("body", "field"), [
    ({}, "name"), ({"name": 5}, "name"), ({"name": "x", "limits": {"requests_per_minute": 0}}, "limits.requests_per_minute"),
    ({"name": "x", "limits": {"rpm": 1}}, "limits.rpm"), ({"name": "x", "budget": {"amount": "ten"}}, "budget.amount"),
    ({"name": "x", "budget": {"amount": "5", "period": "year"}}, "budget.period"),
    ({"name": "x", "expires_at": "soon"}, "expires_at"), ({"name": "x", "role": "admin", "models": ["a"]}, "models"),
])  # fmt: skip
def test_a_bad_body_is_a_400_naming_its_field(url: str, body: dict[str, Any], field: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as error:
        create(url, **body)
    assert error.value.status_code == 400
    assert error.value.body["error"]["message"].startswith(f"{field}:")  # type: ignore[index]


def test_only_admin_keys_manage_keys_and_admin_keys_call_no_model(url: str) -> None:
    client = create(url, name="frank")
    with pytest.raises(anthropic.PermissionDeniedError):
        admin(url, client["key"]).get("/v1/organizations/api_keys", cast_to=object)
    with pytest.raises(anthropic.AuthenticationError):
        admin(url, "sk-dm-not-a-key").get("/v1/organizations/api_keys", cast_to=object)
    with pytest.raises(anthropic.PermissionDeniedError, match="admin key"):
        ask(url, ADMIN)
    second = create(url, name="ops", role="admin")
    assert second["role"] == "admin" and second["key"].startswith("sk-dm-admin-")
    assert listing(url, limit=1) and admin(url, second["key"]).get("/v1/organizations/api_keys", cast_to=object)
    with pytest.raises(anthropic.PermissionDeniedError, match="admin key"):
        ask(url, second["key"])
    configured = next(k for k in listing(url, limit=1000)["data"] if k["source"] == "config")
    with pytest.raises(anthropic.PermissionDeniedError, match="configuration"):
        update(url, configured["id"], name="renamed")


def test_each_change_is_one_access_line_naming_who_what_and_which_key(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="dragoman.access"):
        made = create(url, name="gina")
        update(url, made["id"], name="gina2")
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "dragoman.access"]
    changes = [(line["admin_action"], line["api_key_id"], line["key_id"]) for line in lines if "admin_action" in line]
    admin_id = retrieve(url, made["id"])["created_by"]["id"]
    assert changes == [("create", made["id"], admin_id), ("update", made["id"], admin_id)]
    assert retrieve(url, made["id"])["updated_by"]["id"] == admin_id


def test_a_configured_key_has_limits_of_its_own_by_its_id(upstream: FakeUpstream, gateway_from: Any) -> None:
    url = gateway_from({"server": {"tenants": {"team": ["sk-one", "sk-two"]}},
                        "limits": {"keys": {key_id("sk-one"): {"requests_per_minute": 1}}},
                        "upstreams": {"default": {"url": upstream.url, "max_retries": 0}}}).url  # fmt: skip
    ask(url, "sk-one")
    with pytest.raises(anthropic.RateLimitError, match=f"limits.keys.{key_id('sk-one')}.requests_per_minute"):
        ask(url, "sk-one")
    for _ in range(3):
        ask(url, "sk-two")  # the same tenant, no limit of its own


def test_the_sdks_own_admin_api_keys_methods_read_and_page_them(url: str) -> None:
    ids = {create(url, name=f"s{n}", tenant="team-s")["id"] for n in range(3)}
    keys = anthropic.Anthropic(base_url=url, api_key=ADMIN, max_retries=0).beta.organization.api_keys
    listed = list(keys.list(limit=2))  # the SDK follows after_id from page to page
    assert ids <= {k.id for k in listed} and len(listed) == len({k.id for k in listed})
    one = keys.retrieve(next(iter(ids)))
    assert one.type == "api_key" and one.scope.type == "workspace" and one.created_at.tzinfo is not None
    assert one.created_by is not None and (one.created_by.id, one.created_by.type) == (key_id(ADMIN), "service_account")
    configured = [k for k in keys.list(limit=1000) if k.id == key_id(ADMIN)]  # listed read-only, made by no one
    assert len(configured) == 1 and configured[0].created_by is None
    changed = keys.update(one.id, name="renamed", status="archived")
    assert (changed.name, changed.status) == ("renamed", "archived")
