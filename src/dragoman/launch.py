"""Starting the server from the command line: the port check, the local model, uvicorn with
its signals. What `dragoman serve` runs once its configuration is built (cli.py)."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

from dragoman.core.config import Config, ConfigError, api_keys_enabled
from dragoman.core.config_load import from_dict


def fail(message: str) -> None:
    click.echo(f"dragoman: error: {message}", err=True)
    sys.exit(2)


def check_port(host: str, port: int, purpose: str = "") -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            reason = "already in use" if error.errno == errno.EADDRINUSE else error.strerror
            fail(f"cannot listen on {host}:{port}{' ' + purpose if purpose else ''}: {reason}")


def run_local(config: Config, local_port: int, load: Callable[[], Config] | None = None) -> None:
    """The embedded default: a local llama-server with SmolLM2-135M, built on first use, on a
    port that stays the same across restarts (a configuration may point at it)."""
    import msgspec

    from dragoman.quickstart import quickstart
    from dragoman_local.localmodel import DEFAULT_LOCAL_MODEL, FIRST_BUILD, LlamaServer, is_set_up

    if local_port:
        check_port("127.0.0.1", local_port, "for the local model (--local-port N picks another, 0 any free one)")
    if is_set_up():
        click.echo("dragoman: no upstream configured; starting the local model", err=True)
    else:
        click.echo(
            "dragoman: no upstream configured; building and starting the local model "
            f"(this first run builds llama-server: {FIRST_BUILD}; later runs start in seconds)",
            err=True,
        )
    try:
        server = LlamaServer(ctx=8192, port=local_port).start()
    except RuntimeError as error:
        fail(f"could not start the local model: {error}")
        return
    try:
        data = msgspec.to_builtins(config)
        upstream_url = server.base_url + "/v1"
        data["upstreams"] = {"local": {"url": upstream_url, "protocol": "openai", "flavor": "llamacpp"}}
        data["server"].setdefault("default_model", None)
        data["server"]["default_model"] = data["server"]["default_model"] or DEFAULT_LOCAL_MODEL
        local = from_dict(data)
        click.echo(quickstart(local, upstream_url, tools_dropped=True), err=True)  # SmolLM2's template
        # uvicorn ends a SIGTERM'd process by raising the signal again once it has shut down:
        # with the default handler that kills the process before `finally`, leaving the
        # llama-server running. As an exception, it runs `finally`.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        run(local, reload=None if load is None else lambda: _served_locally(load(), local))
    finally:
        server.stop()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)  # uvicorn raises it again once it has drained: a clean stop (systemd counts 143 a failure)


def _served_locally(config: Config, local: Config) -> Config:
    """A configuration read again while the local model serves: still without an upstream, it
    keeps serving the local model (`local`'s upstream and default model)."""
    import msgspec

    if config.upstreams:
        return config
    server = msgspec.structs.replace(
        config.server, default_model=config.server.default_model or local.server.default_model
    )
    return msgspec.structs.replace(config, upstreams=local.upstreams, server=server)


def run(config: Config, *, workers: int = 1, reload: Callable[[], Config] | None = None) -> None:
    """Serve until SIGINT or SIGTERM: then stop accepting, let requests in flight
    (streams included) finish for up to `shutdown_grace` seconds, and exit 0. With one
    process and `reload`, SIGHUP swaps in the configuration it gives (server/reload.py)."""
    import msgspec
    import uvicorn

    from dragoman.assembly.observe import configure_logging
    from dragoman.assembly.settings import resolve
    from dragoman.server.app import CONFIG_ENV, create_app, settle_garbage_collector
    from dragoman.server.serving import server_options

    server = config.server
    configure_logging(server.log_level)
    check_port(server.host, server.port)
    if (
        not config.server.api_keys
        and not config.server.api_keys_env
        and not config.server.tenants
        and not config.server.api_keys_file
        and not (config.server.tenants_env or config.server.tenants_file)
        and not api_keys_enabled(config)  # keys made at run time: every request needs one
        and server.host not in ("127.0.0.1", "localhost", "::1")
    ):
        logging.getLogger("dragoman").warning(
            "listening on %s without API keys: anyone who can reach it can use it", server.host
        )
    try:
        settings = resolve(config)  # every problem at once: keys, variables, files, tokenizers, tracing
    except ConfigError as error:
        fail(str(error))
    app: Any
    if workers > 1:  # each worker process resolves and builds its app from the config in the environment
        os.environ[CONFIG_ENV] = msgspec.json.encode(config).decode()
        app = "dragoman.server.app:app_from_environment"
    else:
        try:
            app = create_app(config, settings=settings)
        except ConfigError as error:  # what only building it could find
            fail(str(error))
        if reload is not None:
            app.reload_from(reload)
        settle_garbage_collector()
    for stop in (signal.SIGTERM, signal.SIGINT):  # uvicorn raises it again once drained: then exit 0
        if signal.getsignal(stop) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(stop, _exit_on_sigterm)
    uvicorn.run(
        app,
        factory=workers > 1,
        workers=workers,
        host=server.host,
        port=server.port,
        log_level=server.log_level,
        access_log=False,
        loop="uvloop" if _has("uvloop") else "asyncio",
        **server_options(server.max_connections),
        timeout_graceful_shutdown=server.shutdown_grace,  # type: ignore[arg-type]  # typed int, used as a float timeout
    )


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
