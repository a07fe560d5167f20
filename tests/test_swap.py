"""Swap planning: policies on NNTrainer's Figure 7/8 chains, budgets, the verifier, plan JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from onnxplan.ir import ValueClass
from onnxplan.ir.load import read_step
from onnxplan.passes.lifetimes import lifetimes
from onnxplan.pipeline import run_pipeline
from onnxplan.plan import Plan
from onnxplan.planning import BudgetNotMet, PlanOptions, pipeline_names, plan_step, verify_plan
from onnxplan.swap import is_swap_node, rewrite_graph, swap_model, swap_totals, verify_swaps
from onnxplan.swap.policies import Window
from onnxplan.verify import PlanError
from tests.graphs import linear_chain, three_linear_step
from tests.zoo_small import small_artifacts

POLICIES = [("on-demand", {}), ("reduced", {}), ("proactive", {"lookahead": 1}),
            ("proactive", {"lookahead": 2}), ("window", {"window_bytes": 16384})]


@pytest.fixture(scope="module")
def chain():
    return linear_chain()


@pytest.fixture(scope="module")
def outcomes(chain):
    out = {"none": plan_step(chain, PlanOptions(planner="ilp", order="given"))}
    for name, kw in POLICIES:
        key = name + "".join(f"-{v}" for v in kw.values())
        out[key] = plan_step(chain, PlanOptions(planner="ilp", order="given", swap=name, **kw))
    return out


def test_every_policy_swaps_and_verifies(outcomes):
    for key, res in outcomes.items():
        verify_plan(res.graph, res.plan)
        if key != "none":
            assert res.plan.swaps, key
            verify_swaps(res.graph, res.plan)
            assert res.plan.peak_bytes < outcomes["none"].plan.peak_bytes, key


def test_planned_peaks_per_policy(outcomes):
    """Figure 12: on-demand and reduced reach the same peak, reduced with fewer transfers
    (no round trips, clean swap-outs write nothing); proactive keeps more in memory (the
    prefetched and the completing buffers) with fewer swaps; a longer lookahead keeps more."""
    peak = {k: r.plan.peak_bytes for k, r in outcomes.items()}
    totals = {k: swap_totals(r.plan.swaps) for k, r in outcomes.items()}
    assert peak["on-demand"] == peak["reduced"]
    assert totals["reduced"]["transfers"] < totals["on-demand"]["transfers"]
    assert totals["reduced"]["bytes_out"] < totals["on-demand"]["bytes_out"]
    assert peak["reduced"] <= peak["proactive-1"] <= peak["proactive-2"] < peak["none"]
    assert totals["proactive-1"]["swaps"] <= totals["reduced"]["swaps"]
    # the floor of on-demand: the largest working set of one node plus what cannot move
    res = outcomes["on-demand"]
    assert res.plan.lower_bound_bytes == res.plan.peak_bytes  # the ILP packs it without waste


def test_on_demand_brackets_every_use(outcomes):
    """Figure 7: a swapped buffer comes in right before each use and goes out right after it."""
    res = outcomes["on-demand"]
    order = res.plan.order
    eo = {n: i for i, n in enumerate(order)}
    for s in res.plan.swaps:
        assert s.write
        assert eo[s.next_use] == s.in_eo + 1 or is_swap_node(res.graph.node(order[s.in_eo + 1]))
        if s.last_use:
            between = [n for n in order[eo[s.last_use] + 1:s.out_eo] if not n.startswith("swap-")]
            assert not between


def _base_between(order, a: int, b: int) -> int:
    return sum(1 for n in order[a + 1:b] if not n.startswith("swap-"))


@pytest.mark.parametrize("lookahead", [1, 2])
def test_proactive_issues_swap_ins_lookahead_early(outcomes, lookahead):
    res = outcomes[f"proactive-{lookahead}"]
    order = res.plan.order
    eo = {n: i for i, n in enumerate(order)}
    checked = 0
    for s in res.plan.swaps:
        ahead = _base_between(order, s.in_eo, eo[s.next_use])
        if s.wraps:  # issued before the first use, no earlier than the step's start
            assert ahead == min(lookahead, _base_between(order, -1, eo[s.next_use])), s
            completes = _base_between(order, eo[s.last_use], s.out_eo)
            assert completes == min(1, _base_between(order, eo[s.last_use], len(order))), s
            continue
        completes = _base_between(order, eo[s.last_use], s.out_eo) if s.last_use else 0
        assert ahead == lookahead, s
        assert completes == (1 if s.last_use else 0), s  # the write overlaps the EO after the last use
        checked += 1
    assert checked


def test_window_respects_its_byte_window(chain, outcomes):
    """Every swap-in is issued at the first node whose window (the variable sequence from its
    first variable, `window_bytes` long) reaches the use; gaps inside the window stay."""
    res = outcomes["window-16384"]
    g, _ = run_pipeline(chain, pipeline_names(PlanOptions()))
    base = tuple(n for n in res.plan.order if not n.startswith("swap-"))
    model = swap_model(g, base, lifetimes(g, base))
    sums = [0]
    for _, _, nbytes in model.entries:
        sums.append(sums[-1] + nbytes)
    beo = {n: i for i, n in enumerate(base)}
    order = res.plan.order
    for s in res.plan.swaps:
        use = beo[s.next_use]
        issue = beo[next(n for n in order[s.in_eo:] if not n.startswith("swap-"))]
        p = model.entry_index(use, s.value)
        assert sums[p + 1] - sums[model.entry_start[issue]] <= 16384, s
        after = beo[s.last_use] if s.last_use else -1
        if issue > after + 1:  # not clipped by the swap-out: one node earlier is outside the window
            assert sums[p + 1] - sums[model.entry_start[issue - 1]] > 16384, s
    bigger = plan_step(chain, PlanOptions(planner="ilp", order="given", swap="window", window_bytes=1 << 30))
    assert not bigger.plan.swaps  # every next use is inside a huge window: nothing moves


def test_window_default_is_largest_working_set(chain):
    g, _ = run_pipeline(chain, pipeline_names(PlanOptions()))
    order = tuple(n.name for n in g.nodes)
    model = swap_model(g, order, lifetimes(g, order))
    assert Window().window(model) == max(model.working_set(t) for t in range(model.n))


def test_weights_swap_clean_before_update_and_write_back_after(outcomes):
    res = outcomes["reduced"]
    weights = [s for s in res.plan.swaps if s.vclass == "parameter"]
    assert weights
    wraps = [s for s in weights if s.wraps]
    assert wraps and all(s.write for s in wraps)  # the updated weight goes back to the store
    assert any(not s.write for s in weights if not s.wraps)  # forward -> backward: store already has it
    assert res.plan.persistent_bytes < sum(
        v.nbytes for v in res.graph.values.values() if v.vclass == ValueClass.PARAMETER and "@" not in v.name
        and not v.name.endswith(".updated"))


def test_budget_greedy_fits_and_verifies(chain, outcomes):
    none = outcomes["none"].plan.peak_bytes
    floor = outcomes["on-demand"].plan.peak_bytes
    budget = (none + floor) // 2
    for name in ("reduced", "proactive", "window", "auto"):
        res = plan_step(chain, PlanOptions(planner="ilp", order="given", swap=name, budget=budget))
        assert res.swap is not None and res.swap.fits, name
        assert res.plan.peak_bytes <= budget
        verify_plan(res.graph, res.plan)
    few = plan_step(chain, PlanOptions(planner="ilp", order="given", swap="reduced", budget=budget))
    assert len(few.plan.swaps) < len(outcomes["reduced"].plan.swaps)  # only what the budget needs


def test_auto_swaps_only_when_needed(chain, outcomes):
    none = outcomes["none"].plan.peak_bytes
    res = plan_step(chain, PlanOptions(planner="ilp", order="given", swap="auto", budget=none))
    assert res.swap is None and not res.plan.swaps
    res = plan_step(chain, PlanOptions(planner="ilp", order="given", swap="auto", budget=none - 4096))
    assert res.plan.swaps and "chose" in res.swap.notes[-1]


def test_budget_below_floor_states_it(chain):
    with pytest.raises(BudgetNotMet, match="no plan reaches the budget") as miss:
        plan_step(chain, PlanOptions(planner="ilp", order="given", swap="reduced", budget=1024))
    res = miss.value.outcome
    sw = res.swap
    assert not sw.fits and sw.floor is not None
    assert sw.floor.peak_bytes == res.plan.peak_bytes or sw.floor.peak_bytes <= res.plan.peak_bytes
    assert sw.floor.working_set > 0 and sw.floor.node in {n.name for n in res.graph.nodes}
    # the floor's bound (what its node holds while it runs) is a lower bound of the plan, reached here
    assert sw.floor.bound <= sw.floor.peak_bytes <= sw.floor.bound + 4096
    assert "which no recomputation or swap avoids" in sw.floor.describe()


def test_the_floor_counts_the_nodes_scratch():
    """Below the least swap reaches, the floor names the node, its touched bytes and its kernel's
    scratch (nnt-conv2d's im2col columns set it) and the bound they make, which the floor reaches."""
    folder = small_artifacts("nnt-conv2d")
    g = read_step(folder)
    with pytest.raises(BudgetNotMet) as miss:
        plan_step(g, PlanOptions(swap="auto", budget=1024))
    floor = miss.value.outcome.swap.floor
    assert floor.scratch > 0 and floor.bound >= floor.working_set + floor.scratch
    assert floor.bound <= floor.peak_bytes <= floor.bound + 64 * 16


def test_plan_json_records_swaps_and_rebuilds(chain, outcomes):
    res = outcomes["proactive-1"]
    d = json.loads(res.plan.dumps())
    assert d["swaps"] and {"value", "out_eo", "in_eo", "bytes", "write", "class"} <= set(d["swaps"][0])
    assert d["options"]["swap"]["policy"] == "proactive" and d["options"]["swap"]["lookahead"] == 1
    again = Plan.from_json(d)
    assert again == res.plan
    g, _ = run_pipeline(chain, list(again.passes))
    rebuilt = rewrite_graph(g, again.order, again.swaps)
    assert lifetimes(rebuilt, again.order).buffers == lifetimes(res.graph, again.order).buffers
    verify_plan(rebuilt, again)
    old = json.loads(outcomes["none"].plan.dumps())
    old.pop("swaps")
    assert Plan.from_json(old).swaps == ()  # plans written before swaps still load


def test_verifier_catches_a_dropped_write(outcomes):
    res = outcomes["reduced"]
    dirty = next(s for s in res.plan.swaps if s.write and not s.wraps)
    swaps = tuple(dataclasses.replace(s, write=False) if s == dirty else s for s in res.plan.swaps)
    bad = dataclasses.replace(res.plan, swaps=swaps)
    g = rewrite_graph(run_pipeline(linear_chain(), list(bad.passes))[0], bad.order, bad.swaps)
    with pytest.raises(PlanError, match="writes nothing"):
        verify_swaps(g, bad)


def test_verifier_catches_a_read_after_swap_out(outcomes):
    res = outcomes["reduced"]
    g = res.graph.copy()
    s = next(s for s in res.plan.swaps if not s.wraps)
    swap_in = g.node(s.in_node)
    copy = swap_in.outputs[0]
    original = g.node(s.out_node).inputs[0]
    for n in g.nodes:  # read the stale original instead of the swapped-in copy
        if n.name == s.next_use:
            n.inputs = [original if i == copy else i for i in n.inputs]
    with pytest.raises(PlanError):
        verify_swaps(g, res.plan)


def test_three_linear_figure8_every_policy():
    """Figure 8's three linear layers, with SGD and with AdamW (optimizer state swaps too)."""
    for optimizer in ("SGD", "AdamW"):
        g = three_linear_step(optimizer, batch=64)
        none = plan_step(g, PlanOptions(planner="ilp")).plan.peak_bytes
        for name, kw in POLICIES:
            res = plan_step(g, PlanOptions(planner="ilp", swap=name, **kw))
            verify_plan(res.graph, res.plan)
            assert res.plan.peak_bytes <= none
        res = plan_step(g, PlanOptions(planner="ilp", swap="reduced"))
        if optimizer == "AdamW":
            assert any(s.vclass == "optimizer_state" for s in res.plan.swaps)
