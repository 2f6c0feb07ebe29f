"""What `dragoman models` and `dragoman check` report: the gateway's view of its
upstreams and models, as lines for an operator."""

from __future__ import annotations

from dragoman.errors import GatewayError
from dragoman.gateway import Gateway


async def describe_models(gateway: Gateway) -> list[str]:
    """One line per served model: its upstream, upstream id, and whether (and why) it reasons."""
    await gateway.refresh_registry()
    for name in gateway.backends:
        await gateway.discover(name)
    lines = []
    try:
        for name in gateway.router.names():
            route = gateway.router.resolve(name)
            configured = next((m.reasoning for m in gateway.config.models if m.name == name or name in m.aliases), None)
            decision = gateway.router.decision(route.upstream_model, configured)
            kind = "reasoning" if decision.reasoning else "not reasoning"
            lines.append(f"{name}\tupstream={route.upstream}\tmodel={route.upstream_model}\t{kind} ({decision.why})")
    finally:
        await gateway.close()
    return lines


async def check_upstreams(gateway: Gateway) -> tuple[list[str], int]:
    """One line per upstream (the path chosen, the server kind, models and context
    windows), and how many could not be reached."""
    lines, failures = [], 0
    try:
        for name, backend in gateway.backends.items():
            try:
                models = await backend.list_models()
            except GatewayError as error:
                failures += 1
                lines.append(f"{name}\tunreachable\t{error.message}")
                continue
            profile = getattr(getattr(backend, "chosen", backend), "profile", None)
            kind = f"\tserver={profile.name}" if profile is not None else ""
            windows = ", ".join(f"{m.id} ({m.context_window or '?'} tokens)" for m in models) or "no models"
            lines.append(f"{name}\tpath={getattr(backend, 'path', '?')}{kind}\t{windows}")
    finally:
        await gateway.close()
    return lines, failures
