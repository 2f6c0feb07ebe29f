"""Anthropic's error envelope, as the integration tests check it: status, type, and the
message (returned, for the test to check it names the offending field)."""

from __future__ import annotations

import anthropic
import httpx
import pytest


def error_of(caught: pytest.ExceptionInfo[anthropic.APIStatusError], status: int, error_type: str) -> str:
    """The message of an error the SDK raised, after checking its status and envelope."""
    assert caught.value.status_code == status, caught.value
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == error_type, body
    return body["error"]["message"]


def raw_error(response: httpx.Response, status: int, error_type: str) -> str:
    """The message of an error answer read without the SDK; its request_id is the header's."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type, body
    assert body["request_id"] == response.headers["request-id"]
    return body["error"]["message"]
