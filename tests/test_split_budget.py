"""budget/split.py: below swap's floor the swap strategy splits nodes in chunks; at or above
it, plans are unchanged; a split plan runs and matches ONNX Runtime (issue 28)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest

from onnxplan import api
from onnxplan.budget import MemoryRequest, plan_for_budget
from onnxplan.budget import split as split_mod
from onnxplan.executor.swap_account import describe_accounting
from onnxplan.planning import PlanOptions


@pytest.fixture(scope="module")
def transformer():
    """The zoo's transformer at batch 16 (its GELU's 2 MiB input and output set swap's floor:
    smaller, the embedding's AdamW update does)."""
    return api.load("transformer", batch=16)


def _floor(step, budget: int):
    """The swap strategy's plan (named: by default joint-quick may reach a lower peak, and its
    plan records its solve's seconds) and its floor."""
    res = plan_for_budget(step.graph, PlanOptions(), MemoryRequest(budget=budget, strategy="swap"))
    return res, (res.swap.floor if res.swap is not None else None)


def _split_floor(step):
    """The plan and floor at the least budget a split may reach (the floor of the nodes that do
    not split, below which no split graph is planned)."""
    _, lowest = _floor(step, 1)
    assert lowest is not None and lowest.unsplit
    return _floor(step, lowest.bound)


def test_below_what_any_split_reaches_no_split_is_planned_and_the_floor_says_why(transformer, monkeypatch):
    unsplit_floor = _unsplit(transformer, 1, monkeypatch).swap.floor
    res, lowest = _floor(transformer, 1)
    assert not res.plan.splits and lowest is not None and lowest.bound < unsplit_floor.bound
    assert "which no recomputation, swap or split avoids (it does not split: " in lowest.describe()
    assert lowest.unsplit in lowest.describe() and lowest.node in lowest.describe()
    assert "which no recomputation or swap avoids" in unsplit_floor.describe()


def test_below_the_floor_split_nodes_lower_it_and_name_the_new_one(transformer, monkeypatch):
    unsplit_floor = _unsplit(transformer, 1, monkeypatch).swap.floor
    assert unsplit_floor is not None and "Gelu" in unsplit_floor.node
    res, floor = _split_floor(transformer)
    assert res.plan.splits and any("Gelu" in s.node for s in res.plan.splits)
    assert floor is not None and floor.bound < unsplit_floor.bound and "Gelu" not in floor.node
    budget = (floor.bound + unsplit_floor.bound) // 2  # between the two floors: fits split
    fit, _ = _floor(transformer, budget)
    assert fit.plan.peak_bytes <= budget and fit.plan.splits
    assert "split" in fit.plan.strategy.reason or any("split:" in p for p in fit.plan.passes)


def _unsplit(step, budget: int, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(split_mod, "split_to_fit", lambda graph, opts, swapped: swapped)
        m.setattr("onnxplan.budget.strategies.split_to_fit", lambda graph, opts, swapped: swapped)
        return plan_for_budget(step.graph, PlanOptions(), MemoryRequest(budget=budget, strategy="swap"))


def _same(a, b) -> bool:
    drop = {"solve_seconds", "solver", "strategy", "options"}
    ja, jb = (json.loads(p.dumps()) for p in (a, b))
    return {k: v for k, v in ja.items() if k not in drop} == {k: v for k, v in jb.items() if k not in drop}


def test_a_budget_at_or_above_the_floor_plans_as_without_splitting(transformer, monkeypatch):
    floor = _unsplit(transformer, 1, monkeypatch).swap.floor
    for budget in (floor.bound + (64 << 10), 2 * floor.bound):
        with_split = plan_for_budget(transformer.graph, PlanOptions(),
                                     MemoryRequest(budget=budget, strategy="swap")).plan
        without = _unsplit(transformer, budget, monkeypatch).plan
        assert not with_split.splits and not with_split.pieces
        assert _same(with_split, without)
    # and the comparison can fail: a split plan differs from the unsplit one
    lowest = _floor(transformer, 1)[1]
    low = plan_for_budget(transformer.graph, PlanOptions(), MemoryRequest(budget=lowest.bound, strategy="swap")).plan
    assert low.splits and not _same(low, _unsplit(transformer, lowest.bound, monkeypatch).plan)


@pytest.mark.slow
def test_a_split_plan_runs_and_matches_onnx_runtime(transformer):
    """Below the unsplit floor: the plan splits, runs, is verified against ONNX Runtime step
    by step, and its measured peak is within 10% + the runtime's fixed overhead."""
    from onnxplan.run_report import RUNTIME_OVERHEAD_BYTES

    res, _ = _split_floor(transformer)
    # the floor is a lower bound the offsets need not reach (alignment): budget the least peak
    # the search reached at it, with the planners' alignment to spare (the search is not monotone
    # in the budget to the byte)
    budget = res.plan.peak_bytes + (16 << 10)
    out = api.solve(transformer, PlanOptions(), MemoryRequest(budget=budget, strategy="swap"))
    assert out.plan.splits and out.plan.peak_bytes <= budget
    report = api.run(transformer, out.plan, steps=2, warmup=0, verify=True, measure=True, budget=budget)
    assert report.verified is True
    assert report.measured_peak_bytes <= 1.1 * out.plan.peak_bytes + RUNTIME_OVERHEAD_BYTES["cpu"]
    assert dataclasses.asdict(out.plan.splits[0])["k"] >= 2
    # the latency comparison ran the plan unsplit as well as without swap, and says so
    acc = report.swap
    assert acc is not None and acc.compared_unsplit
    lines = "\n".join(describe_accounting(acc))
    assert "without swap or splits" in lines and "DIFFERENT" not in lines


@pytest.mark.slow
def test_a_split_optimizer_update_below_the_floor_matches_onnx_runtime():
    """mlp at batch 64: swap's floor (3.56 MiB) is fc1's AdamW update; at 2 MiB the update is
    split, its parameter and moments homed in the piece store, and the run matches ONNX Runtime."""
    from onnxplan.run_report import RUNTIME_OVERHEAD_BYTES

    step = api.load("mlp", batch=64)
    budget = 2 << 20
    out = api.solve(step, PlanOptions(), MemoryRequest(budget=budget))
    assert out.plan.peak_bytes <= budget
    assert any(s.op == "onnxplan.AdamWUpdate" for s in out.plan.splits)
    report = api.run(step, out.plan, steps=2, warmup=0, verify=True, measure=True, budget=budget)
    assert report.verified is True
    assert report.measured_peak_bytes <= 1.1 * out.plan.peak_bytes + RUNTIME_OVERHEAD_BYTES["cpu"]


def test_plan_below_the_floor_records_splits_and_explain_lists_them(tmp_path):
    """`plan mlp --budget 2MiB -o` (swap's floor is 3.56 MiB): the file records the split update
    and its pieces, `explain` lists the split and adopts the file (a changed K is refused)."""
    from typer.testing import CliRunner

    from onnxplan.cli.app import app

    runner = CliRunner()
    out = tmp_path / "plan.json"
    r = runner.invoke(app, ["plan", "mlp", "--batch", "64", "--budget", "2MiB", "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = json.loads(out.read_text())
    assert text["splits"] and text["pieces"] and any(p.startswith("split:") for p in text["passes"])
    r = runner.invoke(app, ["explain", str(out)])
    assert r.exit_code == 0 and "split: 1 node(s)" in r.output and "AdamWUpdate" in r.output, r.output
    text["splits"][0]["k"] = 2  # not the split pass's K
    out.write_text(json.dumps(text))
    r = runner.invoke(app, ["explain", str(out)])
    assert r.exit_code == 2 and "splits are not those of its split pass" in r.output


@pytest.fixture
def no_swap_baseline_by_best_fit(monkeypatch):
    """api.run's latency comparison (executor/swap_account.py) plans the same step without swap
    with the plan's planner: for resnet18 b16 at 18 MiB a second ILP solve of its arena (about
    90 s on the CI machine). A test that asserts nothing of that comparison places it with
    best-fit: the comparison run still happens, on the same order and passes."""
    from onnxplan.executor import swap_account

    real = swap_account.no_swap_options
    monkeypatch.setattr(swap_account, "no_swap_options", lambda plan: replace(real(plan), planner="best-fit"))


@pytest.mark.slow
@pytest.mark.parametrize("model, batch, budget", [("transformer", 16, 2 << 20), ("resnet18", 8, 18 << 20)])
def test_issue_28s_halved_floors_plan_run_and_match_onnx_runtime(model, batch, budget, no_swap_baseline_by_best_fit):
    """transformer b16 at 2 MiB (products, views, sums over rows, LayerNorm's gradient split) and
    resnet18 at 18 MiB (layer4's dW ConvGrads over their output channels): half the floors of
    h-split (resnet18's, 36.56 MiB, is layer4's AdamW update at any batch: issue 28's line is b16,
    run here at b8, which plans and runs in half the time); verified against ONNX Runtime,
    measured peak within 10% + the fixed overhead."""
    from onnxplan.run_report import RUNTIME_OVERHEAD_BYTES

    step = api.load(model, batch=batch)
    out = api.solve(step, PlanOptions(), MemoryRequest(budget=budget))
    assert out.plan.splits and out.plan.peak_bytes <= budget
    report = api.run(step, out.plan, steps=2, warmup=0, verify=True, measure=True, budget=budget)
    assert report.verified is True
    assert report.measured_peak_bytes <= 1.1 * out.plan.peak_bytes + RUNTIME_OVERHEAD_BYTES["cpu"]


def _lm_head(n: int = 4096):
    """x [4, 32, 128] times w [n, 128] (transB): at n = 4096 the product's working set is w
    (2 MiB) + x + y [4, 32, n] (2 MiB); w is read whole by every chunk, so its smallest chunk
    (in 16, over the 128 flattened rows; in 4 over the batch alone) sets the floor."""
    from onnxplan.ir import ValueClass
    from tests.graphs import GraphBuilder

    b = GraphBuilder("lm-head")
    b.value("x", (4, 32, 128), ValueClass.INPUT)
    b.value("w", (n, 128), ValueClass.INPUT)
    b.node("FusedMatMul", ["x", "w"], ["y"], [(4, 32, n)], domain="com.microsoft", name="head", transB=1, alpha=1.0)
    b.node("Relu", ["y"], ["y.out"], name="after")
    b.g.outputs.append("y.out")
    b.g.loss = "y.out"
    return b.g


def test_the_floor_is_the_least_peak_of_any_split_and_a_budget_under_it_is_one_line():
    """The floor counts the smallest chunk of a node that splits (here the product's, w whole):
    brute force over every K the product splits in, the least peak planned is the floor; one
    page under it the budget is refused with that floor, naming the node and its chunks."""
    from onnxplan.budget.attempt import attempt
    from onnxplan.errors import BudgetError
    from onnxplan.passes.split import SplitSpec, why_not
    from onnxplan.planning import require_budget

    g = _lm_head()
    opts = PlanOptions(interleave=False)
    res = plan_for_budget(g, opts, MemoryRequest(budget=1, strategy="swap"))
    floor = res.swap.floor
    assert floor is not None and floor.node == "head" and floor.chunks == 16
    ks = [k for k in range(2, 17) if not why_not(g, g.node("head"), k)]
    assert ks == [2, 4, 8, 16]
    peaks = {k: attempt(g, dataclasses.replace(opts, swap="auto", budget=1, splits=(SplitSpec("head", k),))).plan.peak_bytes
             for k in ks}
    assert min(peaks.values()) == floor.bound == peaks[16]
    with pytest.raises(BudgetError) as under:
        require_budget(plan_for_budget(g, opts, MemoryRequest(budget=floor.bound - 4096, strategy="swap")),
                       floor.bound - 4096)
    line = str(under.value)
    assert "\n" not in line
    assert f"({floor.bound} B)" in line and "node 'head', one of its 16 chunks" in line
    fit = plan_for_budget(g, opts, MemoryRequest(budget=floor.bound, strategy="swap"))
    assert fit.plan.peak_bytes <= floor.bound and {s.node: s.k for s in fit.plan.splits} == {"head": 16}


def test_with_no_strategy_named_a_budget_under_the_floor_names_the_split_floor(transformer):
    """Auto: the plan of least peak may be another strategy's (a recomputed node's working set
    as its own floor); the line names the split floor all the same."""
    from onnxplan.errors import BudgetError
    from onnxplan.planning import require_budget

    _, lowest = _floor(transformer, 1)
    res = plan_for_budget(transformer.graph, PlanOptions(), MemoryRequest(budget=1))
    with pytest.raises(BudgetError) as under:
        require_budget(res, 1)
    line = str(under.value)
    assert f"({lowest.bound} B)" in line and repr(lowest.node) in line and "swap or split avoids" in line
