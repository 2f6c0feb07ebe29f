"""Keys made at run time, in the tests: a gateway config with an admin key, the Admin API
called with the official SDK's generic methods, and `answered` for `waiting.eventually`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anthropic

ADMIN = "sk-admin-test"
T = TypeVar("T")


def keys_config(upstream_url: str, **extra: Any) -> dict[str, Any]:
    """A gateway with an admin key (so keys are made at run time), on `upstream_url`."""
    data: dict[str, Any] = {"admin": {"keys": [ADMIN], "poll_interval": 0.2},
                            "upstreams": {"default": {"url": upstream_url, "max_retries": 0}}}  # fmt: skip
    for table, values in extra.items():
        data[table] = {**data.get(table, {}), **values} if isinstance(values, dict) else values
    return data


def admin(url: str, key: str = ADMIN) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)


def create(url: str, **body: Any) -> dict[str, Any]:
    return admin(url).post("/v1/organizations/api_keys", body=body, cast_to=object)  # type: ignore[return-value]


def update(url: str, key_id: str, **body: Any) -> dict[str, Any]:
    return admin(url).post(f"/v1/organizations/api_keys/{key_id}", body=body, cast_to=object)  # type: ignore[return-value]


def retrieve(url: str, key_id: str) -> dict[str, Any]:
    return admin(url).get(f"/v1/organizations/api_keys/{key_id}", cast_to=object)  # type: ignore[return-value]


def listing(url: str, **params: Any) -> dict[str, Any]:
    return admin(url).get("/v1/organizations/api_keys", cast_to=object, options={"params": params})  # type: ignore[return-value]


def ask(url: str, key: str, model: str = "test-model", **fields: Any) -> Any:
    client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    return client.messages.create(model=model, max_tokens=fields.pop("max_tokens", 20),
                                  messages=[{"role": "user", "content": "Hi"}], **fields)  # fmt: skip


def answered(call: Callable[[], T]) -> Callable[[], T | None]:
    """`call` as a predicate for `waiting.eventually`: its value, or None while it raises an
    AssertionError or an API error (a change not yet seen by the process asked)."""

    def attempt() -> T | None:
        try:
            return call()
        except (AssertionError, anthropic.APIError):
            return None

    return attempt
