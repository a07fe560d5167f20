"""One plan with fixed decisions, fitting its budget or not: the budget layer weighs a miss itself."""

from __future__ import annotations

from onnxplan.ir.graph import StepGraph
from onnxplan.planning import BudgetNotMet, PlanOptions, PlanOutcome, plan_step

__all__ = ["attempt"]


def attempt(graph: StepGraph, opts: PlanOptions) -> PlanOutcome:
    """plan_step's outcome; where it misses `opts.budget`, the plan of least peak it reached."""
    try:
        return plan_step(graph, opts)
    except BudgetNotMet as miss:
        return miss.outcome
