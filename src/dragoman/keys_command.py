"""`dragoman keys`: the Admin API from a terminal. It talks to a running gateway (`--url`)
with an admin key (`--admin-key`), never to the database: changes are checked, audited and
seen by every process exactly as the API's are, and no database password is needed here."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import click

from dragoman.core.limit_settings import BUDGETS, RATES

LIMITS = (*RATES, *BUDGETS, "max_concurrent")
PATH = "/v1/organizations/api_keys"


class Api:
    def __init__(self, url: str, key: str | None) -> None:
        if not key:
            raise click.UsageError("an admin key is needed: --admin-key or DRAGOMAN_ADMIN_KEY")
        self.url, self.key = url.rstrip("/").removesuffix("/v1"), key

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, **query: Any) -> Any:
        params = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        request = urllib.request.Request(self.url + path + (f"?{params}" if params else ""), method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"x-api-key": self.key, "content-type": "application/json",
                                                  "anthropic-version": "2023-06-01"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as error:
            try:
                message = json.load(error)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = error.reason
            raise click.ClickException(f"{error.code}: {message}") from None
        except (urllib.error.URLError, OSError) as error:
            raise click.ClickException(
                f"cannot reach the gateway at {self.url}: {getattr(error, 'reason', error)}"
            ) from None


def _limits(values: tuple[str, ...]) -> dict[str, int] | None:
    if not values:
        return None
    limits = {}
    for value in values:
        name, _, number = value.partition("=")
        if name not in LIMITS or not number.isdigit():
            raise click.BadParameter(
                f"{value!r}: NAME=NUMBER with NAME one of {', '.join(LIMITS)}", param_hint="--limit"
            )
        limits[name] = int(number)
    return limits


def _budget(value: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    amount, _, period = value.partition("/")
    return {"amount": amount, "currency": "USD", "period": period or "month"}


def _show(key: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(key, indent=2))
        return
    for name, value in key.items():
        if name not in ("type", "scope", "principal", "workspace_id"):
            click.echo(f"{name + ':':<18}{json.dumps(value) if isinstance(value, (dict, list)) else value}")


def _row(key: dict[str, Any]) -> list[str]:
    budget = key.get("budget")
    spent = f"{budget['used'] or '?'}/{budget['amount']}¢ per {budget['period']}" if budget else ""
    return [key["id"], key["name"], key.get("tenant") or "", key["status"], key.get("role", ""), key.get("source", ""),
            key.get("partial_key_hint") or "", spent, key.get("last_used_at") or ""]  # fmt: skip


def _table(keys: list[dict[str, Any]]) -> str:
    rows = [["ID", "NAME", "TENANT", "STATUS", "ROLE", "SOURCE", "HINT", "BUDGET (cents)", "LAST USED"]]
    rows += [_row(k) for k in keys]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


@click.group(short_help="Create, list, update and revoke API keys.")
@click.option("--url", envvar="DRAGOMAN_URL", default="http://127.0.0.1:8765", show_default=True,
              show_envvar=True, help="The running gateway.")  # fmt: skip
@click.option("--admin-key", envvar="DRAGOMAN_ADMIN_KEY", show_envvar=True, help="An admin key ([admin] keys).")
@click.pass_context
def keys(context: click.Context, url: str, admin_key: str | None) -> None:
    """API keys made at run time, through a running gateway's Admin API (docs/team.md)."""
    context.obj = (url, admin_key)


def _api(context: click.Context) -> Api:
    return Api(*context.obj)


_JSON = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
_LIMIT = click.option("--limit", "limits", multiple=True, metavar="NAME=N", help=f"A limit ({', '.join(LIMITS)}).")
_MODELS = click.option("--models", help="Comma-separated names or globs this key may ask for (default: all).")
_BUDGET = click.option(
    "--budget", metavar="CENTS[/PERIOD]", help="A money budget, e.g. 5000/month (period day, week, month)."
)
_EXPIRES = click.option("--expires-at", help="RFC 3339 time the key stops working.")


@keys.command()
@click.argument("name")
@click.option("--tenant", help="The tenant it belongs to (shares its files, batches and limits).")
@click.option("--role", type=click.Choice(["client", "admin"]), default="client", show_default=True)
@_LIMIT
@_MODELS
@_BUDGET
@_EXPIRES
@_JSON
@click.pass_context
def create(context: click.Context, name: str, tenant: str | None, role: str, limits: tuple[str, ...],
           models: str | None, budget: str | None, expires_at: str | None, as_json: bool) -> None:  # fmt: skip
    """Make a key; its secret is printed once."""
    body: dict[str, Any] = {"name": name, "role": role, "tenant": tenant, "limits": _limits(limits),
                            "models": models.split(",") if models else None, "budget": _budget(budget),
                            "expires_at": expires_at}  # fmt: skip
    made = _api(context).call("POST", PATH, {k: v for k, v in body.items() if v is not None})
    if as_json:
        click.echo(json.dumps(made, indent=2))
        return
    click.echo(f"{made['key']}\n", nl=True)
    click.echo(f"The secret above is shown once. Key id: {made['id']}", err=True)


@keys.command(name="list")
@click.option("--status", type=click.Choice(["active", "inactive", "archived", "expired"]))
@click.option("--tenant")
@_JSON
@click.pass_context
def list_keys(context: click.Context, status: str | None, tenant: str | None, as_json: bool) -> None:
    """Every key, newest first (all pages)."""
    api, found, after = _api(context), [], None
    while True:
        page = api.call("GET", PATH, limit=1000, status=status, tenant=tenant, after_id=after)
        found += page["data"]
        if not page["has_more"]:
            break
        after = page["last_id"]
    click.echo(json.dumps(found, indent=2) if as_json else _table(found))


@keys.command()
@click.argument("key_id")
@_JSON
@click.pass_context
def show(context: click.Context, key_id: str, as_json: bool) -> None:
    """One key."""
    _show(_api(context).call("GET", f"{PATH}/{key_id}"), as_json)


@keys.command()
@click.argument("key_id")
@click.option("--name")
@click.option("--status", type=click.Choice(["active", "inactive", "archived"]))
@_LIMIT
@click.option("--no-limits", is_flag=True, help="Remove the key's own limits.")
@_MODELS
@click.option("--all-models", is_flag=True, help="Let the key ask for any model.")
@_BUDGET
@click.option("--no-budget", is_flag=True, help="Remove the key's budget.")
@_EXPIRES
@click.option("--no-expiry", is_flag=True, help="The key never expires.")
@_JSON
@click.pass_context
def update(context: click.Context, key_id: str, name: str | None, status: str | None, limits: tuple[str, ...],
           no_limits: bool, models: str | None, all_models: bool, budget: str | None, no_budget: bool,
           expires_at: str | None, no_expiry: bool, as_json: bool) -> None:  # fmt: skip
    """Change a key: what is not given stays as it is."""
    body: dict[str, Any] = {k: v for k, v in (("name", name), ("status", status), ("limits", _limits(limits)),
                            ("models", models.split(",") if models else None), ("budget", _budget(budget)),
                            ("expires_at", expires_at)) if v is not None}  # fmt: skip
    for flag, field in (
        (no_limits, "limits"),
        (all_models, "models"),
        (no_budget, "budget"),
        (no_expiry, "expires_at"),
    ):
        if flag:
            body[field] = None
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    _show(_api(context).call("POST", f"{PATH}/{key_id}", body), as_json)


@keys.command()
@click.argument("key_id")
@_JSON
@click.pass_context
def revoke(context: click.Context, key_id: str, as_json: bool) -> None:
    """Stop a key at once on every process (status inactive; `update --status active` undoes it)."""
    _show(_api(context).call("POST", f"{PATH}/{key_id}", {"status": "inactive"}), as_json)


@keys.command()
@click.argument("key_id")
@_JSON
@click.pass_context
def delete(context: click.Context, key_id: str, as_json: bool) -> None:
    """Delete a key for good (its usage records stay)."""
    gone = _api(context).call("DELETE", f"{PATH}/{key_id}")
    click.echo(json.dumps(gone, indent=2) if as_json else f"deleted {gone['id']}")
