"""A configuration's raw data checked against its structs, every problem noted at once.

msgspec stops at the first problem, so a file with four mistakes would take four runs
to fix. Here each key is checked on its own: an unknown key (with the known key it is
probably a typo of), a value of the wrong type, a missing required key. What passes is
kept, so that the checks that need a whole configuration still run on the rest.
"""

from __future__ import annotations

import difflib
import re
import types
from typing import Any, Union, get_args, get_origin

import msgspec

_BAD = object()  # a value that does not fit: left out, its problem noted
_PATH = re.compile(r" - at `\$\.?(.*)`$")
_FIELD = re.compile(r"^Object (missing required|contains unknown) field `(.+)`$")


def readable(error: msgspec.ValidationError, prefix: str = "") -> str:
    """`Expected int, got str - at $.server.port` -> `server.port: Expected int, got str`;
    a missing or unknown key is named in the path (`upstreams.x.url: required key is missing`)."""
    text = str(error)
    match = _PATH.search(text)
    path = re.sub(r"\[(\d+)\]", r".\1", match.group(1)) if match else ""
    text = text[: match.start()] if match else text
    field = _FIELD.match(text)
    if field:
        path = f"{path}.{field.group(2)}" if path else field.group(2)
        text = "required key is missing" if field.group(1) == "missing required" else "unknown key"
    path = ".".join(p for p in (prefix, path) if p)
    return f"{path}: {text}" if path else text


def sift(data: Any, cls: type[msgspec.Struct], path: str, problems: list[str]) -> dict[str, Any] | None:
    """The keys of table `data` that fit struct `cls`, each problem appended to `problems`;
    None when a required key is missing or does not fit (the table cannot be built)."""
    if not isinstance(data, dict):
        problems.append(f"{path}: expected a table, got {type(data).__name__}")
        return None
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    tag_field = cls.__struct_config__.tag_field
    kept: dict[str, Any] = {}
    for key, value in data.items():
        where = _join(path, key)
        if key == tag_field:
            kept[key] = value
        elif key not in fields:
            problems.append(f"{where}: unknown key{_did_you_mean(key, fields)}")
        elif (fitted := _fit(value, fields[key].type, where, problems)) is not _BAD:
            kept[key] = fitted
    missing = [name for name, field in fields.items() if field.required and name not in data]
    problems.extend(f"{_join(path, name)}: required key is missing" for name in missing)
    return None if any(field.required and name not in kept for name, field in fields.items()) else kept


def _fit(value: Any, annotation: Any, where: str, problems: list[str]) -> Any:
    """`value` if it fits `annotation`, its tables sifted; else _BAD, with the problem noted."""
    structs = _structs(annotation)
    if structs and isinstance(value, dict):
        cls = _by_tag(value, structs, where, problems)
        fitted = sift(value, cls, where, problems) if cls is not None else None
        return _BAD if fitted is None else fitted
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list and _structs(args[0]) and isinstance(value, list):
        items = [_fit(item, args[0], f"{where}.{index}", problems) for index, item in enumerate(value)]
        return _BAD if any(item is _BAD for item in items) else items  # one left out would renumber the rest
    if origin is dict and _structs(args[1]) and isinstance(value, dict):
        entries = {key: _fit(item, args[1], _join(where, key), problems) for key, item in value.items()}
        return {key: item for key, item in entries.items() if item is not _BAD}
    try:
        msgspec.convert(value, annotation)
    except msgspec.ValidationError as error:
        problems.append(readable(error, prefix=where))
        return _BAD
    return value


def _structs(annotation: Any) -> list[type[msgspec.Struct]]:
    """The struct types `annotation` is, or is a union of."""
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return [m for m in members if isinstance(m, type) and issubclass(m, msgspec.Struct)]


def _by_tag(value: dict[str, Any], structs: list[type[msgspec.Struct]], where: str, problems: list[str]) -> Any:
    """Which of a tagged union's structs `value` is, by its tag (`protocol` for upstreams)."""
    if len(structs) == 1:
        return structs[0]
    tag_field = structs[0].__struct_config__.tag_field
    tag = value.get(tag_field) if tag_field else None
    for cls in structs:
        if cls.__struct_config__.tag == tag:
            return cls
    problems.append(f"{_join(where, str(tag_field))}: Invalid value {tag!r}")
    return None


def _did_you_mean(key: str, known: dict[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
