"""Docs are read by people in minutes: narrative pages stay short (issue 38).

The reference (`configuration.md`), the generated table (`compatibility.md`) and the history
page are exempt; `performance.md` holds only the method, how to run it and the current results.
"""

from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[3] / "docs"
EXEMPT = {"configuration.md", "compatibility.md", "performance-history.md"}
LIMITS = {"performance.md": 4000}
NARRATIVE_LIMIT = 5000


def words(page: Path) -> int:
    return len(page.read_text().split())


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md") if p.name not in EXEMPT))
def test_narrative_page_is_short(page: str) -> None:
    limit = LIMITS.get(page, NARRATIVE_LIMIT)
    count = words(DOCS / page)
    assert count <= limit, f"docs/{page} has {count} words, over {limit}: move history or detail out"
