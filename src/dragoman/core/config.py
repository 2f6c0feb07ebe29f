"""Typed configuration: the structs a configuration file becomes, and the values they resolve.

The same msgspec structs validate the file (`core.config_load`) and are used by the code,
so an error names the offending key (`upstreams.local.url: ...`). Secrets named by `*_env`
keys are resolved here, once; nothing else reads the environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import msgspec
from msgspec import Struct

from dragoman.core.limit_settings import LimitsConfig
from dragoman.core.route_settings import FallbackSettings, RouteConfig


class ConfigError(Exception):
    """Configuration problems, worded for a startup failure: one line for one problem, a count
    and a line each for several (all of a file's mistakes are reported at once)."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            super().__init__(self.problems[0])
        else:
            super().__init__(f"{len(self.problems)} problems:\n" + "\n".join(f"  {p}" for p in self.problems))


class _Config(Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    pass


class ServerConfig(_Config, frozen=True):
    host: str = "127.0.0.1"
    port: int = 8765
    api_keys: list[str] = []
    api_keys_env: str | None = None
    # Files and batches are seen only by the key that made them; true shares them between all keys.
    share_between_keys: bool = False
    # Keys that share files and batches, by tenant name (each is also a valid API key): a
    # rotated key keeps its tenant's data. {"team-a": ["sk-old", "sk-new"]}
    tenants: dict[str, list[str]] = {}
    # Tenant keys kept out of the file: an environment variable (comma-separated keys) or a
    # file (one key a line) per tenant, added to `tenants`. {"team-a": "TEAM_A_KEYS"}
    tenants_env: dict[str, str] = {}
    tenants_file: dict[str, str] = {}
    api_keys_file: str | None = None  # client keys, one a line (as api_keys_env, from a file)
    default_model: str | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Claude Code's first system block varies per session and defeats prefix caching.
    keep_billing_header: bool = False
    max_request_bytes: int = 32 * 1024 * 1024
    # Open client connections per process; more are closed at once (see server/serving.py).
    max_connections: int = 1000
    keepalive_interval: float = 15.0
    # On SIGTERM: seconds requests in flight get to finish; streams still running then end
    # with an `overloaded_error` event (the SDKs retry it).
    shutdown_grace: float = 30.0
    # Anthropic's server tools (web_search_*, ...) cannot run here: reject or drop them.
    server_tools: Literal["reject", "drop"] = "reject"
    # A note in the first reply of a conversation whose tools the model's template drops, for
    # Claude Code (its User-Agent), every client, or none (dragoman.notices.tools_dropped).
    tools_dropped_notice: Literal["claude-code", "all", "off"] = "claude-code"
    # Fetch `document` blocks given by URL (off: a 400 asks for the content instead).
    # Only public addresses are fetched unless fetch_allow_private is set.
    fetch_documents: bool = False
    fetch_allow_private: bool = False
    fetch_max_bytes: int = 10 * 1024 * 1024
    fetch_timeout: float = 10.0
    # All of one request's fetches, together; what all requests in flight hold, per process (529 past it).
    fetch_total_timeout: float = 30.0
    fetch_max_held_bytes: int = 64 * 1024 * 1024
    # Reject `thinking` on models that do not reason, as some peers do (default: ignore).
    strict_thinking: bool = False
    # thinking.budget_tokens up to the first is low effort, up to the second medium, above high.
    effort_budgets: list[int] = msgspec.field(default_factory=lambda: [2048, 8192])
    # Where the models.dev registry is cached; empty disables fetching it.
    registry_cache: str | None = None


Flavor = Literal["auto", "vllm", "sglang", "llamacpp", "ollama", "openai", "generic"]
Routing = Literal["round_robin", "least_loaded", "cache_aware"]


class CacheRouting(_Config, frozen=True):
    """The cache-aware rule's weights and bounds (docs/routing.md says how they were chosen)."""

    block_bytes: int = 4096  # the prompt is hashed in blocks of this many bytes (about 1024 tokens)
    max_blocks: int = 32768  # blocks remembered per replica (LRU): 128 MiB of prompt, about 4 MB of memory
    max_age: float = 600.0  # seconds a block is believed cached after it was last sent
    load_tokens: int = 512  # the cost of one request on a replica (in flight, or the replica's own count), in tokens
    queue_tokens: int = 4096  # more for each request the replica says is waiting (its /metrics)
    kv_tokens: int = 4096  # more, up to this, for a KV cache the replica says is fuller than kv_high
    kv_high: float = 0.9  # the used fraction of a replica's KV cache from which it costs more
    home_tokens: int = 16384  # the cost of each step down a conversation's rendezvous order, in tokens
    spread: float = 1.05  # a replica is home to at most spread x an even share of the active conversations
    shared_spread: float = 1.3  # the same, where other gateways send to these replicas too (docs/routing.md)
    balance_rel: float = 1.5  # a replica with more in flight than balance_rel x the mean + balance_abs
    balance_abs: float = 4.0  # takes no request while another is below that


class _UpstreamBase(_Config, frozen=True):
    url: str
    api_key: str | None = None
    api_key_env: str | None = None
    headers: dict[str, str] = {}
    # More URLs serving the same models: requests spread over them, retries go elsewhere.
    replicas: list[str] = []
    # How a request picks a replica; unset: cache_aware with replicas (docs/routing.md).
    routing: Routing | None = None
    cache_routing: CacheRouting = CacheRouting()
    # With replicas and routing other than round_robin: read each replica's own load (queue, KV
    # cache) from its Prometheus /metrics every load_metrics_interval seconds (docs/routing.md).
    load_metrics: bool = True
    load_metrics_interval: float = 1.0
    connect_timeout: float = 10.0
    first_byte_timeout: float = 600.0
    idle_timeout: float = 300.0
    # Transient failures before the first byte (refused, reset, 429, 502-504, 529).
    max_retries: int = 2
    retry_budget: float = 10.0  # seconds of waiting, retry-after included
    # At most this many requests at once; up to max_queue more wait, the rest get 529.
    max_concurrent: int | None = None
    max_queue: int = 100
    # Network: HTTP(S)_PROXY and NO_PROXY are honoured; these override per upstream.
    proxy: str | None = None
    tls_verify: bool = True
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None


class OpenAIUpstream(_UpstreamBase, tag="openai", tag_field="protocol", frozen=True):
    """An OpenAI-compatible server; requests are translated to Chat Completions."""

    flavor: Flavor = "auto"
    # Overrides of the flavor's profile (see profiles.py); None keeps it.
    strip_schema_keys: list[str] | None = None


class AnthropicUpstream(_UpstreamBase, tag="anthropic", tag_field="protocol", frozen=True):
    """A server that speaks /v1/messages itself; requests pass through."""

    # "as_text" sends document blocks as text blocks (llama-server's own endpoint ignores
    # documents); "auto" does so when the server's model list says it is llama.cpp.
    documents: Literal["auto", "forward", "as_text"] = "auto"
    # Claude Code's auto-mode review (`safeguards`): answered by the gateway, or "forward"ed
    # with its beta to an upstream that answers it itself (Anthropic's API).
    safeguards: Literal["gateway", "forward"] = "gateway"


class AutoUpstream(_UpstreamBase, tag="auto", tag_field="protocol", frozen=True):
    """Either: probed once; passthrough when the server answers /v1/messages.
    The url may end in /v1 or not. The translating options apply if it does not."""

    flavor: Flavor = "auto"
    strip_schema_keys: list[str] | None = None
    documents: Literal["auto", "forward", "as_text"] = "auto"  # on the passthrough path, as for protocol = "anthropic"
    safeguards: Literal["gateway", "forward"] = "gateway"  # on the passthrough path, as for protocol = "anthropic"


UpstreamConfig = OpenAIUpstream | AnthropicUpstream | AutoUpstream


class Price(_Config, frozen=True):
    """USD per million tokens, for money budgets and the cost report (docs/team.md#budgets)."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0


class ModelConfig(_Config, frozen=True):
    name: str
    upstream: str
    upstream_model: str | None = None
    aliases: list[str] = []
    reasoning: bool | None = None
    reasoning_efforts: list[str] = msgspec.field(default_factory=lambda: ["low", "medium", "high"])
    vision: bool | None = None  # None: unknown, the backend decides
    # How `thinking: disabled` switches reasoning off, where the family has a switch.
    thinking_off: Literal["enable_thinking", "lowest_effort"] | None = None
    # Send echoed thinking blocks back as the backend's reasoning field (DeepSeek, Kimi).
    reasoning_replay: bool = False
    strict_thinking: bool | None = None
    server_tools: Literal["reject", "drop"] | None = None  # overrides server.server_tools
    context_window: int | None = None
    max_output_tokens: int | None = None
    # For counting tokens when the upstream cannot: a tokenizer.json (or its directory)
    # and optionally the chat template (default: beside it, as in a model repository).
    tokenizer: str | None = None
    chat_template: str | None = None
    # OpenAI models: a tiktoken encoding name and its local .tiktoken file.
    tiktoken_encoding: str | None = None
    tiktoken_file: str | None = None
    price: Price | None = None  # None: the model costs nothing (and no money budget counts it)
    # Other models tried before the first byte reaches the client (docs/routing.md, Fallbacks).
    fallbacks: list[str] = []
    context_fallbacks: list[str] = []  # only for prompt-too-long, only to a window that fits
    checks_signatures: bool = False  # its upstream rejects thinking signed elsewhere (Anthropic's API)

    @property
    def served_model(self) -> str:
        return self.upstream_model or self.name


class BatchesConfig(_Config, frozen=True):
    # Batch requests running at once, across all batches (interactive requests are not counted).
    max_concurrent: int = 4
    max_requests: int = 100_000  # per batch
    max_queued_requests: int = 500_000  # per key: requests in its batches still processing
    max_batches: int = 10_000  # per key: batches kept, ended ones included
    max_stored_bytes: int = 10 * 1024**3  # per key: its batches' requests and results on disk
    expire_after: float = 24 * 3600.0  # seconds: requests not run by then end as `expired`
    retain_for: float = 29 * 24 * 3600.0  # seconds an ended batch and its results are kept
    dir: str | None = None  # where batches are kept; default $XDG_DATA_HOME/dragoman/batches


class FilesConfig(_Config, frozen=True):
    dir: str | None = None  # where uploads are kept; default $XDG_DATA_HOME/dragoman/files
    max_bytes: int = 100 * 1024 * 1024  # per file
    max_total_bytes: int = (
        100 * 1024**3
    )  # all of one owner's (API key's) files together, as Anthropic's per-organization storage
    max_files: int = (
        10_000  # one owner's files: each costs inodes and disk blocks whatever its size, and lists read them all
    )


class TracingConfig(_Config, frozen=True):
    """OpenTelemetry traces and GenAI metrics (see assembly/tracing.py); the OTEL_* variables say the rest."""

    enabled: bool | None = None  # None: on when OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT) is set
    endpoint: str | None = None  # the collector's base URL; None: from the OTEL_* variables
    protocol: Literal["http/protobuf", "grpc"] | None = None  # None: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf
    service_name: str | None = None  # None: OTEL_SERVICE_NAME, else "dragoman"
    capture_content: bool = False  # messages, system prompt, tool definitions and replies as span attributes
    metrics: bool = True  # the GenAI metrics through the OTLP metric exporter, beside /metrics
    metrics_interval: float = 60.0  # seconds between metric exports


class SafeguardsConfig(_Config, frozen=True):
    """Claude Code's auto mode: the model that judges its tool calls (see dragoman.safeguards)."""

    model: str | None = None  # a served model name; None: every request is answered "unsupported"
    timeout: float = 30.0  # seconds for one classifier call; later, its verdicts are "unavailable"
    transcript_chars: int = 24_000  # of the conversation the classifier sees: the first turn and the newest


class UsageConfig(_Config, frozen=True):
    """Usage accounting: one record per finished request (see `dragoman.usage`)."""

    enabled: bool = True
    # PostgreSQL, shared by every worker and replica; unset: SQLite in `dir`.
    database_url: str | None = None
    database_url_env: str | None = None  # a variable holding the URL (it may hold a password)
    dir: str | None = None  # where the SQLite file is kept; default $XDG_DATA_HOME/dragoman/usage
    # Keys that may read the usage report (and nothing else: not valid for /v1/messages).
    admin_keys: list[str] = []
    admin_keys_env: str | None = None
    flush_interval: float = 1.0  # seconds between writes of the buffered records
    retain_days: int | None = None  # records older than this are deleted (hourly); None keeps them all
    # The local journal records go to before the database (kept across a crash or an outage);
    # unset: `journal` under `dir` (or $XDG_DATA_HOME/dragoman/usage). Processes may share one.
    journal_dir: str | None = None
    # Seconds a database statement may run (a locked table): the report then answers 503.
    statement_timeout: float = 10.0


class WebSearchConfig(_Config, frozen=True):
    """`web_search_*` tools run by the gateway on the translating path (dragoman.servertools)."""

    provider: Literal["searxng", "brave", "tavily"] = "searxng"
    url: str | None = None  # SearXNG's base URL (required for it); Brave's and Tavily's API by default
    api_key_env: str | None = None  # the variable holding Brave's or Tavily's key
    max_results: int = 5  # results per search
    timeout: float = 10.0  # seconds a search may take; then `unavailable`
    # The variable holding the secret that signs `encrypted_content`: the same on every replica,
    # so that any replica reads the results a client sends back. Unset: one made per process.
    secret_env: str | None = None


class WebFetchConfig(_Config, frozen=True):
    """`web_fetch_*` tools run by the gateway, with the server's fetch_* limits and guard."""

    max_content_tokens: int = 100_000  # a page's text is cut to about this many tokens, unless the tool says fewer


class McpConfig(_Config, frozen=True):
    """Requests' `mcp_servers` served by the gateway as an MCP client (private addresses only with
    server.fetch_allow_private)."""

    timeout: float = 30.0  # seconds to connect, list tools or run one call


class AdminConfig(_Config, frozen=True):
    """Admin keys and run-time API keys (the Admin API, `dragoman keys`): docs/team.md."""

    keys: list[str] = []  # admin keys: they manage keys and read reports, never call models
    keys_env: str | None = None  # a variable holding more, comma-separated
    # Whether keys made through the Admin API are served (stored beside the usage records).
    # None: on when any admin key is configured here or in [usage] admin_keys.
    api_keys: bool | None = None
    poll_interval: float = 1.0  # seconds between checks for changes made by other processes (at most 2)


class ConsoleConfig(_Config, frozen=True):
    """The operator console at /console (docs/console.md): on whenever an admin key exists."""

    # The variable holding the secret that signs session cookies: the same on every replica.
    # Unset: one made once and kept in the keys' database (SQLite file or PostgreSQL).
    session_secret_env: str | None = None
    session_hours: float = 12.0  # a session ends this long after sign-in


class Config(_Config, frozen=True):
    server: ServerConfig = ServerConfig()
    admin: AdminConfig = AdminConfig()
    console: ConsoleConfig = ConsoleConfig()
    batches: BatchesConfig = BatchesConfig()
    files: FilesConfig = FilesConfig()
    tracing: TracingConfig = TracingConfig()
    usage: UsageConfig = UsageConfig()
    limits: LimitsConfig = LimitsConfig()  # per key and tenant: see docs/team.md
    safeguards: SafeguardsConfig = SafeguardsConfig()  # Claude Code's auto mode: see docs/claude-code.md
    upstreams: dict[str, UpstreamConfig] = {}
    models: list[ModelConfig] = []
    web_search: WebSearchConfig | None = None  # unset: server_tools decides (reject or drop)
    web_fetch: WebFetchConfig | None = None
    mcp: McpConfig | None = None
    routes: list[RouteConfig] = []  # by the request's shape, first match (docs/routing.md, Routes)
    fallbacks: FallbackSettings = FallbackSettings()

    def upstream_key(self, upstream: UpstreamConfig) -> str | None:
        if upstream.api_key_env:
            return os.environ.get(upstream.api_key_env) or upstream.api_key
        return upstream.api_key


def api_keys_enabled(config: Config) -> bool:
    """Whether keys made through the Admin API are served: `admin.api_keys`, else whether
    any admin key is configured (one is needed to make the first key)."""
    if config.admin.api_keys is not None:
        return config.admin.api_keys
    return bool(config.usage.admin_keys or config.admin.keys or config.usage.admin_keys_env or config.admin.keys_env)


def usage_database_url(config: Config) -> str | None:
    """The PostgreSQL URL for usage records, if any (`database_url_env` first)."""
    if config.usage.database_url_env:
        return os.environ.get(config.usage.database_url_env) or config.usage.database_url
    return config.usage.database_url


def data_dir(kind: str) -> Path:
    """Where `kind` (files, batches) is kept unless configured: $XDG_DATA_HOME/dragoman/<kind>."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(base) / "dragoman" / kind
