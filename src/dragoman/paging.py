"""Anthropic's list pagination (`limit`, `after_id`, `before_id`; `data`, `has_more`,
`first_id`, `last_id`), for the Models and Message Batches lists."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dragoman.errors import InvalidRequest


def page_of(ids: Sequence[str], query: Mapping[str, str], describe: Callable[[str], Any], noun: str) -> dict[str, Any]:
    """The page of `ids` (in listing order) that `query` asks for, each described."""
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        raise InvalidRequest("limit: must be an integer") from None
    if not 1 <= limit <= 1000:
        raise InvalidRequest("limit: must be between 1 and 1000")
    names = list(ids)
    start, end = 0, len(names)
    if "after_id" in query:
        if query["after_id"] not in names:
            raise InvalidRequest(f"after_id: unknown {noun} {query['after_id']!r}")
        start = names.index(query["after_id"]) + 1
    if "before_id" in query:
        if query["before_id"] not in names:
            raise InvalidRequest(f"before_id: unknown {noun} {query['before_id']!r}")
        end = names.index(query["before_id"])
        start = max(start, end - limit) if "after_id" not in query else start
    page = names[start:end][:limit]
    return {
        "data": [describe(name) for name in page],
        "has_more": (start + len(page) < end) if "before_id" not in query else start > 0,
        "first_id": page[0] if page else None,
        "last_id": page[-1] if page else None,
    }
