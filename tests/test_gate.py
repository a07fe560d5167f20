"""onnxplan.gate: the CI gate's decisions as library functions (the CLI prints them)."""

from __future__ import annotations

from onnxplan.bench import BenchConfig, parse_strategies
from onnxplan.errors import EXIT_BUDGET, EXIT_FAILURE
from onnxplan.gate import OverBudget, gate_exit_code, over_budget


def test_a_model_no_plan_fits_is_over_budget_with_its_smallest_plan():
    config = BenchConfig(["a", "b", "c"], parse_strategies("ci"), None, [], budgets={"a": 100, "b": 100})
    def row(model, strategy, peak):  # the fields a bench row must have (onnxplan.bench.result_models.BenchRow)
        return {"model": model, "batch": 4, "strategy": strategy, "planned_peak_bytes": peak, "lower_bound_bytes": 0}

    rows = [row("a", "x", 150), row("a", "y", 120), row("b", "x", 90), row("b", "y", 200), row("c", "x", 10**9)]
    assert over_budget(rows, config) == [OverBudget("a", 100, 120, "y")]


def test_the_exit_code_of_the_gate():
    over = [OverBudget("a", 100, 120, "y")]
    assert gate_exit_code(False, [], [], False) == 0
    assert gate_exit_code(True, [], [], False) == EXIT_FAILURE
    assert gate_exit_code(False, [], [{"model": "a"}], False) == EXIT_FAILURE
    assert gate_exit_code(True, over, [], False) == EXIT_BUDGET
    assert gate_exit_code(False, over, [], True) == 0  # rewriting the baseline accepts the numbers
