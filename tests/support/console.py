"""The operator console in the tests: sign in over HTTP as a browser would (the form's
double-submit token, then the session cookie) and read a page's CSRF token."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import httpx

PAGES = ("/console", "/console/keys", "/console/usage", "/console/replicas", "/console/requests")
DATA = ("overview", "usage", "usage.csv", "replicas", "requests", "keys")


def form_token(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the sign-in form carries its token"
    return found.group(1)


def csrf(page: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]+)"', page)
    assert found, "a signed-in page carries its CSRF token"
    return found.group(1)


def signin(client: httpx.Client, key: str, **headers: str) -> httpx.Response:
    """POST the sign-in form with `key` (after GETting it, for its token and cookie)."""
    form = client.get("/console/signin")
    assert form.status_code == 200, form.text
    return client.post("/console/signin", data={"key": key, "csrf": form_token(form.text)}, headers=headers)


@contextlib.contextmanager
def session(url: str, key: str) -> Iterator[tuple[httpx.Client, str]]:
    """A client signed in with `key`, and the CSRF token of its session."""
    with httpx.Client(base_url=url, follow_redirects=False, timeout=10) as client:
        answer = signin(client, key)
        assert answer.status_code == 303, answer.text
        page = client.get(answer.headers["location"])
        yield client, csrf(page.text)
