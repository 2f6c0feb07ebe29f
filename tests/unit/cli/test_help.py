"""What `dragoman --help` and each command's help tell a new user."""

from __future__ import annotations

import re

import click
from click.testing import CliRunner

from dragoman.cli import main


def help_of(*command: str, width: int = 80) -> str:
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_no_command_description_is_cut_off() -> None:
    for width in (80, 100):
        text = help_of(width=width)
        listed = text.split("Commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert [line.split()[0] for line in listed] == ["check", "keys", "models", "serve", "usage"]
        assert not any(line.rstrip().endswith("...") for line in listed), listed


def test_every_option_is_described() -> None:
    for name, command in main.commands.items():
        for option in command.params:
            assert isinstance(option, click.Option) and option.help, f"{name} {option.opts} has no description"


def test_log_level_says_what_it_sets() -> None:
    text = " ".join(help_of("serve").split())
    assert "--log-level [debug|info|warning|error] What the log on stderr shows" in text


def test_serve_says_it_builds_the_local_model_without_an_upstream() -> None:
    text = " ".join(help_of("serve").split())
    assert "Without an upstream" in text and "builds llama-server" in text and "local model" in text
    assert "SIGHUP" in text


def test_upstream_says_to_include_v1() -> None:
    for command in ("serve", "check", "models"):
        text = " ".join(help_of(command).split())
        assert re.search(r"--upstream TEXT .{0,40}including /v1", text), command


def test_exit_statuses_are_in_the_help() -> None:
    for command in ((), ("serve",)):
        text = help_of(*command)
        statuses = text.split("Exit statuses:\n", 1)[1]
        assert [line.split()[0] for line in statuses.strip().splitlines()] == ["0", "1", "2", "3"]
        assert "SIGTERM" in statuses
