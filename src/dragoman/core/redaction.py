"""The gateway's upstream keys, and anything shaped like a credential, kept out of what
clients see: error messages, and the error bodies and events passthrough relays as they came.

One `Redactor` per gateway, not a module's list: keys are registered as each upstream's client
is built, every error path of that gateway redacts with all of them, and a gateway built again
(a reload, a test) starts from its own keys.
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


MIN_SECRET = 8  # shorter "keys" (test placeholders, "none") would redact ordinary words


class Redactor:
    """The upstream keys of one gateway, longest first: redacted wherever they appear, with
    anything shaped like a credential. The gateway makes one and hands it to what maps or
    relays upstream errors; each upstream's client registers its keys as it is built."""

    __slots__ = ("_secrets",)

    def __init__(self, *secrets: str | None) -> None:
        self._secrets: list[str] = []
        for secret in secrets:
            self.register(secret)

    def register(self, secret: str | None) -> None:
        """A key this gateway sends upstream; error texts and passthrough error bodies never carry it.
        A header value's own token counts too (`Basic xyz`: `xyz` alone may be quoted back)."""
        for value in (secret, (secret or "").rpartition(" ")[2]):
            if value and len(value) >= MIN_SECRET and value not in self._secrets:
                self._secrets.append(value)
                self._secrets.sort(
                    key=len, reverse=True
                )  # a key inside a longer one must not leave the longer one's tail

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        return _CREDENTIAL.sub("[redacted]", text)

    def redact_bytes(self, data: bytes) -> bytes:
        """The keys taken out of bytes relayed as they came (passthrough errors: JSON bodies,
        SSE events), as written and inside JSON strings however they are escaped (`\\u002d`
        for `-`): a string holding a key, once decoded, is written again redacted."""
        for secret in self._secrets:
            if secret.encode() in data:
                data = data.replace(secret.encode(), b"[redacted]")
        if self._secrets and b"\\" in data:
            data = _JSON_STRING.sub(self._redact_escaped, data)
        return data

    def _redact_escaped(self, match: re.Match[bytes]) -> bytes:
        literal = match.group()
        if b"\\" not in literal:
            return literal
        try:
            text = msgspec.json.decode(literal, type=str)
        except msgspec.DecodeError:
            return literal
        redacted = text
        for secret in self._secrets:
            redacted = redacted.replace(secret, "[redacted]")
        return literal if redacted == text else msgspec.json.encode(redacted)


_JSON_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')  # a JSON string literal, escapes and all


NO_KEYS = Redactor()  # for what no gateway's keys reach (a test's translator): credential shapes only
