"""The operator console in the tests: sign in over HTTP as a browser would (the form's
double-submit token, then the session cookie) and read a page's CSRF token."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

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


# Run in a page: every control named (a label, aria-label or its text), and every visible
# text's contrast with the background behind it at least WCAG AA's (4.5:1, 3:1 if large).
_PROBLEMS = """() => {
  const problems = [];
  for (const el of document.querySelectorAll("input:not([type=hidden]), select, textarea, button")) {
    const name = (el.labels && el.labels.length ? el.labels[0].textContent : "") || el.getAttribute("aria-label")
      || (el.tagName === "BUTTON" ? el.textContent : "");
    if (!name.trim()) problems.push("unlabelled: " + el.outerHTML.slice(0, 80));
  }
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = (c) => c.slice(0, 3).map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
    .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const behind = (el) => {
    for (let n = el; n; n = n.parentElement) {
      const c = rgb(getComputedStyle(n).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c;
    }
    return [255, 255, 255];
  };
  for (const el of document.querySelectorAll("body *")) {
    if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    const style = getComputedStyle(el);
    if (!el.checkVisibility() || el.closest(".skip")) continue;
    const [hi, lo] = [lum(rgb(style.color)), lum(behind(el))].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) problems.push(`contrast ${ratio.toFixed(2)}: ${el.textContent.trim().slice(0, 40)}`);
  }
  return problems;
}"""


def accessibility_problems(page: Any) -> list[str]:
    """What a Playwright page shows that fails the checks above (empty: none)."""
    return list(page.evaluate(_PROBLEMS))
