"""Configuration: a startup error must name the offending key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dragoman.core import config, config_keys, config_load
from dragoman.core.config import AnthropicUpstream, ConfigError, OpenAIUpstream
from dragoman.core.redaction import Redactor


def good(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "server": {"port": 9000},
        "upstreams": {"local": {"url": "http://127.0.0.1:8000/v1"}},
        "models": [{"name": "qwen", "upstream": "local"}],
    }
    data.update(overrides)
    return data


def failure(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        config_load.from_dict(data)
    return str(caught.value)


def test_defaults() -> None:
    loaded = config_load.from_dict({})
    assert loaded.server.host == "127.0.0.1" and loaded.upstreams == {} and loaded.models == []


def test_protocol_defaults_to_openai() -> None:
    loaded = config_load.from_dict(good())
    upstream = loaded.upstreams["local"]
    assert isinstance(upstream, OpenAIUpstream) and upstream.flavor == "auto"
    assert loaded.models[0].served_model == "qwen"


def test_anthropic_protocol() -> None:
    loaded = config_load.from_dict(good(upstreams={"claude": {"url": "https://api.anthropic.com", "protocol": "anthropic"}},
                                   models=[{"name": "c", "upstream": "claude"}]))  # fmt: skip
    assert isinstance(loaded.upstreams["claude"], AnthropicUpstream)


@pytest.mark.parametrize(
    ("data", "prefix", "fragment"),
    [
        (good(server={"port": "eighty"}), "server.port:", "int"),
        (good(server={"port": 9000, "prot": 1}), "server.prot:", "unknown"),
        (good(server={"server_tools": "ignore"}), "server.server_tools:", "ignore"),
        ({**good(), "bogus": 1}, "bogus:", "unknown"),
        ({"upstreams": {"x": {"url": "ftp://example.com"}}}, "upstreams.x.url:", "http://"),
        ({"upstreams": {"x": {"url": "localhost:8000"}}}, "upstreams.x.url:", "http://"),
        ({"upstreams": {"x": {}}}, "upstreams.x.url:", ""),
        ({"upstreams": {"x": {"url": 8000}}}, "upstreams.x.url:", "str"),
        ({"upstreams": {"x": {"url": "http://a", "protocol": "grpc"}}}, "upstreams.x.protocol:", "grpc"),
        ({"upstreams": {"x": {"url": "http://a", "flavour": "vllm"}}}, "upstreams.x.flavour:", "unknown"),
        ({"upstreams": {"x": {"url": "http://a", "flavor": "tgi"}}}, "upstreams.x.flavor:", "tgi"),
        ({"upstreams": {"x": {"url": "http://a", "idle_timeout": 0}}}, "upstreams.x.idle_timeout:", "positive"),
        (
            {"upstreams": {"x": {"url": "http://a", "protocol": "anthropic", "flavor": "vllm"}}},
            "upstreams.x.flavor:",
            "unknown",
        ),
        ({"upstreams": "http://a"}, "upstreams:", ""),
        ({"upstreams": {"x": "http://a"}}, "upstreams.x:", ""),
        (good(models=[{"name": "qwen", "upstream": "nowhere"}]), "models.0.upstream:", "nowhere"),
        (good(models=[{"name": "a", "upstream": "local"}, {"name": "qwen"}]), "models.1.upstream:", ""),
        (good(models=[{"name": "qwen", "upstream": "local", "vision": "yes"}]), "models.0.vision:", "bool"),
        (good(server={"default_model": "llama"}), "server.default_model:", "llama"),
    ],
)
def test_errors_name_the_key(data: dict[str, Any], prefix: str, fragment: str) -> None:
    message = failure(data)
    assert message.startswith(prefix), message
    assert fragment in message


def test_unknown_upstream_lists_the_known_ones() -> None:
    message = failure(
        good(upstreams={"a": {"url": "http://a"}, "b": {"url": "http://b"}}, models=[{"name": "m", "upstream": "c"}])
    )
    assert "'c'" in message and "a, b" in message


def test_load_prefixes_errors_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "dragoman.toml"
    path.write_text('[upstreams.local]\nurl = "ftp://nope"\n')
    with pytest.raises(ConfigError) as caught:
        config_load.load(path)
    assert str(caught.value).startswith(f"{path}: upstreams.local.url:")


def test_load_reads_toml(tmp_path: Path) -> None:
    path = tmp_path / "dragoman.toml"
    path.write_text(
        '[server]\nport = 9100\napi_keys = ["k1"]\n\n'
        '[upstreams.gpu]\nurl = "http://gpu:8000/v1"\nflavor = "vllm"\n\n'
        '[[models]]\nname = "qwen3"\nupstream = "gpu"\naliases = ["claude-sonnet-4-5"]\n'
    )
    loaded = config_load.load(path)
    assert loaded.server.port == 9100
    assert loaded.upstreams["gpu"].flavor == "vllm"
    assert loaded.models[0].aliases == ["claude-sonnet-4-5"]


@pytest.mark.parametrize(("content", "fragment"), [(None, "not found"), ("[server\nport = 1", "invalid TOML")])
def test_unreadable_files(tmp_path: Path, content: str | None, fragment: str) -> None:
    path = tmp_path / "dragoman.toml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        config_load.load(path)
    assert fragment in str(caught.value) and str(path) in str(caught.value)


def test_server_api_keys_merge_file_and_environment() -> None:
    environ = {"DRAGOMAN_TEST_KEYS": " k2 , k3,, "}
    loaded = config_load.from_dict({"server": {"api_keys": ["k1"], "api_keys_env": "DRAGOMAN_TEST_KEYS"}})
    assert config_keys.server_api_keys(loaded, {}, environ) == {"k1", "k2", "k3"}


@pytest.mark.parametrize("value", [None, "", " , "])
def test_api_keys_env_without_a_key_is_a_startup_error_not_an_open_gateway(value: str | None) -> None:
    environ = {} if value is None else {"DRAGOMAN_TEST_KEYS": value}
    loaded = config_load.from_dict({"server": {"api_keys_env": "DRAGOMAN_TEST_KEYS"}})
    with pytest.raises(ConfigError, match="^server.api_keys_env: the environment variable DRAGOMAN_TEST_KEYS is unset"):
        config_keys.server_api_keys(loaded, {}, environ)
    with_file_keys = config_load.from_dict({"server": {"api_keys": ["k1"], "api_keys_env": "DRAGOMAN_TEST_KEYS"}})
    assert config_keys.server_api_keys(with_file_keys, {}, environ) == {
        "k1"
    }  # still keyed: fewer keys than meant, never none


@pytest.mark.parametrize(
    ("data", "prefix"),
    [
        (
            good(upstreams={"local": {"url": "http://a", "max_concurrent": 0}}),
            "upstreams.local.max_concurrent: must be 1 or more",
        ),
        (
            good(upstreams={"local": {"url": "http://a", "max_queue": -1}}),
            "upstreams.local.max_queue: must be 0 or more",
        ),
        (
            good(upstreams={"local": {"url": "http://a", "max_retries": -1}}),
            "upstreams.local.max_retries: must be 0 or more",
        ),
        (
            good(upstreams={"local": {"url": "http://a", "retry_budget": -1.0}}),
            "upstreams.local.retry_budget: must be 0 or more",
        ),
        (
            good(models=[{"name": "q", "upstream": "local", "context_window": 0}]),
            "models.0.context_window: must be a positive",
        ),
        (
            good(models=[{"name": "q", "upstream": "local", "max_output_tokens": -5}]),
            "models.0.max_output_tokens: must be a positive",
        ),
        (
            good(models=[{"name": "q", "upstream": "local", "reasoning_efforts": []}]),
            "models.0.reasoning_efforts: at least one",
        ),
        (good(server={"max_request_bytes": 0}), "server.max_request_bytes: must be positive"),
        (good(server={"fetch_max_bytes": 0}), "server.fetch_max_bytes: must be positive"),
        (good(server={"fetch_timeout": 0.0}), "server.fetch_timeout: must be positive"),
    ],
)
def test_numbers_out_of_range_are_startup_errors(data: dict[str, Any], prefix: str) -> None:
    assert failure(data).startswith(prefix)


def test_zero_queue_and_retries_are_allowed() -> None:
    loaded = config_load.from_dict(
        good(
            upstreams={
                "local": {"url": "http://a", "max_concurrent": 1, "max_queue": 0, "max_retries": 0, "retry_budget": 0.0}
            }
        )
    )
    assert loaded.upstreams["local"].max_queue == 0


def test_effort_budgets_must_be_two_increasing_numbers():
    import pytest

    from dragoman.core.config import ConfigError
    from dragoman.core.config_load import from_dict

    for budgets in ([8192, 2048], [4096], [0, 10]):
        with pytest.raises(ConfigError, match="server.effort_budgets"):
            from_dict({"server": {"effort_budgets": budgets}})


@pytest.mark.parametrize("interval", [0, -1])
def test_keepalive_interval_must_be_positive(interval: float) -> None:
    with pytest.raises(ConfigError, match="server.keepalive_interval: must be a positive number"):
        config_load.from_dict({"server": {"keepalive_interval": interval}})


@pytest.mark.parametrize("proxy", ["https://proxy.example:3128", "socks5://127.0.0.1:1080", "proxy.example:3128"])
def test_a_proxy_must_be_an_http_url(proxy: str) -> None:
    message = failure(good(upstreams={"local": {"url": "http://127.0.0.1:8000/v1", "proxy": proxy}}))
    assert message.startswith("upstreams.local.proxy: must be an http:// URL")


def test_a_proxy_error_does_not_print_its_credentials() -> None:
    message = failure(
        good(upstreams={"local": {"url": "http://127.0.0.1:8000/v1", "proxy": "https://user:s3cret@proxy:3128"}})
    )
    assert "s3cret" not in message


@pytest.mark.parametrize(
    "headers", [{"x-team": "a\r\nx-admin: 1"}, {"x-team": "a\nb"}, {"bad name": "v"}, {"x:y": "v"}]
)
def test_upstream_headers_cannot_smuggle_lines(headers: dict[str, str]) -> None:
    message = failure(good(upstreams={"local": {"url": "http://127.0.0.1:8000/v1", "headers": headers}}))
    assert message.startswith(f"upstreams.local.headers.{next(iter(headers))}:")


def test_a_proxy_from_the_environment_that_is_not_http_is_a_startup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from dragoman.upstream.client import HttpClient

    for name in ("no_proxy", "NO_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "https://user:s3cret@proxy.example:3128")
    upstream = config_load.from_dict(good(upstreams={"local": {"url": "https://api.example.com/v1"}})).upstreams[
        "local"
    ]
    with pytest.raises(ConfigError) as caught:
        HttpClient("local", upstream, None, redactor=Redactor(), prefix="/v1")
    assert str(caught.value).startswith("upstreams.local: only http:// proxies are supported")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/v1?key=s3cret", "http://user:s3cret@127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1#x"]
)
def test_an_upstream_url_holds_no_query_fragment_or_credentials(url: str) -> None:
    message = failure(good(upstreams={"local": {"url": url}}))
    assert message.startswith("upstreams.local.url: a URL without a query") and "s3cret" not in message
    message = failure(good(upstreams={"local": {"url": "http://127.0.0.1:8000/v1", "replicas": [url]}}))
    assert message.startswith("upstreams.local.replicas: a URL without a query") and "s3cret" not in message


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://127.0.0.1:99999/v1",
        "http://127.0.0.1:port/v1",
        "http://",
        "http://127.0.0.1:0/v1",
        "http://u:s3cret@[::1/v1",
    ],
    ids=["unclosed-ipv6", "port-too-large", "port-not-a-number", "no-host", "port-zero", "password-in-a-bad-url"],
)
def test_an_upstream_url_that_cannot_be_connected_to_names_its_key(url: str) -> None:
    message = failure(good(upstreams={"local": {"url": url}}))
    assert message.startswith("upstreams.local.url: ") and "s3cret" not in message, message
    message = failure(good(upstreams={"local": {"url": "http://127.0.0.1:8000/v1", "replicas": [url]}}))
    assert message.startswith("upstreams.local.replicas: ") and "s3cret" not in message, message


@pytest.mark.parametrize("port", [0, -1, 65536, 70000])
def test_the_port_must_be_one_a_socket_can_bind(port: int) -> None:
    assert failure(good(server={"port": port})).startswith("server.port: must be 1 to 65535")


def test_a_config_file_that_is_not_utf8_or_not_readable_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "dragoman.toml"
    path.write_bytes(b'[server]\nhost = "\xff"\n')
    with pytest.raises(ConfigError, match="invalid TOML: not UTF-8"):
        config_load.load(path)
    with pytest.raises(ConfigError, match=f"cannot read config file {tmp_path}"):
        config_load.load(tmp_path)  # a directory: as unreadable as a file without read permission


def test_a_proxy_password_with_a_slash_is_not_printed() -> None:
    from dragoman.upstream.client import HttpClient

    upstream = config_load.from_dict(
        good(upstreams={"local": {"url": "http://10.1.2.3:8000/v1", "proxy": "http://alice:s3c/ret@proxy:3128"}})
    )
    with pytest.raises(ConfigError) as caught:
        HttpClient("local", upstream.upstreams["local"], None, redactor=Redactor(), prefix="/v1")
    assert "s3c" not in str(caught.value) and "%2F" in str(caught.value)


def test_an_api_key_with_a_line_break_is_a_startup_error() -> None:
    from dragoman.upstream.client import HttpClient

    upstream = config_load.from_dict(good()).upstreams["local"]
    with pytest.raises(ConfigError) as caught:
        HttpClient("local", upstream, "sk-abc\r\nx-admin: 1", redactor=Redactor(), prefix="/v1")
    assert str(caught.value).startswith("upstreams.local: header 'authorization'") and "sk-abc" not in str(caught.value)


@pytest.mark.parametrize("key", ["max_concurrent", "max_requests", "max_queued_requests", "expire_after", "retain_for"])
def test_batch_settings_must_be_positive(key: str) -> None:
    assert failure(good(batches={key: 0})).startswith(f"batches.{key}: must be positive")


def test_batch_settings_are_read() -> None:
    loaded = config_load.from_dict(good(batches={"max_concurrent": 2, "expire_after": 60}))
    assert (
        loaded.batches.max_concurrent == 2
        and loaded.batches.expire_after == 60
        and loaded.batches.max_requests == 100_000
    )
    assert loaded.batches.max_queued_requests == 500_000


def test_batch_times_are_at_most_a_year() -> None:
    assert failure(good(batches={"expire_after": 1e12})).startswith("batches.expire_after: at most a year")


def test_files_max_total_bytes_defaults_to_100_gib_and_is_read() -> None:
    assert config_load.from_dict({}).files.max_total_bytes == 100 * 1024**3
    loaded = config_load.from_dict(good(files={"max_total_bytes": 5000}))
    assert loaded.files.max_total_bytes == 5000 and loaded.files.max_bytes == 100 * 1024 * 1024


def test_files_max_files_defaults_to_10000_and_is_read() -> None:
    assert config_load.from_dict({}).files.max_files == 10_000
    assert config_load.from_dict(good(files={"max_files": 3})).files.max_files == 3


@pytest.mark.parametrize("key", ["max_bytes", "max_total_bytes", "max_files"])
@pytest.mark.parametrize("value", [0, -1])
def test_file_sizes_must_be_positive(key: str, value: int) -> None:
    assert failure(good(files={key: value})) == f"files.{key}: must be positive, got {value}"


def test_files_max_total_bytes_must_be_an_integer() -> None:
    assert failure(good(files={"max_total_bytes": "100G"})) == "files.max_total_bytes: Expected `int`, got `str`"


def test_tenant_keys_are_api_keys_and_name_their_tenant() -> None:
    loaded = config_load.from_dict(
        good(server={"api_keys": ["sk-solo"], "tenants": {"team-a": ["sk-old", "sk-new"], "team-b": ["sk-b"]}})
    )
    tenants = config_keys.key_tenants(loaded, {})
    assert config_keys.server_api_keys(loaded, tenants, {}) == {"sk-solo", "sk-old", "sk-new", "sk-b"}
    assert tenants == {"sk-old": "team-a", "sk-new": "team-a", "sk-b": "team-b"}


def test_a_key_in_two_tenants_is_refused_without_printing_it() -> None:
    message = failure(good(server={"tenants": {"team-a": ["sk-secret"], "team-b": ["sk-secret"]}}))
    assert message.startswith("server.tenants.team-b: a key is also listed in tenant 'team-a'")
    assert "sk-secret" not in message


def _example_keys() -> dict[str, set[str]]:
    """The keys dragoman.example.toml shows, set or commented out, by table (server, upstreams,
    models, ...): every key of a line that parses as TOML once a leading `# ` is taken off, those
    of inline tables (`cache_routing = { block_bytes = ... }`) included."""
    import re
    import tomllib

    def names(value: object) -> set[str]:
        if isinstance(value, dict):
            return set(value) | {n for v in value.values() for n in names(v)}
        return set()

    keys: dict[str, set[str]] = {}
    table = ""
    for line in (Path(__file__).parents[3] / "dragoman.example.toml").read_text().splitlines():
        line = re.sub(r"^#\s?", "", line)
        if header := re.match(r"^\[\[?([a-z_]+)", line):
            table = header.group(1)
            keys.setdefault(table, set())
            continue
        try:
            keys.setdefault(table, set()).update(names(tomllib.loads(line)))
        except tomllib.TOMLDecodeError:  # prose
            continue
    return keys


def _struct_keys(info: object) -> set[str]:
    """Every key a configuration type takes, at any depth (a struct's fields, and those of the
    structs in its fields, lists, dicts and unions)."""
    import msgspec.inspect as mi

    if isinstance(info, mi.StructType):
        own = {f.encode_name for f in info.fields} | ({info.tag_field} if info.tag_field else set())
        return own | {k for f in info.fields for k in _struct_keys(f.type)}
    if isinstance(info, mi.UnionType):
        return {k for t in info.types for k in _struct_keys(t)}
    if isinstance(info, mi.DictType):
        return _struct_keys(info.value_type)
    if isinstance(info, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        return _struct_keys(info.item_type)
    return set()


def test_the_example_config_loads_and_shows_every_key() -> None:
    """Every key of every table, found by walking the config structs: a key added to them and not
    to the example fails here (the README says the example lists every key)."""
    import msgspec.inspect as mi

    config_load.load(Path(__file__).parents[3] / "dragoman.example.toml")
    shown = _example_keys()
    root = mi.type_info(config.Config)
    assert isinstance(root, mi.StructType)
    assert {f.encode_name for f in root.fields} <= set(shown), "a table missing from the example"
    missing = {f.encode_name: sorted(_struct_keys(f.type) - shown[f.encode_name]) for f in root.fields}
    assert {table: keys for table, keys in missing.items() if keys} == {}
    assert _struct_keys(root.fields[0].type) >= {"host", "port"}  # the walk finds keys at all


@pytest.mark.parametrize(
    ("usage", "named"),
    [
        ({"flush_interval": 5}, "usage.flush_interval"),
        ({"database_url": "mysql://db/x"}, "usage.database_url"),
        ({"admin_keys": ["sk-client"]}, "usage.admin_keys"),
        ({"admin_key": ["x"]}, "usage.admin_key"),
        ({"retain_days": 0}, "usage.retain_days"),
    ],
)
def test_usage_settings_are_checked(usage: dict, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_load.from_dict({"server": {"api_keys": ["sk-client"]}, "usage": usage})
    assert str(caught.value).startswith(named) and "sk-client" not in str(caught.value)


def test_every_problem_is_reported_with_a_suggestion_for_typos() -> None:
    with pytest.raises(ConfigError) as caught:
        config_load.from_dict(
            {
                "server": {"defualt_model": "q", "log_level": "VERBOSE"},
                "upstreams": {
                    "a": {"url": "http://127.0.0.1:1/v1", "flavour": "vllm", "max_retries": -1},
                    "b": {"protocol": "grpc", "url": "http://127.0.0.1:2"},
                    "c": {"api_key": "k"},
                },
                "models": [{"name": "m", "upstream": "a", "reasoning_effort": ["low"]}],
                "batches": {"max_concurent": 3},
            }
        )
    assert caught.value.problems == [
        "server.defualt_model: unknown key (did you mean default_model?)",
        "server.log_level: Invalid enum value 'VERBOSE'",
        "upstreams.a.flavour: unknown key (did you mean flavor?)",
        "upstreams.b.protocol: Invalid value 'grpc'",
        "upstreams.c.url: required key is missing",
        "models.0.reasoning_effort: unknown key (did you mean reasoning_efforts?)",
        "batches.max_concurent: unknown key (did you mean max_concurrent?)",
        "upstreams.a.max_retries: must be 0 or more, got -1",
    ]
    assert str(caught.value).startswith("8 problems:\n  server.defualt_model: ")


def test_one_problem_is_one_line_without_a_count() -> None:
    assert failure(good(server={"prot": 1})) == "server.prot: unknown key (did you mean port?)"


def test_tenant_keys_come_from_the_environment_and_files(tmp_path: Path) -> None:
    (tmp_path / "b").write_text("# team b\nsk-b1\n\n  sk-b2  \n")
    (tmp_path / "loose").write_text("sk-loose\n")
    environ = {"TEAM_A_KEYS": "sk-a1, sk-a2"}
    loaded = config_load.from_dict(good(server={"tenants_env": {"team-a": "TEAM_A_KEYS"},
                                                "tenants_file": {"team-b": str(tmp_path / "b")},
                                                "api_keys_file": str(tmp_path / "loose")}))  # fmt: skip
    tenants = config_keys.key_tenants(loaded, environ)
    assert tenants == {"sk-a1": "team-a", "sk-a2": "team-a", "sk-b1": "team-b", "sk-b2": "team-b"}
    assert config_keys.server_api_keys(loaded, tenants, environ) == {"sk-a1", "sk-a2", "sk-b1", "sk-b2", "sk-loose"}
    missing = config_load.from_dict(good(server={"tenants_file": {"team-c": str(tmp_path / "none")}}))
    with pytest.raises(ConfigError, match="server.tenants_file.team-c: cannot read"):
        config_keys.key_tenants(missing, {})


def test_admin_keys_and_keys_made_at_run_time() -> None:
    assert not config.api_keys_enabled(config_load.from_dict(good()))
    with_admin = config_load.from_dict(
        good(admin={"keys": ["sk-adm"]}, limits={"tenants": {"any-team": {"requests_per_minute": 5}}})
    )
    assert config.api_keys_enabled(with_admin) and config_keys.usage_admin_keys(with_admin, {}) == {"sk-adm"}
    assert "admin.poll_interval" in failure(good(admin={"poll_interval": 5}))
    assert "console.session_hours" in failure(good(console={"session_hours": 0}))
    assert "admin.keys: a key is also a client key" in failure(good(admin={"keys": ["k"]}, server={"api_keys": ["k"]}))
    assert "models.0.price" in failure(good(models=[{"name": "m", "upstream": "local", "price": {"input": -1}}]))
    assert "limits.keys.key_x.requests_per_minute" in failure(
        good(limits={"keys": {"key_x": {"requests_per_minute": 0}}})
    )
