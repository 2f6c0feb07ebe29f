"""`dragoman keys` against a running gateway's Admin API: make, list, show, update, revoke, delete."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from click.testing import CliRunner

from dragoman.cli import main
from tests.support.fakes import FakeUpstream, completion
from tests.support.keys import ADMIN, ask, keys_config


def _keys(url: str, *args: str, admin_key: str = ADMIN) -> Any:
    result = CliRunner().invoke(main, ["keys", "--url", url, "--admin-key", admin_key, *args])
    return result


def test_a_team_lead_manages_keys_from_the_terminal(upstream: FakeUpstream, gateway_from: Any) -> None:
    url = gateway_from(keys_config(upstream.url)).url
    made = _keys(url, "create", "alice", "--tenant", "team-a", "--limit", "requests_per_minute=60",
                 "--budget", "5000/month", "--models", "test-*")  # fmt: skip
    assert made.exit_code == 0, made.output
    secret = made.stdout.strip()
    assert secret.startswith("sk-dm-") and "shown once" in made.stderr
    upstream.json_reply(completion("hi"))
    assert ask(url, secret).content[0].text == "hi"
    listed = _keys(url, "list")
    assert listed.exit_code == 0 and "alice" in listed.output and "team-a" in listed.output
    assert "0/5000¢ per month" in listed.output and secret not in listed.output
    keys = json.loads(_keys(url, "list", "--json").output)
    alice = next(k for k in keys if k["name"] == "alice")
    shown = json.loads(_keys(url, "show", alice["id"], "--json").output)
    assert shown["limits"] == {"requests_per_minute": 60} and shown["models"] == ["test-*"]
    changed = json.loads(_keys(url, "update", alice["id"], "--name", "alice2", "--no-budget", "--json").output)
    assert changed["name"] == "alice2" and changed["budget"] is None
    assert _keys(url, "revoke", alice["id"]).exit_code == 0
    with pytest.raises(anthropic.AuthenticationError):
        ask(url, secret)
    assert f"deleted {alice['id']}" in _keys(url, "delete", alice["id"]).output


def test_errors_are_one_line_naming_the_field_or_the_key(upstream: FakeUpstream, gateway_from: Any) -> None:
    url = gateway_from(keys_config(upstream.url)).url
    bad = _keys(url, "create", "x", "--budget", "lots/day")
    assert bad.exit_code == 1 and "400: budget.amount:" in bad.output
    assert "401" in _keys(url, "list", admin_key="sk-wrong").output
    assert "404" in _keys(url, "show", "key_nope").output
    assert "--limit" in _keys(url, "create", "x", "--limit", "rpm=3").output
