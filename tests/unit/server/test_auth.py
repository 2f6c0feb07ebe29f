"""auth.check: a key on every protected endpoint; auth.owner: whose files and batches a request
sees (a digest of its key, never the key)."""

from __future__ import annotations

import pytest
from starlette.datastructures import URL
from starlette.requests import Request

from dragoman.core.errors import Unauthorized
from dragoman.server import auth

KEYS = frozenset({"sk-one", "sk-two"})


def request(key: str | None = None, *, bearer: bool = False) -> Request:
    headers = (
        []
        if key is None
        else [(b"authorization", f"Bearer {key}".encode()) if bearer else (b"x-api-key", key.encode())]
    )
    return Request({"type": "http", "method": "GET", "path": "/v1/files", "headers": headers, "query_string": b""})


def test_the_owner_is_a_digest_of_the_key_not_the_key() -> None:
    one = auth.owner(request("sk-one"), KEYS, shared=False)
    assert len(one) == 32 and set(one) <= set("0123456789abcdef")
    assert "sk-one" not in one
    assert auth.owner(request("sk-one"), KEYS, shared=False) == one  # stable
    assert auth.owner(request("sk-one", bearer=True), KEYS, shared=False) == one  # whichever header carries it


def test_each_key_is_its_own_owner() -> None:
    assert auth.owner(request("sk-one"), KEYS, shared=False) != auth.owner(request("sk-two"), KEYS, shared=False)


def test_the_owner_is_empty_when_keys_are_shared_or_absent() -> None:
    assert auth.owner(request("sk-one"), KEYS, shared=True) == ""
    assert auth.owner(request("sk-two"), KEYS, shared=True) == ""
    assert auth.owner(request("anything"), frozenset(), shared=False) == ""
    assert auth.owner(request(), frozenset(), shared=False) == ""


def test_keys_of_one_tenant_are_one_owner_and_other_keys_are_not() -> None:
    tenants = {"sk-old": "team-a", "sk-new": "team-a"}
    keys = KEYS | frozenset(tenants)
    old = auth.owner(request("sk-old"), keys, shared=False, tenants=tenants)
    assert old == auth.owner(
        request("sk-new", bearer=True), keys, shared=False, tenants=tenants
    )  # a rotated key keeps its data
    assert old != auth.owner(request("sk-one"), keys, shared=False, tenants=tenants)
    assert "team-a" not in old and len(old) == 32
    assert auth.owner(request("sk-old"), keys, shared=True, tenants=tenants) == ""


def test_the_caller_names_its_key_by_a_digest_and_its_tenant() -> None:
    tenants = {"sk-one": "team-a"}
    one = auth.caller(request("sk-one"), KEYS, shared=False, tenants=tenants)
    two = auth.caller(request("sk-two", bearer=True), KEYS, shared=False, tenants=tenants)
    assert one.tenant == "team-a" and two.tenant is None
    assert one.key_id is not None and one.key_id.startswith("key_") and "sk-one" not in one.key_id
    assert one.key_id != two.key_id
    assert auth.caller(request("sk-one", bearer=True), KEYS, shared=False).key_id == one.key_id
    assert one.owner == auth.owner(request("sk-one"), KEYS, shared=False, tenants=tenants)


def test_without_keys_the_caller_has_no_key_id() -> None:
    nobody = auth.caller(request(), frozenset(), shared=False)
    assert nobody.key_id is None and nobody.tenant is None and nobody.owner == ""


class _PoisonedUrl(Request):
    """A request as Starlette before 1.0.1 builds it for `Host: x/?`: its URL reads as `/`."""

    @property
    def url(self) -> URL:  # type: ignore[override]
        return URL("http://x/?/v1/files")


def test_a_key_is_asked_for_whatever_the_host_header_makes_the_url_read() -> None:
    poisoned = _PoisonedUrl(request().scope)
    assert poisoned.url.path == "/"
    with pytest.raises(Unauthorized):
        auth.check(poisoned, KEYS)
    auth.check(_PoisonedUrl(request("sk-one").scope), KEYS)  # a good key still passes
