"""The gateway's upstream keys, and anything shaped like a credential, kept out of what
clients see: error messages, and the error bodies and events passthrough relays as they came.

A registry rather than a parameter: keys are registered once, as each upstream's client is
built, and every error path redacts with all of them.
"""

from __future__ import annotations

import re

import msgspec

# What a backend may echo back of a credential: bearer tokens, `sk-...` style keys,
# `api_key=...` parameters. The gateway's own upstream key must never reach a client.
_CREDENTIAL = re.compile(
    r"(?i)(?<=bearer )[^\s\"',;]{6,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_*\-]{6,}"
    r"|(?<=api[_-]key=)[^\s\"',;&]+|(?<=api[_-]key: )[^\s\"',;&]+"
)


_SECRETS: list[str] = []  # the upstream keys configured here, longest first: redacted wherever they appear
MIN_SECRET = 8  # shorter "keys" (test placeholders, "none") would redact ordinary words


def register_secret(secret: str | None) -> None:
    """A key this gateway sends upstream; error texts and passthrough error bodies never carry it.
    A header value's own token counts too (`Basic xyz`: `xyz` alone may be quoted back)."""
    for value in (secret, (secret or "").rpartition(" ")[2]):
        if value and len(value) >= MIN_SECRET and value not in _SECRETS:
            _SECRETS.append(value)
            _SECRETS.sort(key=len, reverse=True)  # a key inside a longer one must not leave the longer one's tail


def redact(text: str) -> str:
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, "[redacted]")
    return _CREDENTIAL.sub("[redacted]", text)


_JSON_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')  # a JSON string literal, escapes and all


def redact_bytes(data: bytes) -> bytes:
    """The configured upstream keys taken out of bytes relayed as they came (passthrough errors:
    JSON bodies, SSE events), as written and inside JSON strings however they are escaped
    (`\\u002d` for `-`): a string holding a key, once decoded, is written again redacted."""
    for secret in _SECRETS:
        if secret.encode() in data:
            data = data.replace(secret.encode(), b"[redacted]")
    if _SECRETS and b"\\" in data:
        data = _JSON_STRING.sub(_redact_escaped, data)
    return data


def _redact_escaped(match: re.Match[bytes]) -> bytes:
    literal = match.group()
    if b"\\" not in literal:
        return literal
    try:
        text = msgspec.json.decode(literal, type=str)
    except msgspec.DecodeError:
        return literal
    redacted = text
    for secret in _SECRETS:
        redacted = redacted.replace(secret, "[redacted]")
    return literal if redacted == text else msgspec.json.encode(redacted)
