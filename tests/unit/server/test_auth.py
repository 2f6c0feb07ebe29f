"""auth.check: a key on every protected endpoint; auth.owner: whose files and batches a request
sees (a digest of its key, never the key)."""

from __future__ import annotations

import pytest
from starlette.datastructures import URL
from starlette.requests import Request

from dragoman.core.errors import PermissionDenied, Unauthorized
from dragoman.keys.records import Grant
from dragoman.keys.ring import Keyring
from dragoman.server import auth

KEYS = frozenset({"sk-one", "sk-two"})
RING = Keyring(KEYS, admins=["sk-admin"], tenants={"sk-one": "team-a", "sk-old": "team-a"})


def request(key: str | None = None, *, bearer: bool = False) -> Request:
    headers = (
        []
        if key is None
        else [(b"authorization", f"Bearer {key}".encode()) if bearer else (b"x-api-key", key.encode())]
    )
    return Request({"type": "http", "method": "GET", "path": "/v1/files", "headers": headers, "query_string": b""})


def _owner(key: str | None, *, bearer: bool = False, ring: Keyring = RING, shared: bool = False) -> str:
    req = request(key, bearer=bearer)
    return auth.owner(req, auth.check(req, ring), shared=shared)


def test_the_owner_is_a_digest_of_the_key_not_the_key() -> None:
    two = _owner("sk-two")
    assert two and "sk-two" not in two
    assert _owner("sk-two") == two  # stable
    assert _owner("sk-two", bearer=True) == two  # whichever header carries it


def test_each_key_without_a_tenant_has_its_own_owner_and_a_tenant_shares_one() -> None:
    ring = Keyring(["sk-one", "sk-two", "sk-old"], tenants={"sk-one": "team-a", "sk-old": "team-a"})
    assert _owner("sk-two", ring=ring) != _owner("sk-one", ring=ring)
    assert _owner("sk-old", ring=ring) == _owner("sk-one", ring=ring)  # a rotated key keeps its tenant's data


def test_shared_or_keyless_gateways_have_one_owner() -> None:
    assert _owner("sk-one", shared=True) == "" and _owner("sk-two", shared=True) == ""
    assert _owner("anything", ring=Keyring()) == "" and _owner(None, ring=Keyring()) == ""


def test_the_caller_names_its_key_by_a_digest_and_its_tenant() -> None:
    one = auth.caller(request("sk-one"), RING.lookup("sk-one"), shared=False)
    two = auth.caller(request("sk-two", bearer=True), RING.lookup("sk-two"), shared=False)
    assert one.tenant == "team-a" and two.tenant is None
    assert one.key_id is not None and one.key_id.startswith("key_") and "sk-one" not in one.key_id
    assert one.key_id != two.key_id and one.key_id == auth.key_id("sk-one")


def test_without_keys_the_caller_has_no_key_id() -> None:
    nobody = auth.caller(request(), auth.check(request(), Keyring()), shared=False)
    assert nobody.key_id is None and nobody.tenant is None and nobody.owner == ""


def test_an_admin_key_calls_no_model_and_a_client_key_manages_nothing() -> None:
    with pytest.raises(PermissionDenied, match="admin key"):
        auth.check(request("sk-admin"), RING)
    assert auth.check_admin(request("sk-admin"), RING).role == "admin"
    with pytest.raises(PermissionDenied, match="admin key"):
        auth.check_admin(request("sk-one"), RING)
    with pytest.raises(Unauthorized):
        auth.check_admin(request("sk-nobody"), RING)


def test_an_inactive_or_expired_key_is_refused_as_unauthenticated() -> None:
    assert Grant(id="k", name="n", status="inactive").refusal() is not None
    assert Grant(id="k", name="n", expires_at=1.0).refusal() is not None
    assert Grant(id="k", name="n", expires_at=2e9).refusal(now=1e9) is None


class _PoisonedUrl(Request):
    """A request as Starlette before 1.0.1 builds it for `Host: x/?`: its URL reads as `/`."""

    @property
    def url(self) -> URL:  # type: ignore[override]
        return URL("http://x/?/v1/files")


def test_a_key_is_asked_for_whatever_the_host_header_makes_the_url_read() -> None:
    poisoned = _PoisonedUrl(request().scope)
    assert poisoned.url.path == "/"
    with pytest.raises(Unauthorized):
        auth.check(poisoned, RING)
    auth.check(_PoisonedUrl(request("sk-one").scope), RING)  # a good key still passes
