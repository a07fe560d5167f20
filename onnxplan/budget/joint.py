"""The joint solver (onnxplan.joint) as a strategy of the budget layer: recompute on the whole
step graph and paging, chosen together by CP-SAT. Opt-in (`--strategy joint`): its solve takes
seconds and its proven gap is still large, so fit_budget does not plan it by default.
Importing this module also registers the joint recompute code ("dag.") with the recompute pass
(onnxplan.joint.lower), so any process that imports onnxplan replays joint plans."""

from __future__ import annotations

from dataclasses import replace

from onnxplan.budget.attempt import step_before_inplace
from onnxplan.budget.costs import CostModel
from onnxplan.budget.strategies import register_strategy
from onnxplan.ir.graph import StepGraph
from onnxplan.joint import plan_joint
from onnxplan.planning import DEFAULT_TIME_LIMIT, PlanOptions, PlanOutcome

__all__ = ["plan_joint_strategy"]


@register_strategy("joint", auto=False)
def plan_joint_strategy(graph: StepGraph, budget: int, costs: CostModel, time_limit: float | None,
                        base: PlanOptions) -> PlanOutcome:
    """plan_joint under `budget` with the node times of `costs` (a profile, or the FLOP
    estimate) and page-ins at the memory bandwidth of the time model (the rate the swap
    module's transfers are predicted at); CP-SAT gets `time_limit` seconds per round (None: 10)."""
    times, note = costs.times(step_before_inplace(graph, base), inplace=base.inplace, order=base.order)
    limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    out, _ = plan_joint(graph, budget, base, costs=times.measured or None, swap_bandwidth=times.machine.bandwidth,
                        time_limit=limit)
    out.plan = replace(out.plan, joint=replace(out.plan.joint, time_source=note))
    return out
