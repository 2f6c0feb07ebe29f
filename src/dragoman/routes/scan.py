"""A route table's tests written into one function (`scanner`), built once at start-up: the
first route whose verdict is not False, without a call per route and per test. Measured
(bench/routes_cost.py): 20 routes' tests, their facts read, 3.2 µs one by one, 1.6 µs so.
Only what a condition marked `conditions.inline` is written out; any other test (thinking,
body paths, `any`, the counted ones) is called as it is. A pure module: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dragoman.routes.conditions import When
from dragoman.routes.shape import Shape

Scan = Callable[[Shape], tuple[int, bool | None]]


def scanner(whens: Sequence[When | None]) -> Scan:
    """(index, verdict) of the first of `whens` whose verdict is True or None (a `None` when: a
    route only `Routes._matches` can tell, always asked), else (-1, False)."""
    names: dict[str, Any] = {}
    lines = ["def scan(s):"]
    for at, when in enumerate(whens):
        if when is None:
            lines.append(f"    return {at}, None")
            break
        source = _source(when, f"r{at}", names)
        if source is not None:
            lines.append(f"    if {source}: return {at}, True")
        else:
            names[f"r{at}"] = when.holds
            lines.append(f"    v = r{at}(s)\n    if v or v is None: return {at}, v")
    lines.append("    return -1, False")
    exec("\n".join(lines), names)  # noqa: S102  # the source is ours, from compiled conditions
    return names["scan"]  # type: ignore[no-any-return]


def _source(when: When, prefix: str, names: dict[str, Any]) -> str | None:
    """A table's tests as one expression (its tests' order kept), or None when it has more than plain tests."""
    if when.anys or when.counted or not when.tests:
        return None
    parts = []
    for index, test in enumerate(when.tests):
        own = f"{prefix}_{index}"
        inline = getattr(test, "inline", None)
        if inline is None:
            names[own] = test
            parts.append(f"{own}(s)")
            continue
        source, bound = inline
        fields = {key: f"{own}_{key}" for key in bound}
        names.update({fields[key]: value for key, value in bound.items()})
        parts.append(f"({source.format(**fields)})")
    return " and ".join(parts)


def following(tests: Sequence[tuple[Callable[[Shape], bool | None] | None, Any]], shape: Shape,
              start: int) -> tuple[int, bool | None]:  # fmt: skip
    """`scanner`'s answer from `start` on, one test at a time: after a route that needed `_matches`."""
    for at in range(start, len(tests)):
        holds = tests[at][0]
        verdict = None if holds is None else holds(shape)
        if verdict or verdict is None:
            return at, verdict
    return -1, False
