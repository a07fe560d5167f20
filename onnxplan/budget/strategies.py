"""The strategies a budget can be met with, registered by name: each plans the step its way and
returns the outcome, fitting or not; budget.decide weighs them and chooses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from onnxplan.budget.attempt import attempt, step_before_inplace
from onnxplan.budget.checkpoint import plan_with_checkpoint
from onnxplan.budget.choice import Candidate, choose, weigh
from onnxplan.budget.costs import CostModel
from onnxplan.budget.split import split_to_fit
from onnxplan.ir.graph import StepGraph
from onnxplan.passes.split_grad import splittable
from onnxplan.planning import PlanOptions, PlanOutcome
from onnxplan.swap.driver import AUTO_POLICIES

__all__ = ["AUTO_STRATEGIES", "STRATEGIES", "Strategy", "StrategySkipped", "register_strategy", "strategy_choices"]

# name -> a function planning the step with that strategy: (graph, budget, cost model, time
# limit, base options: the caller's order, planner, passes) -> PlanOutcome, fitting or not.
# A strategy is any way to trade time for memory; each is planned and budget.decide chooses
# among them (its one tie rule). Recompute and swap are registered here; a new one
# (offloading optimizer state...) registers itself the same way; the joint solver
# (budget/joint.py) registers two: "joint-quick" (auto: a deterministic solve, on graphs small
# enough for it) and "joint" (opt-in, planned only when named: a wall-clock limit of a minute).
Strategy = Callable[[StepGraph, int, CostModel, "float | None", PlanOptions], PlanOutcome]
STRATEGIES: dict[str, Strategy] = {}
AUTO_STRATEGIES: list[str] = []  # the ones budget.decide.fit_budget plans when none is named, in registration order


class StrategySkipped(Exception):
    """A strategy declines a request it cannot plan in its budget of time (the graph is too large
    for it): fit_budget leaves it out and says why; named (--strategy), a UsageError."""


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
    """Each policy swap's "auto" tries (swap.AUTO_POLICIES) planned, weighed by the one price and
    chosen by the one rule (budget.choice; swap's own "auto" keeps the first that fits); below
    swap's floor, nodes split in chunks (budget/split.py) on the chosen policy's plan."""
    opts = replace(base, budget=budget, time_limit=time_limit)
    times, _ = costs.times(step_before_inplace(graph, opts), inplace=opts.inplace, order=opts.order)
    made: dict[int, PlanOptions] = {}

    def policies(split: bool) -> list[Candidate]:
        cands = []
        for p in AUTO_POLICIES:
            o = replace(opts, swap=p, split_grad=split or opts.split_grad)
            cands.append(weigh("swap", attempt(graph, o), budget, times))
            made[id(cands[-1])] = o
        return cands

    cands = policies(False)
    if not any(c.fits for c in cands) and not base.split_grad and any(splittable(n) for n in graph.nodes):
        # the floor of swap is the largest working set: a fused ConvGrad (X, dY, dX, dW at once)
        # often sets it; split, the same swaps reach lower (same FLOPs, same numbers)
        cands += policies(True)
    chosen = choose(cands)
    out = chosen.outcome
    if out.plan.peak_bytes > budget:
        out = split_to_fit(graph, made[id(chosen)], out)
    return out
