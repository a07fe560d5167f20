"""The import graph of the package (tests/import_graph.py, from the source): no cycle between
subpackages, imports inside functions included; planning and what it is built from never import
the executor; the zoo (models/) and the CLI (cli/) are leaves nothing in the library imports."""

from __future__ import annotations

from tests import import_graph as ig


def test_no_cycle_between_subpackages():
    found = ig.cycles(ig.unit_graph(ig.module_graph()))
    assert not found, f"import cycles between subpackages: {found}"


def test_no_cycle_between_subpackages_through_imports_inside_functions():
    found = ig.cycles(ig.unit_graph(ig.module_graph(everywhere=True)))
    assert not found, f"import cycles between subpackages (imports inside functions included): {found}"


def test_the_zoo_and_the_cli_are_leaves():
    """No library module imports onnxplan.models or onnxplan.cli, not even inside a function:
    the library finds zoo models through a registered source (onnxplan.loading.zoo)."""
    bad = ig.leaf_imports(ig.module_graph(everywhere=True))
    assert not bad, f"library modules importing the zoo or the CLI: {bad}"


def test_a_planted_leaf_import_inside_a_function_is_caught():
    known = {"onnxplan.resolve", "onnxplan.models", "onnxplan.models.hf", "onnxplan.cli.app"}
    source = "def f():\n    from onnxplan.models.hf import export\n"
    assert ig.imports_of("onnxplan.resolve", source, known) == set()
    seen = ig.imports_of("onnxplan.resolve", source, known, everywhere=True)
    assert seen == {"onnxplan.models.hf"}
    graph = {"onnxplan.resolve": seen, "onnxplan.models.hf": {"onnxplan.resolve"}, "onnxplan.cli.app": {"onnxplan.models"}}
    assert ig.leaf_imports(graph) == [("onnxplan.resolve", "onnxplan.models.hf")]
    assert ig.cycles(ig.unit_graph(graph)) == [["onnxplan.models", "onnxplan.resolve"]]


def test_planning_layers_do_not_import_the_executor():
    bad = ig.forbidden_imports(ig.module_graph())
    assert not bad, f"module-level imports of onnxplan.executor below it: {bad}"


def test_not_even_imports_on_use_tie_the_planning_layers_to_the_executor():
    """Imports inside functions included: planning and the packages below it never import the
    executor, and no cycle runs through planning, the budget layer, the executor or the API."""
    full = ig.module_graph(everywhere=True)
    assert not ig.forbidden_imports(full)
    layers = {"onnxplan.planning", "onnxplan.budget", "onnxplan.executor", "onnxplan.api", "onnxplan.checkpoint",
              "onnxplan.swap", "onnxplan.passes", "onnxplan.orders", "onnxplan.offsets"}
    tangled = [c for c in ig.cycles(ig.unit_graph(full)) if layers & set(c)]
    assert not tangled, tangled


def test_the_walk_sees_the_layers():
    """The walk finds what it should: the budget layer above planning and the executor."""
    units = ig.unit_graph(ig.module_graph())
    assert {"onnxplan.planning", "onnxplan.executor"} <= units["onnxplan.budget"]
    assert "onnxplan.budget" not in units["onnxplan.planning"]
    assert "onnxplan.executor" in units["onnxplan.verification"]


def test_a_planted_cycle_and_a_planted_executor_import_are_caught():
    graph = {
        "onnxplan.planning": {"onnxplan.checkpoint.select"},
        "onnxplan.checkpoint.select": {"onnxplan.executor.runner"},
        "onnxplan.executor.runner": {"onnxplan.planning"},
        "onnxplan.ir.graph": set(),
    }
    assert ig.cycles(ig.unit_graph(graph)) == [["onnxplan.checkpoint", "onnxplan.executor", "onnxplan.planning"]]
    assert ig.forbidden_imports(graph) == [("onnxplan.checkpoint.select", "onnxplan.executor.runner")]
    del graph["onnxplan.executor.runner"]
    assert ig.cycles(ig.unit_graph(graph)) == []


def test_imports_are_read_at_module_level_only():
    known = {"onnxplan.a", "onnxplan.b", "onnxplan.c", "onnxplan.d", "onnxplan.e"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "import onnxplan.a\n"
        "try:\n    from onnxplan.b import x\nexcept ImportError:\n    pass\n"
        "if TYPE_CHECKING:\n    from onnxplan.c import y\n"
        "def f():\n    from onnxplan.d import z\n"
        "class K:\n    import onnxplan.e\n"
    )
    assert ig.imports_of("onnxplan.m", source, known) == {"onnxplan.a", "onnxplan.b", "onnxplan.e"}
