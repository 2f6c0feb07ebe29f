"""`protocol = "auto"`: passthrough when the upstream serves /v1/messages, else translation.

The probe is one `POST /v1/messages` with an empty object, which no server runs
inference for: a server with the route rejects the body (400, 422), a server
without it answers 404 or 405. It runs once, at discovery or at the first
request, and again only after it could not reach the upstream.

Requests wait behind the probe, so it is bounded by PROBE_TIMEOUT, not by
`first_byte_timeout`, and asks the upstream's instances as a model list does: one
that hangs or answers something undecided does not decide, nor stall the upstream.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from dragoman.backends.anthropic.backend import AnthropicBackend
from dragoman.backends.openai.backend import OpenAIBackend
from dragoman.backends.shared import Shared
from dragoman.calls.types import Backend, Call, Reply, Route, UpstreamModel
from dragoman.core.config import AnthropicUpstream, AutoUpstream, Config, OpenAIUpstream
from dragoman.core.errors import UpstreamError, UpstreamTimeout
from dragoman.upstream.client import HttpClient

log = logging.getLogger("dragoman.upstream")

NOT_SERVED = frozenset({404, 405, 501})
# The route exists: it took or judged the body (llama-server's handler answers a body
# without `messages` with a JSON 500). 401, 403, 429, 502-504 and a 500 that is not JSON
# (a proxy's page) say nothing about the route.
SERVED = frozenset({200, 400, 413, 422, 500})
PROBE_TIMEOUT = 10.0  # seconds for an answer from any instance; every request to the upstream waits for it


def _judged(status: int, content_type: str) -> bool:
    """Whether the answer tells if the route exists. A 500 that is not JSON is not the
    server's own judgement of the body (a proxy's page)."""
    return status in SERVED | NOT_SERVED and (status != 500 or "json" in content_type)


class AutoBackend:
    def __init__(self, name: str, upstream: AutoUpstream, config: Config, shared: Shared) -> None:
        self.name = name
        fields = msgspec.structs.asdict(upstream)
        root = upstream.url.rstrip("/").removesuffix("/v1")
        replicas = [url.rstrip("/").removesuffix("/v1") for url in upstream.replicas]
        common = {
            k: v
            for k, v in fields.items()
            if k not in ("flavor", "strip_schema_keys", "documents", "safeguards", "url", "replicas")
        }
        self._translate = OpenAIBackend(
            name,
            OpenAIUpstream(
                url=root + "/v1", replicas=[r + "/v1" for r in replicas],
                flavor=upstream.flavor, strip_schema_keys=upstream.strip_schema_keys, **common,
            ),
            config, shared,
        )  # fmt: skip
        self._passthrough = AnthropicBackend(
            name,
            AnthropicUpstream(
                url=root, replicas=replicas, documents=upstream.documents, safeguards=upstream.safeguards, **common
            ),
            config,
            shared,
        )
        # Both clients reach the same instances (the same roots): an instance the probe or one
        # path passed over is passed over by the other too.
        self._translate._http.replicas = self._passthrough._http.replicas
        self._translate._http.loads = self._passthrough._http.loads  # which report to those replicas' placement
        self.chosen: Backend | None = None
        self._key = config.upstream_key(upstream)
        self._lock = asyncio.Lock()

    @property
    def path(self) -> str:
        return self.chosen.path if self.chosen is not None else "undecided"

    async def choose(self) -> Backend:
        if self.chosen is not None:
            return self.chosen
        async with self._lock:
            if self.chosen is None:
                # Both key styles: the server's auth must not decide which protocol it speaks.
                headers = {"authorization": f"Bearer {self._key}"} if self._key else None
                try:
                    status, content_type, _ = await self._passthrough._http.first_answer(
                        b"POST",
                        "/messages",
                        b"{}",
                        headers=headers,
                        timeout=PROBE_TIMEOUT,
                        accept=_judged,
                        pass_over_silent=True,
                    )
                except UpstreamTimeout:  # every instance silent
                    message = (
                        f"upstream {self.name}: no instance answered the protocol probe within {PROBE_TIMEOUT:g} s"
                    )
                    raise UpstreamTimeout(message) from None
                if not _judged(status, content_type):  # 401, 429, 5xx...: ask again next time
                    raise UpstreamError(f"upstream {self.name}: cannot tell its protocol, /v1/messages answered {status}"
                                        f"{'' if status != 500 else ' (not JSON)'}")  # fmt: skip
                self.chosen = self._translate if status in NOT_SERVED else self._passthrough
                log.info("upstream %s: /v1/messages answered %d, so requests %s", self.name, status,
                         "are translated" if self.chosen is self._translate else "pass through")  # fmt: skip
        return self.chosen

    async def messages(self, call: Call, route: Route) -> Reply:
        return await (await self.choose()).messages(call, route)

    async def count_tokens(self, call: Call, route: Route) -> Reply:
        return await (await self.choose()).count_tokens(call, route)

    async def list_models(self) -> list[UpstreamModel]:
        return await (await self.choose()).list_models()

    async def tool_support(self, models: list[UpstreamModel]) -> list[UpstreamModel]:
        return await (await self.choose()).tool_support(models)

    @property
    def http(self) -> HttpClient:
        """The client whose replicas both paths share (see __init__)."""
        return self._passthrough.http

    async def close(self) -> None:
        await self._translate.close()
        await self._passthrough.close()
