"""What `dragoman models` and `dragoman check` report: the gateway's view of its
upstreams and models, as lines for an operator."""

from __future__ import annotations

import time

from dragoman.assembly.gateway import Gateway, with_tool_support
from dragoman.calls.types import NoModelList, UpstreamModel
from dragoman.core.errors import GatewayError


def registry_note(gateway: Gateway) -> str | None:
    """What `dragoman models` says when models.dev could not be fetched: where its
    reasoning decisions came from instead (the start-up log says it only at debug level)."""
    if not gateway.registry_missed or gateway.registry_file is None:
        return None
    try:
        cached = time.strftime("%Y-%m-%d", time.localtime(gateway.registry_file.stat().st_mtime))
        source = f"its copy cached on {cached} ({gateway.registry_file})"
    except OSError:
        source = "configuration and model names only (no cached copy)"
    return f"the models.dev registry could not be fetched (offline?); reasoning is decided from {source}"


# A model whose chat template drops a request's tools (backends/openai/tool_support.py).
NO_TOOLS = "tools dropped: its chat template renders none"


async def describe_models(gateway: Gateway) -> list[str]:
    """One line per served model: its upstream, upstream id, and whether (and why) it reasons."""
    await gateway.refresh_registry()
    await gateway.discover_all(gateway.backends)
    lines = []
    shadowed = gateway.router.shadowed()
    try:
        for name in gateway.router.names():
            route = gateway.router.resolve(name)
            configured = next((m.reasoning for m in gateway.config.models if m.name == name or name in m.aliases), None)
            decision = gateway.router.decision(route.upstream_model, configured)
            kind = "reasoning" if decision.reasoning else "not reasoning"
            line = f"{name}\tupstream={route.upstream}\tmodel={route.upstream_model}\t{kind} ({decision.why})"
            if route.renders_tools is False:
                line += f"\t{NO_TOOLS}"
            if name in shadowed and route.upstream == shadowed[name][0]:
                line += f"\talso listed by {', '.join(shadowed[name][1])} (shadowed)"
            lines.append(line)
    finally:
        await gateway.close()
    return lines


async def check_upstreams(gateway: Gateway) -> tuple[list[str], int]:
    """One line per upstream (the path chosen, the server kind, models and context
    windows), and how many could not be reached."""
    lines: dict[str, str] = {}
    listed: dict[str, list[UpstreamModel]] = {}
    reached = 0  # answered without a model list
    try:
        for name, backend in gateway.backends.items():
            try:
                listed[name] = await with_tool_support(backend, await backend.list_models())
            except NoModelList as error:  # it answered: reachable, its models named by configuration
                lines[name] = f"{name}\tpath={getattr(backend, 'path', '?')}\t{error.message}"
                gateway.router.set_listless(name)
                reached += 1
                continue
            except GatewayError as error:
                lines[name] = f"{name}\tunreachable\t{error.message}"
                continue
            gateway.router.set_discovered(name, listed[name])
        shadowed = gateway.router.shadowed()  # known once every list is in
        for name, models in listed.items():
            backend = gateway.backends[name]
            profile = getattr(getattr(backend, "chosen", backend), "profile", None)
            kind = f"\tserver={profile.name}" if profile is not None else ""
            windows = ", ".join(_listed_model(name, m, shadowed) for m in models) or "no models"
            lines[name] = f"{name}\tpath={getattr(backend, 'path', '?')}{kind}\t{windows}"
    finally:
        await gateway.close()
    return [lines[name] for name in gateway.backends], len(gateway.backends) - len(listed) - reached


def _listed_model(upstream: str, model: UpstreamModel, shadowed: dict[str, tuple[str, list[str]]]) -> str:
    """`id (N tokens)`, and who serves it instead when an earlier upstream lists it too."""
    serving, others = shadowed.get(model.id, (upstream, []))
    note = f", shadowed by {serving}" if upstream in others else ""
    if model.renders_tools is False:
        note += f", {NO_TOOLS}"
    return f"{model.id} ({model.context_window or '?'} tokens{note})"
