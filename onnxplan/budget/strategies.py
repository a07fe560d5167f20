"""Fit a budget without a named policy: plan as is, else the strategy with the least predicted step time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from onnxplan.budget.attempt import attempt, step_before_inplace
from onnxplan.budget.checkpoint import plan_with_checkpoint
from onnxplan.budget.costs import CostModel, FlopCosts, ProfiledCosts
from onnxplan.checkpoint.costs import TimeModel
from onnxplan.ir.graph import StepGraph
from onnxplan.passes.split_grad import splittable
from onnxplan.plan_records import StrategyCandidate, StrategyRecord
from onnxplan.planning import PlanOptions, PlanOutcome
from onnxplan.sizes import format_bytes
from onnxplan.swap.pricing import StepPrice, StoreRates, planned_step

__all__ = ["AUTO_STRATEGIES", "STRATEGIES", "Strategy", "fit_budget", "plan_with_strategy", "predicted_step_seconds",
           "register_strategy", "step_price", "strategy_choices"]

# name -> a function planning the step with that strategy: (graph, budget, cost model, time
# limit, base options: the caller's order, planner, passes) -> PlanOutcome, fitting or not.
# A strategy is any way to trade time for memory; each is planned and the fitting one with
# the least predicted step time wins. Recompute and swap are registered here; a new one
# (offloading optimizer state...) registers itself the same way; the joint solver
# (budget/joint.py) is opt-in: planned only when named (--strategy joint).
Strategy = Callable[[StepGraph, int, CostModel, "float | None", PlanOptions], PlanOutcome]
STRATEGIES: dict[str, Strategy] = {}
AUTO_STRATEGIES: list[str] = []  # the ones fit_budget plans when none is named, in registration order


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
    out = attempt(graph, replace(base, swap="auto", budget=budget, time_limit=time_limit))  # swap's own policy
    if out.plan.peak_bytes > budget and not base.split_grad and any(splittable(n) for n in graph.nodes):
        # the floor of swap is the largest working set: a fused ConvGrad (X, dY, dX, dW at once)
        # often sets it; split, the same swaps reach lower (same FLOPs, same numbers)
        split = attempt(graph, replace(base, swap="auto", budget=budget, time_limit=time_limit, split_grad=True))
        if split.plan.peak_bytes < out.plan.peak_bytes:
            return split
    return out


def step_price(outcome: PlanOutcome, times: TimeModel | None = None, rates: StoreRates | None = None) -> StepPrice:
    """The predicted step of a planned outcome (onnxplan.swap.pricing.planned_step): every node
    but the swap nodes once, in one stream (a recomputed copy costs its original), and its
    swaps' transfers on one I/O worker at the swap store's rates (`rates`; None: the rates the
    plan records, SwapRecord.store), the compute waiting only for the late ones."""
    tm = times or TimeModel()
    g = outcome.graph
    if rates is None and outcome.plan.swap.store is not None:
        rates = StoreRates.of_record(outcome.plan.swap.store)
    return planned_step(g, outcome.plan.order, outcome.plan.swaps, lambda n: tm.node_seconds(g, n), rates)


def predicted_step_seconds(outcome: PlanOutcome, times: TimeModel | None = None,
                           rates: StoreRates | None = None) -> float:
    """Predicted seconds of one step of a planned outcome: step_price(...).seconds (compute and
    the transfers' stalls; the I/O thread's CPU runs beside the compute stream)."""
    return step_price(outcome, times, rates).seconds


def fit_budget(graph: StepGraph, opts: PlanOptions, costs: CostModel = FlopCosts()) -> tuple[PlanOutcome, str]:
    """The plan for `opts.budget` when the user named neither a checkpoint nor a swap policy:
    the plain plan if it fits; else every registered strategy is planned and the fitting one
    with the least predicted step time (by `costs`) is kept (none fits: the one of least
    peak). Returns (outcome, one line saying what was chosen and why); the choice is also
    recorded in plan.strategy."""
    budget = opts.budget
    plain = attempt(graph, replace(opts, swap="none", recompute=""))
    times, time_note = None, ""
    if budget is None or plain.plan.peak_bytes > budget:
        times, time_note = costs.times(plain.graph, inplace=opts.inplace, order=opts.order)
    rows = [("none", plain, predicted_step_seconds(plain, times))]
    if budget is None or plain.plan.peak_bytes <= budget:
        why = "the plan fits without recomputation or swap"
        return _record(plain, "none", why, rows, budget), why
    for name in AUTO_STRATEGIES:
        out = STRATEGIES[name](graph, budget, costs, opts.time_limit, opts)
        rows.append((name, out, predicted_step_seconds(out, times)))
    fitting = [r for r in rows[1:] if r[1].plan.peak_bytes <= budget]
    if fitting:
        name, out, secs = min(fitting, key=lambda r: (r[2], r[1].plan.peak_bytes))
        others = ", ".join(f"{n} {s * 1e3:.2f} ms" + ("" if o.plan.peak_bytes <= budget else " (misses the budget)")
                           for n, o, s in rows[1:] if n != name)
        why = (f"{name}: the plain plan needs {format_bytes(plain.plan.peak_bytes)} > budget "
               f"{format_bytes(budget)}; {name} fits with predicted step {secs * 1e3:.2f} ms"
               + (f" (vs {others})" if others else ""))
    else:
        name, out, secs = min(rows, key=lambda r: (r[1].plan.peak_bytes, r[2]))
        why = (f"{name}: no strategy reaches {format_bytes(budget)}; the smallest peak is "
               f"{format_bytes(out.plan.peak_bytes)} ({name})")
    if isinstance(costs, ProfiledCosts) and times.source != "profile":  # asked for a profile, got none: say why
        out.pass_notes.append(f"step times: {time_note}")
    return _record(out, name, why, rows, budget), why


def plan_with_strategy(graph: StepGraph, opts: PlanOptions, name: str,
                       costs: CostModel = FlopCosts()) -> tuple[PlanOutcome, str]:
    """The plan of the registered strategy `name` for `opts.budget` (not weighed against the
    others; it may miss the budget: the caller compares). Returns (outcome, one line); the
    choice is recorded in plan.strategy as for fit_budget."""
    budget = opts.budget
    out = STRATEGIES[name](graph, budget, costs, opts.time_limit, opts)
    times, _ = costs.times(step_before_inplace(graph, opts), inplace=opts.inplace, order=opts.order)
    secs = predicted_step_seconds(out, times)
    verdict = "fits" if out.plan.peak_bytes <= budget else "misses it"
    why = (f"{name} (named): peak {format_bytes(out.plan.peak_bytes)} for budget {format_bytes(budget)} "
           f"({verdict}), predicted step {secs * 1e3:.2f} ms")
    return _record(out, name, why, [(name, out, secs)], budget), why


def _record(out: PlanOutcome, name: str, why: str, rows, budget: int | None) -> PlanOutcome:
    record = StrategyRecord(name, why, budget, tuple(
        StrategyCandidate(n, o.plan.peak_bytes, s, budget is None or o.plan.peak_bytes <= budget) for n, o, s in rows))
    out.plan = replace(out.plan, strategy=record)
    return out
