"""No import cycles among dragoman's modules, counting every import: those under
`TYPE_CHECKING` and those inside functions too. A cycle hides a layering mistake (a shared
type in the wrong module), however it is kept from failing at import time. The graph and the
cycle search are scripts/gen_layers.py's, which checks the packages' floors the same way."""

from __future__ import annotations

from tests.support.scripts import script

layers = script("gen_layers")


def test_the_graph_sees_imports_inside_functions_and_type_checking() -> None:
    graph = layers.module_graph()
    assert "dragoman.calls.types" in graph["dragoman.assembly.observe"]
    assert graph["dragoman.calls.types"], "the leaf types module imports wire types"


def test_a_planted_cycle_is_found() -> None:
    assert layers.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    assert layers.cycles(layers.module_graph()) == []
