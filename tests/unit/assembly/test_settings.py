"""The configuration resolved once: what it names outside its file read in one place, and
every problem found there reported together, as the file's own are."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dragoman.assembly.gateway import Gateway
from dragoman.assembly.settings import resolve
from dragoman.cli import main
from dragoman.core.config import ConfigError
from dragoman.core.config_load import from_dict

UPSTREAM = {"local": {"url": "http://127.0.0.1:9/v1"}}


def _three_problems(tmp_path: Path) -> dict:
    return {
        "server": {"api_keys_env": "DRAGOMAN_NO_SUCH_KEYS", "tenants_file": {"team-a": str(tmp_path / "none")}},
        "upstreams": UPSTREAM,
        "models": [{"name": "m", "upstream": "local", "tokenizer": str(tmp_path / "no-tokenizer")}],
    }


def test_three_different_problems_are_reported_in_one_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(from_dict(_three_problems(tmp_path)), {})
    problems = caught.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "server.tenants_file.team-a",
        "server.api_keys_env",
        "models.0.tokenizer",
    ]
    assert str(caught.value).startswith("3 problems:\n")


def test_the_gateway_resolves_first_and_reports_them_all(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        Gateway(from_dict(_three_problems(tmp_path)))
    assert len(caught.value.problems) == 3


def test_dragoman_check_prints_every_problem(tmp_path: Path) -> None:
    config = tmp_path / "dragoman.toml"
    config.write_text(
        f'[server]\napi_keys_env = "DRAGOMAN_NO_SUCH_KEYS"\n[server.tenants_file]\nteam-a = "{tmp_path / "none"}"\n'
        f'[upstreams.local]\nurl = "http://127.0.0.1:9/v1"\n'
        f'[[models]]\nname = "m"\nupstream = "local"\ntokenizer = "{tmp_path / "no-tokenizer"}"\n'
    )
    result = CliRunner().invoke(main, ["models", "--config", str(config)])
    assert result.exit_code == 2
    assert "error: 2 problems:" in result.stderr  # `check` and `models` serve no client: api_keys_env is not read
    assert "server.tenants_file.team-a: cannot read" in result.stderr and "models.0.tokenizer:" in result.stderr


def test_what_variables_hold_is_read_once_and_written_in() -> None:
    config = from_dict({
        "upstreams": {"local": {"url": "http://127.0.0.1:9/v1", "api_key": "inline", "api_key_env": "UP_KEY"}},
        "usage": {"database_url_env": "DB_URL"},
        "tracing": {"service_name": None},
    })  # fmt: skip
    environ = {"UP_KEY": "from-env", "DB_URL": "postgresql://db/x", "OTEL_SERVICE_NAME": "gw"}
    resolved = resolve(config, environ).config
    assert resolved.upstreams["local"].api_key == "from-env" and resolved.upstreams["local"].api_key_env is None
    assert (resolved.usage.database_url, resolved.usage.database_url_env) == ("postgresql://db/x", None)
    assert resolved.tracing.service_name == "gw" and resolved.tracing.enabled is False
    assert resolve(config, {"DB_URL": "postgresql://db/x"}).config.upstreams["local"].api_key == "inline"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("mysql://db/x", "usage.database_url_env: the environment variable DB_URL must hold a postgresql:// URL"),
        (None, "usage.database_url_env: the environment variable DB_URL is unset, and no database_url is configured"),
    ],
)
def test_a_database_url_from_the_environment_is_checked(value: str | None, problem: str) -> None:
    config = from_dict({"upstreams": UPSTREAM, "usage": {"database_url_env": "DB_URL"}})
    with pytest.raises(ConfigError) as caught:
        resolve(config, {} if value is None else {"DB_URL": value})
    assert str(caught.value).startswith(problem) and "mysql" not in str(caught.value)


def test_an_admin_key_from_a_variable_must_not_be_a_client_key() -> None:
    config = from_dict({"upstreams": UPSTREAM, "server": {"api_keys": ["k"]}, "admin": {"keys_env": "ADMIN"}})
    with pytest.raises(ConfigError, match="^admin keys: a key is also a client key"):
        resolve(config, {"ADMIN": "k"})


def test_tracing_asked_for_with_a_protocol_it_cannot_speak_is_a_problem() -> None:
    config = from_dict({"upstreams": UPSTREAM, "tracing": {"enabled": False}})
    assert resolve(config, {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}).config.tracing.enabled is False
    on = from_dict({"upstreams": UPSTREAM, "tracing": {"enabled": True}})
    with pytest.raises(ConfigError, match="tracing.protocol: 'carrier-pigeon' is not supported"):
        resolve(on, {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})
