"""Helpers of the request translation tests (tests/unit/translate/test_translate_request*.py): a request translated to the JSON body the backend receives."""

from __future__ import annotations

from typing import Any

import pytest

from dragoman.core.errors import InvalidRequest
from tests.support.helpers import translate, wire

TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def body(**fields: Any) -> dict[str, Any]:
    return wire(translate(**fields).chat)


def messages(**fields: Any) -> list[dict[str, Any]]:
    return body(**fields)["messages"]


def error(**fields: Any) -> str:
    with pytest.raises(InvalidRequest) as caught:
        translate(**fields)
    assert caught.value.status == 400 and caught.value.type == "invalid_request_error"
    return caught.value.message
