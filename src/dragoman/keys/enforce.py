"""A key's rules on the request path, where [limits] are applied (so they hold for HTTP,
`count_tokens` and batches alike): its status and expiry (a batch outliving its key),
its models, its own limits and its money budget. Nothing here waits on the database."""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry

from dragoman.calls.types import Call
from dragoman.core.config import Config
from dragoman.core.errors import PermissionDenied, Unauthorized
from dragoman.core.limit_settings import LimitSet
from dragoman.keys import money
from dragoman.keys.ring import Keyring
from dragoman.limits import gate
from dragoman.limits.gate import Admission, Extra, Limits

log = logging.getLogger("dragoman.keys")


class KeyedLimits(Limits):
    """[limits], and each key's own rules from the keyring."""

    ring: Keyring
    prices: money.Prices

    async def admit(self, key_id: str | None, tenant: str | None, call: Call, endpoint: str,
                    own: LimitSet | None = None, extras: tuple[Extra, ...] = ()) -> Admission:  # fmt: skip
        grant = self.ring.by_id.get(key_id) if key_id is not None else None
        if grant is None or grant.source == "config":
            return await super().admit(key_id, tenant, call, endpoint)
        refusal = grant.refusal()
        if refusal is not None:
            raise Unauthorized(refusal)
        if not grant.allows(call.model):  # the name asked for, whatever serves it
            allowed = ", ".join(grant.models or ())
            raise PermissionDenied(
                f"model: this API key may not use {call.model!r}; it may use: {allowed or 'no model'}"
            )
        if grant.budget is not None and endpoint != "count_tokens":
            price = self.prices.get(call.model, call.upstream_model)
            if price is not None:  # a model without a price costs nothing: no budget counts it
                extras = (money.spend(grant, call, price, time.time()),)
        return await super().admit(key_id, grant.tenant, call, endpoint, grant.limits, extras)


def build(config: Config, ring: Keyring, registry: CollectorRegistry | None = None) -> Limits | None:
    """The gateway's limits: [limits] and, when keys are made at run time, the keys' rules.
    None when there is nothing to apply."""
    if ring.store is None:
        return gate.build(config.limits, registry)
    keyed = gate.build(config.limits, registry, cls=KeyedLimits)
    assert isinstance(keyed, KeyedLimits)
    keyed.ring = ring
    keyed.prices = money.Prices.of(config.models)
    unpriced = [m.name for m in config.models if m.price is None]
    if unpriced or not config.models:

        def warn() -> None:
            log.warning("keys: a key has a money budget, and models without a price ([[models]] price) cost nothing: "
                        "no budget counts %s", ", ".join(unpriced) or "any model (none is configured)")  # fmt: skip

        ring.on_budget = warn
    return keyed
