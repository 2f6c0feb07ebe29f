"""Anthropic's list pagination (`limit`, `after_id`, `before_id`; `data`, `has_more`,
`first_id`, `last_id`), for the Models and Message Batches lists."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from dragoman.core.errors import InvalidRequest

K = TypeVar("K")
V = TypeVar("V")
# Deleted ids remembered (per process, per list) so that a cursor naming one still places:
# the most recent ones, as a cleanup loop pages and deletes; kept without a bound, every
# delete of a process that runs for weeks stayed in its memory.
DELETED_KEPT = 1024


def page_of(
    ids: Sequence[str],
    query: Mapping[str, str],
    describe: Callable[[str], Any],
    noun: str,
    position: Callable[[str], int | None] | None = None,
) -> dict[str, Any]:
    """The page of `ids` (in listing order) that `query` asks for, each described.
    `position` places a cursor no longer listed (deleted while a client pages through,
    as cleanup loops do): how many listed ids come before it, or None if unknown."""
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        raise InvalidRequest("limit: must be an integer") from None
    if not 1 <= limit <= 1000:
        raise InvalidRequest("limit: must be between 1 and 1000")
    if "after_id" in query and "before_id" in query:
        raise InvalidRequest("before_id, after_id: give one of them, not both")
    names = list(ids)
    start, end = 0, len(names)

    def place(key: str, after: bool) -> int:
        cursor = query[key]
        if cursor in names:
            return names.index(cursor) + (1 if after else 0)
        where = position(cursor) if position is not None else None
        if where is None:
            raise InvalidRequest(f"{key}: unknown {noun} {cursor!r}")
        return where

    if "after_id" in query:
        start = place("after_id", after=True)
    if "before_id" in query:
        end = place("before_id", after=False)
        start = max(start, end - limit) if "after_id" not in query else start
    page = names[start:end][:limit]
    return {
        "data": [describe(name) for name in page],
        "has_more": (start + len(page) < end) if "before_id" not in query else start > 0,
        "first_id": page[0] if page else None,
        "last_id": page[-1] if page else None,
    }


def list_param(query: Mapping[str, str], name: str) -> list[str]:
    """A query parameter that holds a list: repeated (`name=a&name=b`, or `name[]=`, as the
    SDKs send it) and comma-separated values alike."""
    getlist = getattr(query, "getlist", None)
    values = [*getlist(name), *getlist(f"{name}[]")] if getlist else [query.get(name, ""), query.get(f"{name}[]", "")]
    return [item for value in values for item in value.split(",") if item]


def remember_deleted(gone: dict[K, V], key: K, place: V, kept: int = DELETED_KEPT) -> None:
    """Remember a deleted id's `place` for `position`, forgetting the oldest past `kept`."""
    gone.pop(key, None)
    gone[key] = place
    while len(gone) > kept:
        del gone[next(iter(gone))]
