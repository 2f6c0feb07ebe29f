"""The console's routes, added to the app's by `server/app.py`."""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from dragoman.console import api, pages

VIEWS = (  # path, template, title
    ("/console", "overview.html", "Overview"),
    ("/console/keys", "keys.html", "Keys"),
    ("/console/usage", "usage.html", "Usage"),
    ("/console/replicas", "replicas.html", "Replicas"),
    ("/console/requests", "requests.html", "Requests"),
)


def routes() -> list[BaseRoute]:
    """Pages, sign-in, the views' JSON endpoints and the static files (the script, uPlot)."""
    found: list[BaseRoute] = [
        Route(path, pages.view(template, title), methods=["GET"], name=f"console.{template.split('.')[0]}")
        for path, template, title in VIEWS
    ]
    data = "/console/data"
    return found + [
        Route("/console/me", pages.view("me.html", "My key", admin=False), methods=["GET"], name="console.me"),
        Route(pages.SIGNIN, pages.signin_form, methods=["GET"], name="console.signin"),
        Route(pages.SIGNIN, pages.signin, methods=["POST"], name="console.signin"),
        Route("/console/signout", pages.signout, methods=["POST"], name="console.signout"),
        Route(f"{data}/overview", api.overview, methods=["GET"], name="console.data.overview"),
        Route(f"{data}/usage", api.usage, methods=["GET"], name="console.data.usage"),
        Route(f"{data}/usage.csv", api.usage_csv, methods=["GET"], name="console.data.usage_csv"),
        Route(f"{data}/replicas", api.replicas, methods=["GET"], name="console.data.replicas"),
        Route(f"{data}/requests", api.requests, methods=["GET"], name="console.data.requests"),
        Route(f"{data}/me", api.me, methods=["GET"], name="console.data.me"),
        Route(f"{data}/keys", api.keys, methods=["GET"], name="console.data.keys"),
        Route(f"{data}/keys", api.create_key, methods=["POST"], name="console.keys.create"),
        Route(data + "/keys/{api_key_id}", api.update_key, methods=["POST"], name="console.keys.update"),
        Mount("/console/static", StaticFiles(packages=[("dragoman.console", "static")]), name="console.static"),
    ]
