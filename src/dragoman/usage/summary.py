"""`dragoman usage`: the stored usage of a period, summed by tenant and model (or by key),
as an aligned table for people, CSV for spreadsheets or JSON for scripts. Requests refused
for their key (401, 403) are no one's usage: they are counted apart, as refusals."""

from __future__ import annotations

import csv
import datetime
import io
import json
import re
from dataclasses import dataclass

from dragoman.usage.records import Query, Sums, UsageStore

# Input and cache reads side by side: where the backend caches prompts, input alone understates the prompt.
COLUMNS = ("requests", "errors", "input_tokens", "cache_read_tokens", "cache_creation_tokens", "output_tokens")
BY = {"tenant": "tenant", "model": "model", "key": "api_key_id"}
_SPAN = re.compile(r"(\d+)\s*([mhdw])")
_UNIT = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True, slots=True)
class Summary:
    sums: list[Sums]  # every answer but the refusals, by the columns asked for
    refused: int  # requests answered 401 or 403


def parse_time(text: str) -> float:
    """An RFC 3339 timestamp or a date (UTC midnight); a ValueError names what was given."""
    try:
        at = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a date or an RFC 3339 timestamp: {text!r}") from None
    return (at if at.tzinfo else at.replace(tzinfo=datetime.UTC)).timestamp()


def parse_when(text: str, now: float) -> float:
    """What `--since` and `--until` take (`dragoman usage --help`), as seconds since the epoch."""
    word = text.strip().lower()
    midnight = datetime.datetime.fromtimestamp(now, datetime.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if word == "now":
        return now
    if word in ("today", "yesterday"):
        return (midnight - datetime.timedelta(days=1 if word == "yesterday" else 0)).timestamp()
    span = _SPAN.fullmatch(word)
    if span:
        return now - int(span.group(1)) * _UNIT[span.group(2)]
    try:
        return parse_time(text)
    except ValueError:
        raise ValueError(f"not today, yesterday, now, a span (7d), a date or an RFC 3339 timestamp: {text!r}") from None


async def summarize(store: UsageStore, start: float, end: float, by: tuple[str, ...]) -> Summary:
    await store.open()
    try:
        sums = await store.sums(Query(start, end, 0, tuple(BY[b] for b in by), refusals=False))
        refused = await store.sums(Query(start, end, refusals=True))
    finally:
        await store.close()
    return Summary(sums, sum(s.requests for s in refused))


def _rows(sums: list[Sums], by: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    header = [*by, *COLUMNS]
    rows = [[*(g if g is not None else "" for g in s.groups), *(str(getattr(s, c)) for c in COLUMNS)] for s in sums]
    if len(rows) != 1 or by:
        totals = [sum(getattr(s, c) for s in sums) for c in COLUMNS]
        rows.append(["total" if i == 0 else "" for i in range(len(by))] + [str(t) for t in totals])
    return header, rows


def as_csv(summary: Summary, by: tuple[str, ...]) -> str:
    """The rows alone (no totals, no refusals): a spreadsheet sums."""
    header, rows = _rows(summary.sums, by)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows[:-1] if by else rows)
    return out.getvalue()


def as_table(summary: Summary, by: tuple[str, ...]) -> str:
    header, rows = _rows(summary.sums, by)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [c.ljust(w) if i < len(by) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    if summary.refused:
        lines.append(f"refused (401/403, counted in no row above): {summary.refused} requests")
    return "\n".join(lines) + "\n"


def as_json(summary: Summary, by: tuple[str, ...], *, start: float, end: float, store: str) -> str:
    """One object: the period, the store read, a row per group, the totals and the refusals."""

    def counts(source: object) -> dict[str, int]:
        return {c: getattr(source, c) for c in COLUMNS}

    rows = [{**dict(zip(by, s.groups, strict=True)), **counts(s)} for s in summary.sums]
    totals = {c: sum(getattr(s, c) for s in summary.sums) for c in COLUMNS}
    return json.dumps({"store": store, "since": _stamp(start), "until": _stamp(end), "by": list(by), "rows": rows,
                       "total": totals, "refused_requests": summary.refused}, indent=2) + "\n"  # fmt: skip


def _stamp(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat().replace("+00:00", "Z")
