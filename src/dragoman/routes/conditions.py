"""A route's `when`: compiled once at start-up into tests over a request's `Shape`.

Every key is defined in docs/routing.md (Routes). Keys in one table must all hold; `any` is
a list of tables of which one must. A table's tests run cheapest first (`COST`: what the core
decoded already, then a small field, then the tools, then the messages) and stop at the first
that fails; tests that need the request's token count (`input_tokens`, `fits`) run last, so
that the count is asked for only when everything else already holds.
A pure module: no I/O, and nothing of dragoman's imported.
"""

from __future__ import annotations

import fnmatch
import functools
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dragoman.routes.shape import MISSING, Shape


class ConditionError(ValueError):
    """A `when` table that cannot be compiled; the message starts with its key."""


Test = Callable[[Shape], bool]
# `found <op> bound`, written `<flipped op>(bound, found)`: a C call with the bound bound first
COMPARISONS = {"eq": operator.eq, "gt": operator.lt, "ge": operator.le, "lt": operator.gt, "le": operator.ge}
# What a test reads, cheapest first: headers and what every read holds; a small field (decoded
# once); the system prompt or the tools (a read of each when passed through); the messages.
COST = {"model": 0, "header": 0, "stream": 0, "max_tokens": 0, "body": 1, "thinking": 1, "output_format": 1,
        "subagent": 2, "tools": 2, "server_tool": 2, "images": 3}  # fmt: skip
BODY_TESTS = frozenset({"exists", "eq", "in", "glob", "gt", "ge", "lt", "le"})


@dataclass(frozen=True, slots=True)
class When:
    """Compiled conditions: `holds(shape)` is True, False, or None when it needs the token count."""

    holds: Callable[[Shape], bool | None]
    tests: tuple[Test, ...]  # cheapest first
    counted: tuple[Test, ...]  # need `shape.tokens` (and `shape.window`)
    anys: tuple[tuple[When, ...], ...]
    images: bool = False  # `images = true` is required: its target needs vision
    threshold: int | None = None  # `input_tokens` gt/ge this: its target needs the window
    fields: frozenset[str] = frozenset()  # the body's top-level fields `body.<path>` reads
    headers: frozenset[str] = frozenset()  # the headers `header.<name>` reads
    cost: int = 0  # of its dearest test (COST)


def compile_when(table: dict[str, Any], where: str) -> When:
    """`table` compiled, or ConditionError naming the key at fault (`routes.0.when.tools`)."""
    if not isinstance(table, dict):
        raise ConditionError(f"{where}: expected a table of conditions")
    tests: list[tuple[int, Test]] = []
    counted: list[Test] = []
    anys: list[tuple[When, ...]] = []
    fields: set[str] = set()
    headers: set[str] = set()
    images, threshold = False, None
    for key, value in table.items():
        at = f"{where}.{key}"
        if key == "any":
            if not isinstance(value, list) or not value:
                raise ConditionError(f"{at}: expected a list of condition tables")
            compiled = [compile_when(option, f"{at}.{i}") for i, option in enumerate(value)]
            anys.append(tuple(sorted(compiled, key=lambda option: option.cost)))  # the first that holds decides
        elif key in ("header", "body") or key.startswith(("header.", "body.")):
            kind = key.partition(".")[0]
            tests.extend((COST[kind], test) for test in _dotted(key, value, at, fields, headers))
        elif key in ("input_tokens", "fits"):
            test, bound = _counted(key, value, at)
            counted.append(test)
            threshold = bound if bound is not None else threshold
        else:
            tests.append((COST.get(key, 0), _plain(key, value, at)))
            images = images or (key == "images" and value is True)
    for options in anys:  # a request an option lets in reaches the target too
        fields.update(name for option in options for name in option.fields)
        headers.update(name for option in options for name in option.headers)
        images = images or any(option.images for option in options)
        bounds = [option.threshold for option in options if option.threshold is not None]
        threshold = max([*bounds, *([threshold] if threshold is not None else [])], default=None)
    tests.sort(key=lambda ranked: ranked[0])  # stable: as written among equals
    cost = max([rank for rank, _ in tests] + [o.cost for options in anys for o in options], default=0)
    plain = tuple(test for _, test in tests)
    holds = _holds(plain, tuple(anys), tuple(counted))
    return When(holds, plain, tuple(counted), tuple(anys), images, threshold, frozenset(fields), frozenset(headers),
                cost)  # fmt: skip


def _holds(tests: tuple[Test, ...], anys: tuple[tuple[When, ...], ...],
           counted: tuple[Test, ...]) -> Callable[[Shape], bool | None]:  # fmt: skip
    """One callable for a table, shortest for the common ones (a test or two, no `any`, no count)."""
    if not anys and not counted:
        if len(tests) == 1:
            return tests[0]
        if len(tests) == 2:
            first, second = tests
            return lambda shape: first(shape) and second(shape)
    if not tests and not anys and len(counted) == 1:  # `input_tokens` alone: asked before and after the count
        only = counted[0]
        return lambda shape: None if shape.tokens is None else only(shape)

    def holds(shape: Shape) -> bool | None:
        for test in tests:
            if not test(shape):
                return False
        unknown = False  # an `any` that needs the count (unless another fails outright)
        for options in anys:
            found: bool | None = False
            for option in options:
                verdict = option.holds(shape)
                if verdict:
                    found = True
                    break
                if verdict is None:
                    found = None
            if found is False:
                return False
            unknown = unknown or found is None
        if unknown:
            return None
        if counted:
            if shape.tokens is None:
                return None
            return all(test(shape) for test in counted)
        return True

    return holds


def _plain(key: str, value: Any, at: str) -> Test:
    """A test reading one fact of the shape (`shape.once`: read once a request, then an attribute)."""
    if key == "model":
        match = _pattern(value, at)
        return inline(lambda s: match(s.model) is not None, "{match}(s.model) is not None", match=match)
    if key in ("subagent", "images", "stream"):
        wanted = _bool(value, at)
        if key == "subagent":
            return inline(lambda s: s.subagent is wanted, f"s.subagent is {wanted}")
        if key == "images":
            return inline(lambda s: s.images is wanted, f"s.images is {wanted}")
        return inline(lambda s: s.stream is wanted, f"s.stream is {wanted}")
    if key == "server_tool":
        match = _pattern(value, at)
        return inline(lambda s: any(map(match, s.tool_facts[1])), "any(map({match}, s.tool_facts[1]))", match=match)
    if key in ("tools", "max_tokens"):
        compare = _number(value, at)
        if key == "tools":
            return inline(lambda s: compare(s.tool_facts[0]), "{compare}(s.tool_facts[0])", compare=compare)
        return inline(lambda s: compare(s.max_tokens), "{compare}(s.max_tokens)", compare=compare)
    if key == "output_format":
        match = _pattern(value, at)
        return inline(lambda s: (found := s.output_format) is not None and match(found) is not None,
                      "(found := s.output_format) is not None and {match}(found) is not None", match=match)  # fmt: skip
    if key == "thinking":
        return _thinking(value, at)
    raise ConditionError(f"{at}: unknown condition (known: model, header.<name>, subagent, input_tokens, fits, images, "
                         "server_tool, tools, thinking, max_tokens, stream, output_format, body.<path>, any)")  # fmt: skip


def _counted(key: str, value: Any, at: str) -> tuple[Test, int | None]:
    if key == "fits":
        wanted = _bool(value, at)
        return (lambda s: s.fits() is wanted), None
    if not isinstance(value, dict) or not value:
        raise ConditionError(f"{at}: expected a comparison such as {{ gt = 60000 }}")
    compare = _number(value, at)
    bounds = [value[k] for k in ("gt", "ge") if k in value]
    return (lambda s: compare(s.tokens)), (max(bounds) if bounds else None)


def _thinking(value: Any, at: str) -> Test:
    if not isinstance(value, dict) or not value or set(value) - {"effort", "budget"}:
        raise ConditionError(f"{at}: expected {{ effort = [...] }} and/or {{ budget = {{ ge = N }} }} (thinking is "
                             "keyed on its effort or budget, never on the field being present)")  # fmt: skip
    efforts = value.get("effort")
    if efforts is not None:
        efforts = [efforts] if isinstance(efforts, str) else efforts
        if not isinstance(efforts, list) or not efforts or not all(isinstance(e, str) for e in efforts):
            raise ConditionError(f'{at}.effort: expected a list of efforts, such as ["high", "max"]')
        wanted = frozenset(efforts)
    budget = _number(value["budget"], f"{at}.budget") if "budget" in value else None

    def test(shape: Shape) -> bool:
        if not shape.thinking_on:
            return False
        if efforts is not None and shape.effort not in wanted:
            return False
        return budget is None or (shape.budget is not None and budget(shape.budget))

    return test


def _dotted(key: str, value: Any, at: str, fields: set[str], headers: set[str]) -> list[Test]:
    """`header.<name>` and `body.<path>`, written `"body.a.b" = ...` or as nested TOML tables."""
    kind, _, rest = key.partition(".")
    if not rest:
        if not isinstance(value, dict) or not value:
            raise ConditionError(f"{at}: expected a table of {kind} names")
        return [
            test
            for name, inner in value.items()
            for test in _dotted(f"{kind}.{name}", inner, f"{at}.{name}", fields, headers)
        ]
    if kind == "header":
        name = rest.lower()
        headers.add(name)
        if value is True or value is False:
            present = value
            return [inline(lambda s: (s.header(name) is not None) is present,
                           "(s.header({name}) is not None) is {present}", name=name, present=present)]  # fmt: skip
        match = _pattern(value, at)
        return [inline(lambda s: (found := s.header(name)) is not None and match(found) is not None,
                       "(found := s.header({name})) is not None and {match}(found) is not None", name=name, match=match)]  # fmt: skip
    if isinstance(value, dict) and value and not set(value) <= BODY_TESTS:  # a nested path, not a test
        return [
            test
            for name, inner in value.items()
            for test in _dotted(f"{key}.{name}", inner, f"{at}.{name}", fields, headers)
        ]
    path = tuple(int(p) if p.isdigit() else p for p in rest.split("."))
    fields.add(str(path[0]))
    check = _body_test(value, at)
    return [lambda s: check(s.body_at(path))]


def _body_test(value: Any, at: str) -> Callable[[Any], bool]:
    """A value at a body path: equal to a scalar, or a table of exists/eq/in/glob/gt/ge/lt/le."""
    if not isinstance(value, dict):
        return _equal(value)
    tests = [_body_check(name, wanted, at) for name, wanted in value.items()]
    if len(tests) == 1:
        return tests[0]
    return lambda found: all(test(found) for test in tests)


def _equal(wanted: Any) -> Callable[[Any], bool]:
    return lambda found: (
        found is not MISSING and found == wanted and isinstance(found, bool) is isinstance(wanted, bool)
    )


def _body_check(name: str, wanted: Any, at: str) -> Callable[[Any], bool]:
    if name == "exists":
        present = _bool(wanted, f"{at}.exists")
        return lambda found: (found is not MISSING) is present
    if name == "in":
        if not isinstance(wanted, list):
            raise ConditionError(f"{at}.in: expected a list of values")
        return lambda found: found is not MISSING and found in wanted
    if name == "glob":
        match = _pattern(wanted, f"{at}.glob")
        return lambda found: isinstance(found, str) and match(found) is not None
    if name == "eq":
        return _equal(wanted)
    compare = _number({name: wanted}, at)
    return lambda found: isinstance(found, (int, float)) and not isinstance(found, bool) and compare(found)


def inline(test: Test, source: str, **names: Any) -> Test:
    """`test`, with the expression it evaluates over a shape `s` (`source`, a format string whose
    fields are `names`), for `scan.scanner` to write into one function with its route's others."""
    test.inline = (source, names)  # type: ignore[attr-defined]
    return test


def _pattern(value: Any, at: str) -> Callable[[str], re.Match[str] | None]:
    """The globs as one regular expression's `match`."""
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
        raise ConditionError(f'{at}: expected a glob ("claude-haiku-*") or a list of them')
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)).match


def _bool(value: Any, at: str) -> bool:
    if not isinstance(value, bool):
        raise ConditionError(f"{at}: expected true or false, got {value!r}")
    return value


def _number(value: Any, at: str) -> Callable[[Any], bool]:
    """A count compared: `3` (equal to), or a table of eq/gt/ge/lt/le, all of which must hold."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"eq": value}
    if not isinstance(value, dict) or not value:
        raise ConditionError(f"{at}: expected a number or a comparison table such as {{ gt = 100 }}")
    checks = []
    for name, bound in value.items():
        if name not in COMPARISONS:
            raise ConditionError(f"{at}.{name}: unknown comparison (known: eq, gt, ge, lt, le)")
        if not isinstance(bound, (int, float)) or isinstance(bound, bool):
            raise ConditionError(f"{at}.{name}: expected a number, got {bound!r}")
        checks.append(functools.partial(COMPARISONS[name], bound))
    if len(checks) == 1:
        return checks[0]
    return lambda found: all(check(found) for check in checks)
