"""How often a request to an upstream is tried again and how long it waits first: the policy
the retrying client (`upstream.client`) applies. The rules are described once, for people, in
docs/operations.md (Retries and replicas).
"""

from __future__ import annotations

import random
import time

from dragoman.upstream.opening import Sending

RETRY_STATUSES = frozenset({429, 502, 503, 504, 529})
BACKOFF_BASE = 0.25


def retry_after(value: str | None) -> float | None:
    """A `retry-after` header's seconds, if it gives seconds."""
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to backoff


def count_retry(request: Sending) -> None:
    """Another attempt of `request`, counted for the policy and for the request's outcome."""
    request.attempt += 1
    if request.outcome is not None:
        request.outcome.retries += 1


def may_retry(attempt: int, max_retries: int, budget_end: float, wait: float | None, elsewhere: bool) -> bool:
    """Within max_retries; a retry that waits (backoff, `retry-after`) only within the
    budget, which is time spent waiting: one sent at once to another instance (`elsewhere`)
    waits for nothing (a connect timeout may have used the whole budget by then)."""
    if attempt >= max_retries:
        return False
    if elsewhere:
        return True
    remaining = budget_end - time.monotonic()
    return remaining > 0 and (wait is None or wait <= remaining)


def backoff(attempt: int, retry_after: float | None, budget_end: float) -> float:
    """Seconds to wait before attempt `attempt + 1`: the server's `retry-after`, else an
    exponential backoff with jitter; never past the budget."""
    if retry_after is not None:
        delay = retry_after
    else:
        delay = BACKOFF_BASE * 2 ** (attempt - 1) * random.uniform(0.75, 1.25)
    return max(0.0, min(delay, budget_end - time.monotonic()))
