"""The packages stand in floors (scripts/gen_layers.py: FLOORS, ground first): each imports only
packages below its own, so their import graph has no cycle, and `core/` imports nothing of
dragoman's. Imports under `TYPE_CHECKING` and inside functions count: a circle kept from failing
at import time is still a layering mistake. docs/architecture.md's package table is generated
from the same graph, so it cannot drift."""

from __future__ import annotations

from pathlib import Path

from tests.support.scripts import script

ROOT = Path(__file__).resolve().parents[3]


layers = script("gen_layers")


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_graph_counts_type_checking_function_and_relative_imports(tmp_path: Path) -> None:
    src = _tree(
        tmp_path,
        {
            "dragoman/__init__.py": "",
            "dragoman/cli.py": "import dragoman.low.base\n",
            "dragoman/low/__init__.py": "",
            "dragoman/low/base.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dragoman.high import top\n",
            "dragoman/mid/__init__.py": "",
            "dragoman/mid/part.py": "def later():\n    from ..low import base\n    from dragoman import __version__\n",
            "dragoman/high/__init__.py": "",
            "dragoman/high/top.py": "from dragoman.mid.part import later\n",
        },
    )
    graph = layers.import_graph(src)
    assert graph == {
        "__init__.py": set(),
        "cli.py": {"low/"},
        "low/": {"high/"},
        "mid/": {"low/", "__init__.py"},
        "high/": {"mid/"},
    }
    assert layers.cycles(graph) == [["high/", "low/", "mid/"]]


def test_an_arrow_up_across_or_to_no_floor_is_found() -> None:
    graph = {"core/": {"protocol/"}, "protocol/": {"core/"}, "tokens/": {"files/"}, "files/": {"unplaced/"}}
    assert layers.upward(graph) == [("core/", "protocol/"), ("files/", "unplaced/"), ("tokens/", "files/")]


def test_no_package_imports_in_a_circle() -> None:
    assert layers.cycles(layers.import_graph()) == []


def test_core_imports_nothing_of_dragomans() -> None:
    edges = {edge: why for edge, why in layers.module_edges().items() if edge[0] == "core/"}
    assert edges == {}


def test_every_package_has_a_floor_and_imports_only_below_it() -> None:
    graph = layers.import_graph()
    floors = layers.floor_of()
    assert sorted(node for node in graph if node not in floors) == [], "add it to FLOORS in scripts/gen_layers.py"
    assert layers.upward(graph) == []


def test_architecture_doc_table_is_current() -> None:
    committed = layers.DOC.read_text()
    assert layers.generated(committed) == committed, (
        "docs/architecture.md's package table is stale: run python scripts/gen_layers.py --write"
    )
