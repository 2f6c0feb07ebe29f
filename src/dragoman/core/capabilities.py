"""The capability types (`ModelCaps`, `ReasoningCaps`), and which models reason:
configuration, then the models.dev registry, then names.

The registry (https://models.dev/api.json) is fetched in the background when it can
be reached and cached on disk; a request never waits for it, and without it the
name rules still answer.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger("dragoman.registry")

REGISTRY_URL = "https://models.dev/api.json"
REFRESH_AFTER = 24 * 3600

# Families known to reason, matched on the model id's last path segment. Qwen3's
# -Instruct releases (2507, Coder, Next, VL) are its non-thinking variants.
REASONING_NAMES = re.compile(
    r"gpt-oss|^o[1-9](?:$|-)|^gpt-5|deepseek-r1|deepseek-reasoner|qwq|qwen3(?!.*instruct)|thinking|magistral|kimi-k2-thinking|glm-4\.[5-9]|phi-4-reasoning",
    re.IGNORECASE,
)


ThinkingOff = Literal["enable_thinking", "lowest_effort"]


@dataclass(frozen=True, slots=True)
class ReasoningCaps:
    """How the served model reasons, and how Anthropic's thinking controls map onto it."""

    reasoning: bool = False
    efforts: tuple[str, ...] = ("low", "medium", "high")
    thinking_off: ThinkingOff | None = None
    strict: bool = False
    low_max_budget: int = 2048
    medium_max_budget: int = 8192


@dataclass(frozen=True, slots=True)
class ModelCaps:
    """What the gateway knows about the served model (from config or discovery)."""

    vision: bool | None = None
    reasoning: ReasoningCaps = ReasoningCaps()
    reasoning_replay: bool = False
    max_output_tokens: int | None = None
    drop_server_tools: bool | None = None  # None: the gateway-wide setting decides


@dataclass(frozen=True, slots=True)
class Decision:
    reasoning: bool
    why: str


def _key(model: str) -> str:
    return model.rsplit("/", 1)[-1].lower().removesuffix(":latest")


class Registry:
    """models.dev's `reasoning` flags, keyed by lower-cased model id (last segment)."""

    def __init__(self, flags: dict[str, bool] | None = None) -> None:
        self.flags = flags or {}

    @classmethod
    def from_json(cls, data: object) -> Registry:
        flags: dict[str, bool] = {}
        if isinstance(data, dict):
            for provider in data.values():
                models = provider.get("models", {}) if isinstance(provider, dict) else {}
                for model_id, info in models.items() if isinstance(models, dict) else ():
                    if isinstance(info, dict) and isinstance(info.get("reasoning"), bool):
                        flags.setdefault(_key(model_id), info["reasoning"])
        return cls(flags)

    @classmethod
    def load(cls, path: Path) -> Registry:
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError):
            return cls()

    def lookup(self, model: str) -> bool | None:
        return self.flags.get(_key(model))


def registry_path() -> Path:
    base = os.environ.get("DRAGOMAN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dragoman"
    )
    return Path(base) / "models.dev.json"


def needs_refresh(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > REFRESH_AFTER
    except OSError:
        return True


class Unreachable(Exception):
    """models.dev could not be reached: offline, or behind a firewall (the usual case, not news)."""


async def refresh_registry(path: Path, timeout: float = 5.0, url: str = REGISTRY_URL) -> Registry | None:
    """Fetch the registry (from `url`) into the cache file; None (and a log line) when it failed.
    Out of reach (no network) is a debug line: every start without internet would say it again."""
    try:
        return await fetch_registry(path, timeout, url)
    except Unreachable as error:
        log.debug("models.dev registry not reached (%s); using the cache and name rules", error)
    except (OSError, ValueError) as error:
        log.info("models.dev registry not refreshed (%s); using the cache and name rules", error)
    return None


async def fetch_registry(path: Path, timeout: float = 5.0, url: str = REGISTRY_URL) -> Registry:
    """Fetch the registry into the cache file. Raises Unreachable when models.dev is out of
    reach, OSError or ValueError when it answered wrongly or the cache cannot be written."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), trust_env=True) as session:
            async with session.get(url) as response:
                if response.status != 200:
                    raise OSError(f"HTTP {response.status}")
                raw = await response.read()
        registry = Registry.from_json(json.loads(raw))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(raw)
        tmp.replace(path)
        return registry
    except (aiohttp.ClientConnectionError, TimeoutError) as error:  # a refused connection is a ClientOSError too
        raise Unreachable(str(error) or "timeout") from None
    except aiohttp.ClientError as error:
        raise OSError(str(error)) from None


def decide(model: str, configured: bool | None, registry: Registry) -> Decision:
    if configured is not None:
        return Decision(configured, "set in the configuration")
    listed = registry.lookup(model)
    if listed is not None:
        return Decision(listed, "listed in the models.dev registry")
    if REASONING_NAMES.search(_key(model)):
        return Decision(True, "name matches a known reasoning family")
    return Decision(False, "unknown model: not reasoning")
