"""What the ledger says was used since a moment, by who and which model: what a restarted
process without Redis charges its budgets with (`limits.Limits.charge_used`)."""

from __future__ import annotations

from dataclasses import dataclass

from dragoman.usage.records import Query, UsageStore


@dataclass(frozen=True, slots=True)
class Used:
    key_id: str | None
    tenant: str | None
    model: str
    upstream_model: str
    tokens: int  # as a budget counts them: input, prompt-cache writes and output


async def used_since(store: UsageStore, start: float, end: float) -> list[Used]:
    """(The store open.) Tokens used between `start` and `end`, by key, tenant and model."""
    query = Query(start, end, 0, ("api_key_id", "tenant", "model", "upstream_model"), refusals=False)
    return [Used(s.groups[0], s.groups[1], s.groups[2] or "", s.groups[3] or "",
                 s.input_tokens + s.cache_creation_tokens + s.output_tokens)
            for s in await store.sums(query)]  # fmt: skip
