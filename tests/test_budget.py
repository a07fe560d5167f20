"""The budget layer: plan_step honours a budget or raises; plan_for_budget decides what a budget
needs, with a strategy registry a new solver plugs into; onnxplan.verify needs no OR-Tools."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from onnxplan.budget import AUTO_STRATEGIES, STRATEGIES, FlopCosts, MemoryRequest, attempt, plan_for_budget
from onnxplan.budget import strategies as strategies_module
from onnxplan.errors import EXIT_BUDGET, EXIT_USAGE, UsageError
from onnxplan.planning import BudgetNotMet, PlanOptions, plan_step
from tests.graphs import three_linear_step

OPTS = PlanOptions(order="given", planner="best-fit")


@pytest.fixture(scope="module")
def step():
    return three_linear_step(batch=64)


@pytest.fixture(scope="module")
def plain(step):
    return plan_step(step, OPTS)


def test_plan_step_honours_a_budget_it_meets(step, plain):
    peak = plain.plan.peak_bytes
    out = plan_step(step, replace(OPTS, budget=peak))
    assert out.plan.peak_bytes <= peak
    assert (out.plan.order, out.plan.buffers) == (plain.plan.order, plain.plan.buffers)


def test_plan_step_raises_on_a_budget_it_misses(step, plain):
    peak = plain.plan.peak_bytes
    with pytest.raises(BudgetNotMet, match=r"no plan reaches the budget .*smallest peak") as miss:
        plan_step(step, replace(OPTS, budget=peak - 1))
    assert miss.value.exit_code == EXIT_BUDGET
    assert miss.value.outcome.plan.peak_bytes == peak  # the plan it reached comes with the error
    assert attempt(step, replace(OPTS, budget=peak - 1)).plan.peak_bytes == peak


def test_budget_layer_picks_a_strategy_and_says_why(step, plain):
    budget = plain.plan.peak_bytes - 1
    out = plan_for_budget(step, OPTS, MemoryRequest(budget=budget))
    info = out.plan.strategy
    assert {c.strategy for c in info.candidates} == {"none", *AUTO_STRATEGIES}
    assert "joint" in STRATEGIES and "joint" not in AUTO_STRATEGIES  # opt-in: planned only when named
    assert any(n.startswith("memory strategy: ") for n in out.pass_notes)
    fits = [c for c in info.candidates if c.fits]
    assert (out.plan.peak_bytes <= budget) == bool(fits)
    same = plan_for_budget(step, OPTS, MemoryRequest(budget=plain.plan.peak_bytes))
    assert same.plan.strategy.chosen == "none"


def test_a_new_strategy_is_one_more_entry(step, plain, monkeypatch):
    """A solver plugs in as (graph, budget, cost model, time limit, base); registered for the
    default choice, fit_budget plans it beside recompute and swap."""
    seen = {}

    def toy(graph, budget, costs, time_limit, base):
        seen.update(budget=budget, costs=costs, time_limit=time_limit)
        return attempt(graph, replace(base, budget=None))

    monkeypatch.setitem(STRATEGIES, "toy", toy)
    monkeypatch.setattr(strategies_module, "AUTO_STRATEGIES", [*AUTO_STRATEGIES, "toy"])
    budget = plain.plan.peak_bytes - 1
    costs = FlopCosts()
    out = plan_for_budget(step, replace(OPTS, time_limit=2.0), MemoryRequest(budget=budget), costs)
    assert seen == {"budget": budget, "costs": costs, "time_limit": 2.0}
    assert "toy" in {c.strategy for c in out.plan.strategy.candidates}


@pytest.mark.parametrize("flags,needle", [
    ({"swap": "sometimes"}, "invalid --swap"), ({"checkpoint": "half"}, "invalid --checkpoint"),
    ({"lookahead": -1}, "invalid --lookahead"), ({"window_bytes": "0B"}, "invalid --window-bytes"),
    ({"budget": "lots"}, "invalid size"), ({"budget": "1MiB", "strategy": "magic"}, "invalid --strategy"),
    ({"strategy": "joint"}, "needs --budget"), ({"budget": "1MiB", "strategy": "joint", "swap": "auto"}, "drop --swap"),
])
def test_a_bad_request_is_a_usage_error(flags, needle):
    with pytest.raises(UsageError, match=needle) as err:
        MemoryRequest.from_flags(**flags)
    assert err.value.exit_code == EXIT_USAGE


def test_verify_imports_without_ortools():
    """The independent checker loads where OR-Tools is not installed (a finder refuses it)."""
    code = textwrap.dedent("""
        import sys
        class NoOrtools:
            def find_spec(self, name, path=None, target=None):
                if name == "ortools" or name.startswith("ortools."):
                    raise ImportError(f"No module named {name!r} (blocked)")
        sys.meta_path.insert(0, NoOrtools())
        import onnxplan.verify, onnxplan.offsets, onnxplan.orders, onnxplan.planning
        try:
            import ortools  # noqa: F401
        except ImportError:
            pass
        else:
            raise SystemExit("ortools was not blocked")
        assert not any(m == "ortools" or m.startswith("ortools.") for m in sys.modules)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
