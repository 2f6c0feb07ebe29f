"""A request's headers for the hot endpoints: Starlette's `Headers`, each lookup a dict's.

Starlette's `Headers` looks a name up by walking the header list, and `get` of a name the
request lacks raises and catches a KeyError; a Messages request asks for a dozen names
(its key, content-length and -encoding, Claude Code's session, the betas...), most of them
absent. Here the names are indexed once, as Starlette would find them: the first header
of a name wins, and a name matches its lower-case form exactly (ASGI servers send names in
lower case). Everything else (`getlist`, `items`, `raw`) is Starlette's own."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from starlette.datastructures import Headers


class RequestHeaders(Headers):
    def __init__(self, scope: MutableMapping[str, Any]) -> None:
        self._list = scope["headers"] = list(scope["headers"])  # as `Headers(scope=scope)`
        # The first header of a name wins, as in `Headers`: the later ones are written over it.
        self._first = {name.decode("latin-1"): value.decode("latin-1") for name, value in reversed(self._list)}

    def __getitem__(self, key: str) -> str:
        try:
            return self._first[key.lower()]
        except KeyError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]  # Mapping.get's overloads
        return self._first.get(key.lower(), default)

    def __contains__(self, key: Any) -> bool:
        return key.lower() in self._first
