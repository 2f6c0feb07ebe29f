"""The Admin API's request bodies, checked: each error names its field, as Anthropic's do."""

from __future__ import annotations

import datetime
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from dragoman.core.errors import InvalidRequest
from dragoman.core.limit_settings import BUDGETS, RATES, LimitSet
from dragoman.keys.money import MOST_CENTS
from dragoman.keys.records import Budget

MAX_NAME = 256
TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class Create(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    role: Literal["client", "admin"] = "client"
    tenant: str | None = None
    limits: LimitSet | None = None
    models: list[str] | None = None
    budget: Budget | None = None
    expires_at: str | None = None


class Update(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str | UnsetType = UNSET
    status: Literal["active", "inactive", "archived"] | UnsetType = UNSET
    limits: LimitSet | None | UnsetType = UNSET
    models: list[str] | None | UnsetType = UNSET
    budget: Budget | None | UnsetType = UNSET
    expires_at: str | None | UnsetType = UNSET


def decode(body: bytes, kind: type[Any]) -> Any:
    """The body as `kind`, or a 400 naming the field (`limits.requests_per_minute: ...`)."""
    try:
        return msgspec.json.decode(body or b"{}", type=kind)
    except msgspec.ValidationError as error:
        message, _, where = str(error).rpartition(" - at `$")
        field = where.rstrip("`").lstrip(".") if message else ""
        text = message or str(error)
        unknown = re.match(r"Object contains unknown field `(.+)`", text)
        if unknown:
            field, text = ".".join(filter(None, (field, unknown.group(1)))), "unknown field"
        elif text.startswith("Object missing required field"):
            field, text = ".".join(filter(None, (field, text.split("`")[1]))), "required"
        raise InvalidRequest(f"{field or 'body'}: {text}") from None
    except msgspec.DecodeError:
        raise InvalidRequest("body: not a JSON object") from None


def checked(values: dict[str, Any], role: str = "client") -> dict[str, Any]:
    """What the types cannot say, for a create's or an update's given fields (as a dict)."""
    if "name" in values and not 0 < len(values["name"].strip()) <= MAX_NAME:
        raise InvalidRequest(f"name: 1 to {MAX_NAME} characters, not blank")
    if values.get("tenant") is not None and not TENANT.fullmatch(values["tenant"]):
        raise InvalidRequest("tenant: letters, digits, '.', '_' and '-' (at most 128), starting with a letter or digit")
    if role == "admin":
        for field in ("tenant", "limits", "models", "budget"):
            if values.get(field) is not None:
                raise InvalidRequest(f"{field}: an admin key calls no model; give {field} to client keys only")
    limits = values.get("limits")
    if limits is not None:
        for name in (*RATES, *BUDGETS, "max_concurrent"):
            if getattr(limits, name) is not None and getattr(limits, name) < 1:
                raise InvalidRequest(f"limits.{name}: must be 1 or more (leave it out for no limit)")
    for index, model in enumerate(values.get("models") or []):
        if not model.strip() or len(model) > MAX_NAME:
            raise InvalidRequest(f"models.{index}: a model name or glob (such as 'qwen3-*'), not blank")
    if values.get("budget") is not None:
        values["budget"] = _budget(values["budget"])
    if values.get("expires_at") is not None:
        values["expires_at"] = timestamp("expires_at", values["expires_at"])
    return values


def _budget(budget: Budget) -> Budget:
    try:
        amount = Decimal(budget.amount)
    except InvalidOperation:
        raise InvalidRequest(
            f'budget.amount: cents as a decimal string (such as "5000"), got {budget.amount[:20]!r}'
        ) from None
    if not amount.is_finite() or not 0 <= amount <= MOST_CENTS:
        raise InvalidRequest(f"budget.amount: from 0 to {MOST_CENTS} cents")
    return msgspec.structs.replace(budget, amount=format(amount.normalize(), "f"))


def timestamp(field: str, value: str) -> float:
    try:
        at = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(
            f"{field}: an RFC 3339 timestamp (such as 2027-01-31T00:00:00Z), got {value[:40]!r}"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.UTC)
    return at.timestamp()


def rfc3339(at: float | None) -> str | None:
    if at is None:
        return None
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat().replace("+00:00", "Z")
