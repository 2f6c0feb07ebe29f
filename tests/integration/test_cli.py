"""The command line, as a user runs it: `python -m dragoman ...` in a subprocess.
Every process is killed in a finally block; every wait is bounded."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import anthropic
import httpx
import pytest

from dragoman import __version__
from tests.support.fakes import completion, text_stream
from tests.support.servers import free_port, start_serving
from tests.support.waiting import eventually

USER = [{"role": "user", "content": "Hello"}]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAGOMAN_")}
    env["DRAGOMAN_CACHE_DIR"] = str(tmp_path / "cache")  # keep the models.dev cache out of $HOME
    env.update(extra)
    return env


def _run(tmp_path: Path, *args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dragoman", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(tmp_path, **env),
        cwd=tmp_path,
    )


def _error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


@contextlib.contextmanager
def serving(tmp_path: Path, *args: str, **env: str) -> Iterator[str]:
    """Run `dragoman serve ARGS --port P`; yield its base URL once it answers."""
    logs: list[IO[str]] = []

    def start(port: int) -> subprocess.Popen[str]:
        logs.append((tmp_path / f"serve-{port}.log").open("w+"))
        return subprocess.Popen(
            [sys.executable, "-m", "dragoman", "serve", *args, "--port", str(port)],
            stdout=logs[-1], stderr=subprocess.STDOUT, env=_env(tmp_path, **env), cwd=tmp_path,
        )  # fmt: skip

    def output(process: subprocess.Popen[str]) -> str:
        logs[-1].seek(0)
        return logs[-1].read()

    try:
        try:
            process, url = start_serving(start, output, path="/")
        except AssertionError as error:
            pytest.fail(f"dragoman serve: {error}")
        try:
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
    finally:
        for log in logs:
            log.close()


# -- informational ----------------------------------------------------------------------


def test_help(tmp_path):
    result = _run(tmp_path, "--help")
    assert result.returncode == 0
    assert "serve" in result.stdout
    result = _run(tmp_path, "serve", "--help")
    assert result.returncode == 0
    for option in ("--upstream", "--config", "--port", "--default-model", "--api-key"):
        assert option in result.stdout


@pytest.mark.parametrize("command", ["serve", "check", "models"])
def test_help_names_the_environment_variables_of_the_keys(tmp_path, command):
    """Keys are best passed in the environment, out of `ps` and shell history: the help says how."""
    result = _run(tmp_path, command, "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # click wraps long lines
    assert "--upstream-api-key" in text and "DRAGOMAN_UPSTREAM_API_KEY" in text
    if command == "serve":
        assert "DRAGOMAN_API_KEYS" in text


def test_version(tmp_path):
    result = _run(tmp_path, "--version")
    assert result.returncode == 0
    assert __version__ in result.stdout and "dragoman" in result.stdout


# -- startup failures: exit code 2 and one clear line -------------------------------------------


@pytest.mark.parametrize(
    ("toml", "names"),
    [
        ('[server]\nport = "eighty"\n', ["server.port"]),
        ("[server]\nprot = 8080\n", ["prot"]),
        ('[upstreams.local]\nurl = "http://127.0.0.1:1/v1"\nflavour = "vllm"\n', ["upstreams.local", "flavour"]),
        ('[upstreams.local]\nurl = "127.0.0.1:8000"\n', ["upstreams.local.url", "http://"]),
        (
            '[upstreams.local]\nurl = "http://127.0.0.1:1/v1"\nfirst_byte_timeout = 0\n',
            ["upstreams.local.first_byte_timeout"],
        ),
        (
            '[upstreams.local]\nurl = "http://127.0.0.1:1/v1"\n[[models]]\nname = "m"\nupstream = "elsewhere"\n',
            ["models.0.upstream", "elsewhere"],
        ),
        ("[server\nport = 1\n", ["invalid TOML"]),
        ("[server]\nport = 70000\n", ["server.port"]),
        ('[upstreams.local]\nurl = "http://[::1/v1"\n', ["upstreams.local.url", "not a valid URL"]),
    ],
    ids=[
        "wrong-type",
        "unknown-server-key",
        "unknown-upstream-key",
        "url-without-scheme",
        "zero-timeout",
        "unknown-upstream",
        "bad-toml",
        "port-out-of-range",
        "unparsable-url",
    ],  # fmt: skip
)
def test_bad_config_file(tmp_path, toml, names):
    config = tmp_path / "dragoman.toml"
    config.write_text(toml)
    result = _run(tmp_path, "serve", "--config", str(config), "--port", str(free_port()))
    assert result.returncode == 2, result.stderr
    lines = _error_lines(result)
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for name in names:
        assert name in lines[0]
    assert str(config) in lines[0] or "dragoman.toml" in lines[0]


@pytest.mark.parametrize(
    "toml",
    ['[upstreams.local]\nurl = "http://127.0.0.1:1/v1"\nflavour = "vllm"\n', "[upstreams.local]\nurl = 5\n"],
    ids=["unknown-key", "wrong-type"],
)
def test_bad_config_names_the_upstream(tmp_path, toml):
    config = tmp_path / "dragoman.toml"
    config.write_text(toml)
    result = _run(tmp_path, "serve", "--config", str(config), "--port", str(free_port()))
    assert result.returncode == 2
    lines = _error_lines(result)
    assert len(lines) == 1 and "upstreams.local" in lines[0]


def test_every_mistake_of_a_config_file_is_reported_at_once(tmp_path):
    config = tmp_path / "dragoman.toml"
    config.write_text(
        '[server]\ndefualt_model = "qwen"\nport = 70000\n'
        '[upstreams.local]\nurl = "localhost:8000"\nconnect_timeout = "slow"\n'
        '[[models]]\nname = "m"\nupstream = "elsewhere"\n'
    )
    result = _run(tmp_path, "serve", "--config", str(config), "--port", str(free_port()))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert _error_lines(result) == [
        f"dragoman: error: {config}: 5 problems:",
        "  server.defualt_model: unknown key (did you mean default_model?)",
        "  upstreams.local.connect_timeout: Expected `float`, got `str`",
        "  server.port: must be 1 to 65535, got 70000",
        "  upstreams.local.url: must start with http:// or https://, got 'localhost:8000'",
        "  models.0.upstream: unknown upstream 'elsewhere' (known: local)",
    ], result.stderr


@pytest.mark.parametrize("command", ["serve", "check"])
def test_a_bad_upstream_flag_is_named_as_the_flag(tmp_path, command):
    """Not `upstreams.default.url`, a key the user never wrote."""
    result = _run(tmp_path, command, "--upstream", "localhost:8000/v1")
    assert result.returncode == 2, result.stderr
    assert _error_lines(result) == [
        "dragoman: error: --upstream: must start with http:// or https://, got 'localhost:8000/v1'"
    ], result.stderr


def test_missing_config_file(tmp_path):
    result = _run(tmp_path, "serve", "--config", str(tmp_path / "nope.toml"), "--port", str(free_port()))
    assert result.returncode == 2
    lines = _error_lines(result)
    assert len(lines) == 1 and "nope.toml" in lines[0] and "not found" in lines[0]


def test_api_keys_env_naming_an_unset_variable_stops_serve_instead_of_serving_unauthenticated(tmp_path):
    config = tmp_path / "dragoman.toml"
    config.write_text(
        '[server]\napi_keys_env = "DRAGOMAN_TEST_UNSET_KEYS"\n[upstreams.local]\nurl = "http://127.0.0.1:9/v1"\n'
    )
    result = _run(tmp_path, "serve", "--config", str(config), "--port", str(free_port()))
    assert result.returncode == 2, result.stderr
    lines = _error_lines(result)
    assert len(lines) == 1 and "server.api_keys_env" in lines[0] and "DRAGOMAN_TEST_UNSET_KEYS" in lines[0], (
        result.stderr
    )


@pytest.mark.parametrize("command", ["check", "models"])
def test_check_and_models_run_without_the_client_keys_variable(tmp_path, upstream, command):
    # they serve no client: a variable only the serving environment sets must not stop them
    config = tmp_path / "dragoman.toml"
    config.write_text(
        f'[server]\napi_keys_env = "DRAGOMAN_TEST_UNSET_KEYS"\n[upstreams.local]\nurl = "{upstream.url}"\n'
    )
    result = _run(tmp_path, command, "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "test-model" in result.stdout


def test_port_already_in_use(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        result = _run(tmp_path, "serve", "--upstream", "http://127.0.0.1:9/v1", "--port", str(port), timeout=30)
    assert result.returncode == 2, result.stderr
    lines = _error_lines(result)
    assert len(lines) == 1, result.stderr
    assert "already in use" in lines[0] and str(port) in lines[0]
    assert "Traceback" not in result.stderr


# -- serving ------------------------------------------------------------------------------


def test_serve_with_the_upstream_down_starts_and_answers_clearly(tmp_path, dead_port):
    with serving(tmp_path, "--upstream", f"http://127.0.0.1:{dead_port}/v1", "--api-key", "cli-key") as url:
        assert httpx.head(f"{url}/", timeout=5).status_code == 200
        client = anthropic.Anthropic(base_url=url, api_key="cli-key", max_retries=0)
        with pytest.raises(anthropic.InternalServerError) as caught:
            client.messages.create(model="any-model", max_tokens=5, messages=USER)
        assert caught.value.status_code == 502
        assert caught.value.body["error"]["type"] == "api_error"
        assert "unreachable" in caught.value.message
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
                model="m", max_tokens=5, messages=USER
            )
        ready = httpx.get(f"{url}/ready", timeout=10)
        assert ready.status_code == 503


def test_serve_default_model_answers_claude_names(tmp_path, upstream):
    upstream.json_reply(completion("Hello!"))
    upstream.stream_reply(text_stream("streamed ", "reply"))
    with serving(
        tmp_path, "--upstream", upstream.url, "--default-model", "test-model", DRAGOMAN_API_KEYS="env-a,env-b"
    ) as url:
        client = anthropic.Anthropic(base_url=url, api_key="env-b", max_retries=0)
        message = client.messages.create(model="claude-haiku-4-5-20251001", max_tokens=5, messages=USER)
        assert message.content[0].text == "Hello!"
        assert message.model == "claude-haiku-4-5-20251001"
        with client.messages.stream(model="claude-opus-4-6", max_tokens=5, messages=USER) as stream:
            final = stream.get_final_message()
        assert final.content[0].text == "streamed reply" and final.model == "claude-opus-4-6"
        assert [r["model"] for r in upstream.requests] == ["test-model", "test-model"]
        ids = [m.id for m in client.models.list()]
        assert "test-model" in ids
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="nope", max_retries=0).models.list()


def test_serve_classifier_model_answers_claude_codes_auto_mode(tmp_path, upstream):
    upstream.json_reply(completion("Run it.", finish="tool_calls", tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}]))  # fmt: skip
    upstream.json_reply(completion('{"call_1": {"reason": "a listing", "flagged": false}}'))
    with serving(tmp_path, "--upstream", upstream.url, "--default-model", "test-model",
                 "--classifier-model", "test-model") as url:  # fmt: skip
        client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
        message = client.messages.create(model="claude-opus-4-6", max_tokens=50, messages=USER,
                                         extra_body={"safeguards": [{"type": "dangerous_tool_use"}]})  # fmt: skip
    verdicts = message.model_extra["safeguard_results"][0]["status"]["tool_uses"]
    assert list(verdicts.values()) == [{"type": "evaluated", "outcome": "not_flagged"}]
    assert upstream.requests[1]["response_format"]["type"] == "json_schema"


# -- check and models -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "models"])
@pytest.mark.parametrize("config", ["[server]\nport = 9000\n", None], ids=["no-upstreams-in-file", "no-config-at-all"])
def test_check_and_models_with_no_upstream_say_there_is_nothing_to_do(tmp_path, command, config):
    """Silence and status 0 read as "all is well"; with no upstream nothing was checked."""
    args: tuple[str, ...] = ()
    if config is not None:
        (tmp_path / "dragoman.toml").write_text(config)
        args = ("--config", str(tmp_path / "dragoman.toml"))
    result = _run(tmp_path, command, *args)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = _error_lines(result)
    assert len(lines) == 1 and "no upstream configured" in lines[0] and "nothing to" in lines[0], result.stderr


def test_check_and_models_show_a_model_that_two_upstreams_list(tmp_path):
    """Two discovering upstreams list the same id: the first in the file serves it, and both
    commands say which one is shadowed."""
    from tests.support.fakes import FakeUpstream

    first = FakeUpstream(
        [{"id": "shared", "object": "model", "owned_by": "vllm"}, {"id": "only-first", "object": "model"}]
    ).start()
    second = FakeUpstream(
        [{"id": "only-second", "object": "model"}, {"id": "shared", "object": "model", "owned_by": "vllm"}]
    ).start()
    try:
        config = tmp_path / "dragoman.toml"
        config.write_text(f'[upstreams.first]\nurl = "{first.url}"\n[upstreams.second]\nurl = "{second.url}"\n')
        checked = _run(tmp_path, "check", "--config", str(config))
        assert checked.returncode == 0, checked.stderr
        lines = {line.split("\t")[0]: line for line in checked.stdout.splitlines()}
        assert "shared (? tokens)" in lines["first"]
        assert "shared (? tokens, shadowed by first)" in lines["second"] and "only-second (? tokens)" in lines["second"]

        listed = _run(tmp_path, "models", "--config", str(config))
        assert listed.returncode == 0, listed.stderr
        models = {line.split("\t")[0]: line for line in listed.stdout.splitlines()}
        assert "upstream=first" in models["shared"] and models["shared"].endswith("\talso listed by second (shadowed)")
        assert "also listed" not in models["only-first"] and "also listed" not in models["only-second"]
        warnings = [line for line in listed.stderr.splitlines() if "more than one upstream" in line]
        assert len(warnings) == 1 and "'shared'" in warnings[0] and "never reach second" in warnings[0], listed.stderr
    finally:
        first.stop()
        second.stop()


def test_serve_with_a_default_model_the_upstream_does_not_list(tmp_path, upstream):
    """A Claude name sent to a default model the upstream lacks: the 404 names both models, and
    the log said so at discovery, before any request."""
    with serving(tmp_path, "--upstream", upstream.url, "--default-model", "qwen-missing") as url:
        log = (
            tmp_path / f"serve-{url.rsplit(':', 1)[1]}.log"
        )  # the started server's (not one that found its port taken)
        # discovery runs after start-up: wait for its word
        eventually(lambda: "qwen-missing" in log.read_text(), "the log names the missing model", timeout=20)
        client = anthropic.Anthropic(base_url=url, api_key="any", max_retries=0)
        with pytest.raises(anthropic.NotFoundError) as caught:
            client.messages.create(model="claude-opus-4-8", max_tokens=5, messages=USER)
        assert caught.value.status_code == 404
        error = caught.value.body["error"]
        assert error["type"] == "not_found_error"
        assert (
            error["message"].startswith("model: 'claude-opus-4-8' ")
            and "default model 'qwen-missing'" in error["message"]
        )
        assert "test-model" in error["message"]  # what is served
        assert upstream.requests == []
    warnings = [line for line in log.read_text().splitlines() if "WARNING" in line and "qwen-missing" in line]
    assert len(warnings) == 1 and "server.default_model" in warnings[0], log.read_text()


@pytest.mark.parametrize(
    ("suffix", "requested", "hint"),
    [("", "/models", "does the upstream's URL lack /v1?"), ("/v1/v1", "/v1/v1/models", "the URL has /v1 twice")],
    ids=["missing-v1", "doubled-v1"],
)
def test_check_names_the_url_it_asked_and_a_missing_or_extra_v1(tmp_path, suffix, requested, hint):
    """`dragoman check --upstream URL` pointed at a server without `/v1` (dragoman's own address,
    say) names the URL it requested, not `/v1/models`, and what the 404 suggests."""
    from tests.support.fakes import FakeUpstream

    upstream = FakeUpstream().start()
    root = upstream.url.removesuffix("/v1")
    try:
        checked = _run(tmp_path, "check", "--upstream", root + suffix)
    finally:
        upstream.stop()
    assert f"(GET {root}{requested} answered 404): " in checked.stdout, checked.stdout + checked.stderr
    assert hint in checked.stdout, checked.stdout


def test_an_upstream_without_a_model_list_is_reachable_and_judges_the_names_no_list_has(tmp_path):
    """Two upstreams, the second without `GET /v1/models` (404): `check` shows it reachable
    (exit 0), and through the gateway a name the first lists goes to the first while any other
    goes to the second, whose own 404 reaches the SDK as a 404 (it was a 502, retried)."""
    from tests.support.fakes import FakeUpstream

    listing = FakeUpstream([{"id": "m1", "object": "model", "owned_by": "vllm"}]).start()
    listless = FakeUpstream().start()
    listless.no_model_list = True
    try:
        config = tmp_path / "dragoman.toml"
        config.write_text(f'[upstreams.first]\nurl = "{listing.url}"\n[upstreams.hosted]\nurl = "{listless.url}"\n')
        checked = _run(tmp_path, "check", "--config", str(config))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        lines = {line.split("\t")[0]: line for line in checked.stdout.splitlines()}
        assert lines["hosted"].endswith(
            f"\tupstream hosted has no model list (GET {listless.url}/models answered 404)"
        ), lines
        assert "unreachable" not in checked.stdout

        with serving(tmp_path, "--config", str(config)) as url:
            client = anthropic.Anthropic(base_url=url, api_key="any", max_retries=0)
            assert client.messages.create(model="m1", max_tokens=5, messages=USER).content[0].text == "Hello!"
            assert [r["model"] for r in listing.requests] == ["m1"]
            assert client.messages.create(model="hosted-model", max_tokens=5, messages=USER).content[0].text == "Hello!"
            assert [r["model"] for r in listless.requests] == ["hosted-model"]

            listless.json_reply(
                {"error": {"message": "The model `hosted-typo` does not exist.", "type": "invalid_request_error"}},
                status=404,
            )
            with pytest.raises(anthropic.NotFoundError) as caught:
                client.messages.create(model="hosted-typo", max_tokens=5, messages=USER)
            assert caught.value.body["error"]["type"] == "not_found_error"
            assert "hosted-typo" in caught.value.body["error"]["message"]
    finally:
        listing.stop()
        listless.stop()
