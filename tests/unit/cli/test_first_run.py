"""What a new user reads first: the banner `scripts/run` prints."""

from __future__ import annotations

from dragoman.cli import quickstart
from dragoman.core.config_load import from_dict
from tests.support.claude_cli import claude_command_line, claude_environment, readme_claude_environment

LOCAL = "http://127.0.0.1:40123/v1"


def banner() -> str:
    config = from_dict({"server": {"default_model": "smollm2-135m-instruct"}, "upstreams": {"local": {"url": LOCAL}}})
    return quickstart(config, LOCAL)


def test_the_banner_starts_claude_code_as_the_readme_does() -> None:
    # The README's line is the one tests/e2e/test_claude_code_interactive.py proves on a fresh home.
    assert claude_environment(claude_command_line(banner())) == readme_claude_environment()


def test_the_banner_names_the_local_upstream_and_the_commands_that_inspect_it() -> None:
    text = banner()
    assert f"dragoman check --upstream {LOCAL}" in text
    assert f"dragoman models --upstream {LOCAL}" in text
