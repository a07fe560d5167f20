"""One plan with fixed decisions, fitting its budget or not: the budget layer weighs a miss itself."""

from __future__ import annotations

from dataclasses import replace

from onnxplan.ir.graph import StepGraph
from onnxplan.pipeline import run_pipeline
from onnxplan.planning import BudgetNotMet, PlanOptions, PlanOutcome, pipeline_names, plan_step

__all__ = ["attempt", "step_before_inplace"]


def attempt(graph: StepGraph, opts: PlanOptions) -> PlanOutcome:
    """plan_step's outcome; where it misses `opts.budget`, the plan of least peak it reached."""
    try:
        return plan_step(graph, opts)
    except BudgetNotMet as miss:
        return miss.outcome


def step_before_inplace(graph: StepGraph, opts: PlanOptions) -> StepGraph:
    """The step as the cost models and the recompute policies see it: `opts`' pipeline up to
    (not including) the in-place pass (realize, interleave, split-grad)."""
    names = [n for n in pipeline_names(replace(opts, recompute="")) if n not in ("inplace", "inplace-state")]
    return run_pipeline(graph, names)[0]
