"""Recompute under a budget: choose a checkpoint schedule with a named policy, then plan the
step with the recompute pass replaying it."""

from __future__ import annotations

import time
from dataclasses import replace

from onnxplan.budget.attempt import attempt, step_before_inplace
from onnxplan.budget.choice import choose, weigh
from onnxplan.budget.costs import FLOP_COSTS, CostModel
from onnxplan.checkpoint.chain import Chain, build_chain
from onnxplan.checkpoint.costs import TimeModel
from onnxplan.checkpoint.rotor import DEFAULT_SLOTS
from onnxplan.checkpoint.schedule import Schedule, encode, simulate, store_all
from onnxplan.checkpoint.select import Selection, choose_schedule, stage_summary
from onnxplan.ir.graph import StepGraph
from onnxplan.plan_records import CheckpointRecord, CheckpointTry
from onnxplan.planning import PlanOptions, PlanOutcome

__all__ = ["plan_with_checkpoint"]


def _weigh_schedules(graph: StepGraph, base: PlanOptions, chain: Chain, candidates: list[Schedule],
                     times: TimeModel, budget: int | None) -> tuple[PlanOutcome, Schedule, str] | None:
    """Every candidate schedule planned with the recompute pass replaying it, priced and chosen
    by the one rule (budget.choice.choose: of those that fit, the fastest predicted within
    MARGIN, then the least peak; none fits: the least peak). None: no candidate."""
    planned = []
    for sched in candidates:
        runs = sched.executions(chain.length)
        code = encode(sched.ops, chain.length) if any(r > 1 for r in runs[1:]) else ""
        out = attempt(graph, replace(base, recompute=code))
        planned.append((weigh("recompute", out, budget, times), sched, code))
    if not planned:
        return None
    best = choose([c for c, _, _ in planned])
    return next((c.outcome, sched, code) for c, sched, code in planned if c is best)


def plan_with_checkpoint(graph: StepGraph, opts: PlanOptions, policy: str, costs: CostModel = FLOP_COSTS,
                         slots: int = DEFAULT_SLOTS) -> PlanOutcome:
    """Plan with the checkpoint `policy` under `opts.budget`: choose the schedule (stage
    times from `costs`), then plan the step with the recompute pass replaying it
    ("recompute:<schedule>" in the plan's passes), and record the choice in
    plan.checkpoint. A budget the plain plan meets needs no recomputation. The
    outcome may miss the budget (the caller weighs it)."""
    t0 = time.perf_counter()
    base = replace(opts, recompute="")
    plain = attempt(graph, base) if opts.budget is not None else None
    pre = step_before_inplace(graph, base)
    times, time_note = costs.times(pre, inplace=opts.inplace, order=opts.order)
    chain = build_chain(pre, times)
    if plain is not None and opts.budget is not None and plain.plan.peak_bytes <= opts.budget:
        sel = Selection(policy, Schedule(store_all(chain.length), policy), chain,
                        plain.plan.peak_bytes, notes=["the plain plan fits the budget: no recomputation"])
        candidates = []
    else:
        sel = choose_schedule(pre, chain, policy, opts.budget, inplace=opts.inplace, slots=slots,
                              order=opts.order)
        candidates = [sel.schedule]
        if opts.budget is not None:  # should the full planner disagree with the quick evaluation
            candidates += [s for s, p in sorted(sel.tried, key=lambda x: -x[1]) if p < (sel.planned_peak or 0)][:2]
    out, sched, code = _weigh_schedules(graph, base, chain, candidates, times, opts.budget) or (plain, sel.schedule, "")
    if out is None:  # no budget: one candidate at least
        raise RuntimeError(f"checkpoint {policy}: no schedule was planned")
    sim = simulate(chain.costs(), sched.ops)
    record = CheckpointRecord(
        policy=policy, budget_bytes=opts.budget, schedule=code, slots=slots,
        stages=stage_summary(chain, sched), time_source=chain.time_source,
        chain_time_seconds=sim.time, chain_model_peak_bytes=sim.peak,
        extra_forward_seconds=sim.time - sum(s.forward_seconds + s.backward_seconds for s in chain.stages),
        predicted_step_seconds=times.step_seconds(out.graph),
        predicted_step_seconds_without=times.step_seconds(pre),
        notes=(time_note, *sel.notes, *sched.notes), select_seconds=time.perf_counter() - t0,
        tried=tuple(CheckpointTry(encode(s.ops, chain.length), p, simulate(chain.costs(), s.ops).time)
                    for s, p in sel.tried),
    )
    out.plan = replace(out.plan, checkpoint=record)
    out.pass_notes = [*out.pass_notes, *(f"checkpoint: {n}" for n in record.notes)]
    return out
