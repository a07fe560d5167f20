"""The strategies a budget can be met with, registered by name: each plans the step its way and
returns the outcome, fitting or not; budget.decide weighs them and chooses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from onnxplan.budget.attempt import attempt
from onnxplan.budget.checkpoint import plan_with_checkpoint
from onnxplan.budget.costs import CostModel
from onnxplan.budget.split import split_to_fit
from onnxplan.ir.graph import StepGraph
from onnxplan.passes.split_grad import splittable
from onnxplan.planning import PlanOptions, PlanOutcome

__all__ = ["AUTO_STRATEGIES", "STRATEGIES", "Strategy", "register_strategy", "strategy_choices"]

# name -> a function planning the step with that strategy: (graph, budget, cost model, time
# limit, base options: the caller's order, planner, passes) -> PlanOutcome, fitting or not.
# A strategy is any way to trade time for memory; each is planned and budget.decide chooses
# among them (its one tie rule). Recompute and swap are registered here; a new one
# (offloading optimizer state...) registers itself the same way; the joint solver
# (budget/joint.py) is opt-in: planned only when named (--strategy joint).
Strategy = Callable[[StepGraph, int, CostModel, "float | None", PlanOptions], PlanOutcome]
STRATEGIES: dict[str, Strategy] = {}
AUTO_STRATEGIES: list[str] = []  # the ones budget.decide.fit_budget plans when none is named, in registration order


def register_strategy(name: str, *, auto: bool = True) -> Callable[[Strategy], Strategy]:
    """Register a strategy under `name`; `auto`: also planned by fit_budget when no strategy is
    named (False: only when named, for one too slow or too new to run by default)."""
    def deco(fn: Strategy) -> Strategy:
        STRATEGIES[name] = fn
        if auto and name not in AUTO_STRATEGIES:
            AUTO_STRATEGIES.append(name)
        return fn

    return deco


def strategy_choices() -> tuple[str, ...]:
    """The values of --strategy: auto (fit_budget's choice among the auto strategies), then every registered one."""
    return ("auto", *STRATEGIES)


@register_strategy("recompute")
def _recompute(graph: StepGraph, budget: int, costs: CostModel, time_limit: float | None,
               base: PlanOptions) -> PlanOutcome:
    opts = replace(base, swap="none", budget=budget, time_limit=time_limit)
    return plan_with_checkpoint(graph, opts, "rotor", costs)  # rotor: the fastest schedule that fits


@register_strategy("swap")
def _swap(graph: StepGraph, budget: int, costs: CostModel, time_limit: float | None,
          base: PlanOptions) -> PlanOutcome:
    opts = replace(base, swap="auto", budget=budget, time_limit=time_limit)
    out = attempt(graph, opts)  # swap's own policy
    if out.plan.peak_bytes > budget and not base.split_grad and any(splittable(n) for n in graph.nodes):
        # the floor of swap is the largest working set: a fused ConvGrad (X, dY, dX, dW at once)
        # often sets it; split, the same swaps reach lower (same FLOPs, same numbers)
        split = attempt(graph, replace(opts, split_grad=True))
        if split.plan.peak_bytes < out.plan.peak_bytes:
            out, opts = split, replace(opts, split_grad=True)
    if out.plan.peak_bytes > budget:  # below swap's floor: nodes split in chunks (budget/split.py)
        out = split_to_fit(graph, opts, out)
    return out
