"""The anytime default: the offset ILP runs only when it can pay; --time-limit and ilp force it."""

from __future__ import annotations

from onnxplan.offsets import Buffer, best_fit_offsets, ilp_offsets, lower_bound
from onnxplan.offsets import ilp as ilp_module
from onnxplan.planning import ILP_AUTO_MAX_SECONDS, PlanOptions, ilp_budget, plan_step
from onnxplan.verify import verify_offsets
from tests.graphs import three_linear_step


def test_default_skips_the_ilp_at_the_lower_bound_and_says_why():
    res = plan_step(three_linear_step(), PlanOptions())
    assert res.plan.fragmentation == 0.0
    assert "ilp" not in [r.planner for r in res.rows]
    assert any(s.startswith("planner ilp:") and "lower bound" in s for s in res.skipped)
    assert list(res.plan.solver.skipped) == res.skipped


def test_time_limit_and_planner_ilp_force_the_solver():
    forced = plan_step(three_linear_step(), PlanOptions(time_limit=2.0))
    assert "ilp" in [r.planner for r in forced.rows]
    only = plan_step(three_linear_step(), PlanOptions(planner="ilp"))
    assert [r.planner for r in only.rows] == ["ilp"]


def test_default_never_worse_than_each_heuristic_strategy():
    g = three_linear_step()
    auto = plan_step(g, PlanOptions()).plan.peak_bytes
    for order in ("given", "nntrainer", "greedy"):
        for planner in ("sort", "greedy-size", "best-fit"):
            assert auto <= plan_step(g, PlanOptions(order=order, planner=planner)).plan.peak_bytes


def test_ilp_budget_grows_with_gap_and_size_and_is_capped():
    assert ilp_budget(0.0, 500) == 0.0
    assert ilp_budget(0.01, 100) < ilp_budget(0.02, 100) < ilp_budget(0.02, 400) + 1e-12
    assert ilp_budget(0.5, 5000) == ILP_AUTO_MAX_SECONDS


def test_decomposed_ilp_is_never_worse_than_its_seed(monkeypatch):
    import numpy as np

    rng = np.random.default_rng(0)
    bufs = []
    for i in range(120):
        first = int(rng.integers(0, 60))
        bufs.append(Buffer(f"b{i}", int(rng.integers(1, 40)) * 64, first, first + int(rng.integers(0, 6))))
    monkeypatch.setattr(ilp_module, "DECOMPOSE_ABOVE", 10)
    monkeypatch.setattr(ilp_module, "WINDOW_BUFFERS", 20)
    seed = best_fit_offsets(bufs)
    plan = ilp_offsets(bufs, time_limit=3.0, seed_plan=seed)
    verify_offsets(bufs, plan)
    assert plan.arena_bytes <= seed.arena_bytes
    assert plan.gap is not None and plan.arena_bytes >= lower_bound(bufs)
