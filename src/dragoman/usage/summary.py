"""`dragoman usage`: the stored usage of a period, summed by tenant and model (or by key),
as an aligned table for people or CSV for spreadsheets."""

from __future__ import annotations

import csv
import datetime
import io

from dragoman.usage.records import Query, Sums, UsageStore

COLUMNS = ("requests", "errors", "input_tokens", "cache_read_tokens", "cache_creation_tokens", "output_tokens")
BY = {"tenant": "tenant", "model": "model", "key": "api_key_id"}


def parse_time(text: str) -> float:
    """An RFC 3339 timestamp or a date (UTC midnight); a ValueError names what was given."""
    try:
        at = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a date or an RFC 3339 timestamp: {text!r}") from None
    return (at if at.tzinfo else at.replace(tzinfo=datetime.UTC)).timestamp()


async def summarize(store: UsageStore, start: float, end: float, by: tuple[str, ...]) -> list[Sums]:
    await store.open()
    try:
        return await store.sums(Query(start, end, 0, tuple(BY[b] for b in by)))
    finally:
        await store.close()


def _rows(sums: list[Sums], by: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    header = [*by, *COLUMNS]
    rows = [[*(g if g is not None else "" for g in s.groups), *(str(getattr(s, c)) for c in COLUMNS)] for s in sums]
    if len(rows) != 1 or by:
        totals = [sum(getattr(s, c) for s in sums) for c in COLUMNS]
        rows.append(["total" if i == 0 else "" for i in range(len(by))] + [str(t) for t in totals])
    return header, rows


def as_csv(sums: list[Sums], by: tuple[str, ...]) -> str:
    header, rows = _rows(sums, by)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows[:-1] if by else rows)  # CSV: no totals line, a spreadsheet sums
    return out.getvalue()


def as_table(sums: list[Sums], by: tuple[str, ...]) -> str:
    header, rows = _rows(sums, by)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [c.ljust(w) if i < len(by) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"
