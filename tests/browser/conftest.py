"""The console in a real browser: Debian's Chromium (/usr/bin/chromium) driven by Playwright's
sync API, never a browser Playwright downloads. Run on their own (`pytest -m browser
tests/browser`): the sync API runs its own event loop, which clashes with pytest-asyncio's
in one session. `DRAGOMAN_SCREENSHOTS=1` writes each view's screenshot to docs/images/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.console import accessibility_problems

CHROMIUM = os.environ.get("DRAGOMAN_CHROMIUM", "/usr/bin/chromium")
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium chromium-driver (scripts/test does, as root)")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


@pytest.fixture
def new_page(chromium: Any) -> Iterator[Any]:
    """`new_page()`: a page in a fresh context (its own cookies), at a screenshot's size; a
    script error on any page fails the test."""
    contexts: list[Any] = []
    errors: list[str] = []

    def make() -> Any:
        context = chromium.new_context(viewport={"width": 1280, "height": 860}, accept_downloads=True)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not _refused(m.text) else None)
        return page

    yield make
    for context in contexts:
        context.close()
    assert not errors, errors


def _refused(text: str) -> bool:
    """A page the test was meant to be refused (a 403 for a client key) logs its status."""
    return text.startswith("Failed to load resource") and ("403" in text or "401" in text)


@pytest.fixture
def shot(tmp_path: Path) -> Any:
    """`shot(page, name)`: the view's accessibility checked, and a screenshot, to
    docs/images/console-NAME.png with DRAGOMAN_SCREENSHOTS=1."""
    folder = IMAGES if os.environ.get("DRAGOMAN_SCREENSHOTS") == "1" else tmp_path

    def take(page: Any, name: str) -> Path:
        """Each view shot is checked first: labelled controls, contrast (tests/support/console.py)."""
        assert accessibility_problems(page) == [], name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"console-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
