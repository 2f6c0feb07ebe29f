"""Command line: parses arguments, builds the config, calls library code."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import click

from dragoman import __version__, keys_command
from dragoman.core.config import Config, ConfigError
from dragoman.core.config_load import from_dict, load
from dragoman.launch import fail as _fail
from dragoman.launch import run, run_local

if TYPE_CHECKING:
    from dragoman.assembly.gateway import Gateway


def build_config(
    *,
    config_path: str | None,
    upstream: str | None,
    upstream_api_key: str | None,
    api_keys: tuple[str, ...],
    default_model: str | None,
    host: str | None,
    port: int | None,
    log_level: str | None,
    classifier_model: str | None = None,
) -> Config:
    """The file's config with the flags laid over it."""
    import msgspec

    base = load(config_path) if config_path else Config()
    data: dict[str, Any] = msgspec.to_builtins(base)
    server = data.setdefault("server", {})
    flags: dict[str, str] = {}  # the keys set by a flag, and the flag
    if upstream:
        entry: dict[str, Any] = {"url": upstream, "protocol": "openai"}
        flags["upstreams.default.url"] = "--upstream"
        if upstream_api_key:
            entry["api_key"] = upstream_api_key
        data.setdefault("upstreams", {})["default"] = entry
    keys = [k for value in api_keys for k in value.split(",") if k.strip()]
    if keys:
        server["api_keys"] = [k.strip() for k in keys]
    for key, value in (("default_model", default_model), ("host", host), ("port", port), ("log_level", log_level)):
        if value is not None:
            server[key] = value
            flags[f"server.{key}"] = "--" + key.replace("_", "-")
    if classifier_model is not None:  # Claude Code's auto mode (docs/claude-code.md#auto-mode)
        data.setdefault("safeguards", {})["model"] = classifier_model
    try:
        return from_dict(data)
    except ConfigError as error:  # a key the user never wrote: name the flag that set it
        raise ConfigError([_named_by_flag(problem, flags) for problem in error.problems]) from None


def _named_by_flag(problem: str, flags: dict[str, str]) -> str:
    """`upstreams.default.url: ...` -> `--upstream: ...` when the flag set that key."""
    key, _, rest = problem.partition(": ")
    return f"{flags[key]}: {rest}" if key in flags and rest else problem


_WHEN = "today or yesterday (UTC midnight), now, a span back (30m, 12h, 7d, 2w), a date or an RFC 3339 timestamp"
EXIT_STATUSES = """\b
Exit statuses:
  0  done; `serve`: stopped by SIGTERM or SIGINT after its requests finished
  1  `check`: an upstream failed to answer
  2  a usage or configuration error (the message names the flag or key)
  3  `serve`: the server failed to start (its log says why)"""


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}, epilog=EXIT_STATUSES)
@click.version_option(__version__, prog_name="dragoman")
def main() -> None:
    """dragoman: an Anthropic Messages API gateway for open models."""


@main.command(short_help="Run the gateway (the local model without an upstream).", epilog=EXIT_STATUSES)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML configuration file.")
@click.option(
    "--upstream",
    help="OpenAI-compatible base URL, including /v1: http://127.0.0.1:8000/v1 (its models are discovered).",
)
@click.option(
    "--upstream-api-key",
    envvar="DRAGOMAN_UPSTREAM_API_KEY",
    show_envvar=True,
    help="Key sent to the --upstream URL (ignored without it).",
)
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    envvar="DRAGOMAN_API_KEYS",
    show_envvar=True,
    help="Key clients must present (repeatable; the variable: comma-separated).",
)
@click.option("--default-model", help="Serve unknown model names (such as claude-*) with this model.")
@click.option(
    "--classifier-model", help="Judge Claude Code's tool calls in auto mode with this model (safeguards.model)."
)
@click.option("--host", default=None, help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port to bind (default 8765).")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=None,
    help="What the log on stderr shows (default info: one access line per request).",
)
@click.option(
    "--workers", type=click.IntRange(1, 64), default=1, show_default=True, help="Processes serving the same port."
)
@click.option(
    "--local-port", type=click.IntRange(0, 65535), default=8766, show_default=True,
    help="Port of the local model's llama-server, started when no upstream is configured (0: any free port).",
)  # fmt: skip
def serve(config_path: str | None, upstream: str | None, upstream_api_key: str | None, api_keys: tuple[str, ...],
          default_model: str | None, classifier_model: str | None, host: str | None, port: int | None,
          log_level: str | None, workers: int, local_port: int) -> None:  # fmt: skip
    """Run the gateway, until SIGTERM or SIGINT (then requests in flight finish).

    Without an upstream (no --upstream, no [upstreams] in --config) it serves the embedded
    local model: it builds llama-server on first use (a few minutes), then starts it with
    SmolLM2. SIGHUP re-reads --config and swaps it in without closing the port.
    """
    if isinstance(api_keys, str):  # click passes the env var through unsplit
        api_keys = (api_keys,)

    def load() -> Config:  # at start, and again at each SIGHUP
        return build_config(
            config_path=config_path, upstream=upstream, upstream_api_key=upstream_api_key, api_keys=api_keys,
            default_model=default_model, host=host, port=port, log_level=log_level, classifier_model=classifier_model,
        )  # fmt: skip

    try:
        config = load()
    except ConfigError as error:
        _fail(str(error))
        return
    if not config.upstreams:
        run_local(config, local_port, load)
        return
    run(config, workers=workers, reload=load)


def _inspection_options(command: Any) -> Any:
    command = click.option(
        "--upstream-api-key",
        envvar="DRAGOMAN_UPSTREAM_API_KEY",
        show_envvar=True,
        help="Key sent to the --upstream URL (ignored without it).",
    )(command)
    command = click.option("--upstream", help="OpenAI-compatible base URL, including /v1.")(command)
    return click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML configuration file.")(
        command
    )


def _gateway(command: str, config_path: str | None, upstream: str | None, upstream_api_key: str | None) -> Gateway:
    import msgspec

    from dragoman.assembly.gateway import Gateway

    try:
        config = build_config(config_path=config_path, upstream=upstream, upstream_api_key=upstream_api_key, api_keys=(),
                              default_model=None, host=None, port=None, log_level=None)  # fmt: skip
        if not config.upstreams:  # `serve` would start the local model; there is nothing here to inspect
            raise ConfigError(
                f"no upstream configured: nothing to {command} (give --upstream URL, or --config FILE with "
                "[upstreams.NAME]; for the local model of scripts/run, the command its banner prints)"
            )
        # No client is served here: the clients' keys (`api_keys_env` may name a variable only
        # the serving environment sets) do not matter, and must not stop a check of upstreams.
        config = msgspec.structs.replace(config, server=msgspec.structs.replace(config.server, api_keys_env=None))
        return Gateway(config)  # also checks what only building it can (tokenizer files)
    except ConfigError as error:
        _fail(str(error))
        raise  # unreachable: _fail exits


@main.command(short_help="Show each served model and its upstream.")
@_inspection_options
def models(config_path: str | None, upstream: str | None, upstream_api_key: str | None) -> None:
    """Show each served model, its upstream, and whether (and why) it counts as reasoning."""
    import asyncio

    from dragoman.assembly.inspection import describe_models, registry_note

    gateway = _gateway("list", config_path, upstream, upstream_api_key)
    for line in asyncio.run(describe_models(gateway)):
        click.echo(line)
    note = registry_note(gateway)
    if note:
        click.echo(f"dragoman: {note}", err=True)


@main.command(short_help="Ask every upstream for its models (exit 1 if one fails).")
@_inspection_options
def check(config_path: str | None, upstream: str | None, upstream_api_key: str | None) -> None:
    """Ask every upstream for its models; show the path chosen for each (translate or passthrough)."""
    import asyncio

    from dragoman.assembly.inspection import check_upstreams

    lines, failures = asyncio.run(check_upstreams(_gateway("check", config_path, upstream, upstream_api_key)))
    for line in lines:
        click.echo(line)
    if failures:
        sys.exit(1)


@main.command(short_help="Usage of a period, by tenant and model.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="TOML configuration file: its [usage] store (default: the embedded SQLite store).",
)
@click.option("--since", default=None, help=f"Start: {_WHEN} (default: 24 hours ago).")
@click.option("--until", default=None, help="End, exclusive, as --since takes it (default: now).")
@click.option("--by", default="tenant,model", show_default=True, help="Columns to sum by: tenant, model, key.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV instead of a table (no totals, no refusals).")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table: rows, totals, refusals, the store.")
def usage(config_path: str | None, since: str | None, until: str | None, by: str, as_csv: bool, as_json: bool) -> None:
    """Usage of a period, by tenant and model, from the usage store ([usage]). Requests
    refused for their key (401, 403) are no one's usage: counted apart, as refusals."""
    import asyncio
    import time

    from dragoman.usage import summary
    from dragoman.usage.stores import describe, store_for

    if as_csv and as_json:
        _fail("--csv and --json: choose one")
    try:
        config = load(config_path) if config_path else Config()
    except ConfigError as error:
        _fail(str(error))
    columns = tuple(c.strip() for c in by.split(",") if c.strip())
    unknown = [c for c in columns if c not in summary.BY]
    if unknown:
        _fail(f"--by: unknown column {unknown[0]!r} (tenant, model, key)")
    now = time.time()
    try:
        end = summary.parse_when(until, now) if until else now
    except ValueError as error:
        _fail(f"--until: {error}")
    try:
        start = summary.parse_when(since, now) if since else end - 86400
    except ValueError as error:
        _fail(f"--since: {error}")
    store = describe(config)
    click.echo(f"dragoman: reading {store}" + ("" if config_path else
               " (the default store; --config FILE reads the one a configuration names)"), err=True)  # fmt: skip
    try:
        sums = asyncio.run(summary.summarize(store_for(config), start, end, columns))
    except Exception as error:  # noqa: BLE001 - the store's driver: one line, not a traceback
        _fail(f"cannot read the usage store ({store}): {type(error).__name__}: {error}")
    if as_json:
        click.echo(summary.as_json(sums, columns, start=start, end=end, store=store), nl=False)
    else:
        click.echo(summary.as_csv(sums, columns) if as_csv else summary.as_table(sums, columns), nl=False)


main.add_command(keys_command.keys)


if __name__ == "__main__":  # pragma: no cover
    main()
    os._exit(0)
