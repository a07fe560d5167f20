"""Plan a step with the joint solver: solve, lower, order and place with the existing planners, and
re-solve with a tightened budget when the placed peak misses it."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from onnxplan.checkpoint.costs import TimeModel
from onnxplan.ir.graph import StepGraph
from onnxplan.joint.evaluate import memory, step_seconds, violations
from onnxplan.joint.hints import keep_all, rotor_hint
from onnxplan.joint.lower import lower_swaps
from onnxplan.joint.problem import build_problem
from onnxplan.joint.solve import MIN_SOLVE_SECONDS, JointSchedule, schedule_summary, solve_problem
from onnxplan.limits import DEFAULT_TIME_LIMIT
from onnxplan.offsets.buffers import ALIGNMENT
from onnxplan.pipeline import run_pipeline
from onnxplan.plan_records import JointBuffer, JointRecord
from onnxplan.planning import (
    BudgetNotMet,
    PlanOptions,
    PlanOutcome,
    pipeline_names,
    plan_step,
)
from onnxplan.swap.pricing import StoreRates, price_outcome

__all__ = ["SLACK_FRACTION", "given_schedule", "plain_schedule", "plan_joint"]

SLACK_FRACTION = 0.005  # placed this far below the budget (a fraction of it), the model gets the slack
MIN_ROUND_SECONDS = 2.0  # under a deadline, no further round starts with less time left
ROUND_SHARE = 0.6  # under a deadline, a round's CP-SAT gets at most this share of what is left (placement, rotor, swap follow)


def plan_joint(graph: StepGraph, budget: int, opts: PlanOptions | None = None, *,
               costs: Mapping[str, float] | None = None, swap_bandwidth: float | None = None,
               time_limit: float = DEFAULT_TIME_LIMIT, rounds: int = 3, policy: str = "nntrainer", warm_start="auto",
               swap_on_top: bool = True, deterministic_limit: float | None = None,
               total_seconds: float | None = None, io_cpu_per_byte: float = 0.0,
               page_trials: int | None = None) -> tuple[PlanOutcome, JointSchedule]:
    """(PlanOutcome, schedule) for `graph` (as loaded) under `budget` bytes: the joint schedule's
    recomputations replayed by the recompute pass ("recompute:dag...." in the plan's passes),
    ordered, placed and verified by plan_step with `opts` (its order, planner, passes; its
    swap, recompute and budget are ignored), then its page-ins inserted as swap nodes on that
    order (plan.swaps) and placed again. `costs`: seconds per node name (a profile; None: the
    FLOP estimate). `swap_bandwidth`: bytes/s of the swap store (None: recompute only). When
    the placed peak misses the budget, the model's budget is lowered by the miss and solved
    again, at most `rounds` solves in all; the best round is kept. Should it still miss (the
    model pages activations only; parameters and optimizer state stay resident), `swap_on_top`
    plans the swap module's `auto` policy on top of the schedule's recomputations (replacing
    its page-ins) when that lowers the peak. `total_seconds`: a deadline for all the rounds
    together (each CP-SAT round gets at most `time_limit` and what is left of it; no round
    starts with less than MIN_ROUND_SECONDS left): the best so far is returned when it hits.
    `io_cpu_per_byte`: the I/O thread's CPU per byte moved (the store's measured rates), priced
    as onnxplan.swap.pricing prices it. `deterministic_limit`, `page_trials`: solve_problem's.
    The outcome may miss the budget; the rounds (each with its CP-SAT limits), the model's
    estimate, the placed peak and what was done per buffer are in plan.joint."""
    t_end = None if total_seconds is None else time.perf_counter() + total_seconds
    base = replace(opts or PlanOptions(), swap="none", recompute="", budget=None)
    names = [n for n in pipeline_names(base) if n not in ("inplace", "inplace-state")]
    pre, _ = run_pipeline(graph, names)
    prob = build_problem(pre, costs, policy=policy, swap_min_bytes=1024 if swap_bandwidth else None,
                         swap_bandwidth=swap_bandwidth, io_cpu_per_byte=io_cpu_per_byte)
    plain = plan_step(graph, base)
    if plain.plan.peak_bytes <= budget:  # nothing to decide (the model's fixed order may over-count it)
        sched = plain_schedule(prob, budget, swap_bandwidth)
        history = [_round(budget, sched, plain.plan.peak_bytes, gap=0.0, warm_start="none", recompute_seconds=0.0)]
        return _recorded(plain, sched, prob, budget, sched.predicted_seconds, history, "", costs,
                         swap_bandwidth), sched
    best, history = _rounds(graph, base, prob, budget, swap_bandwidth, costs, time_limit, rounds, warm_start,
                            (deterministic_limit, page_trials), t_end, total_seconds)
    best = _rotor_fallback(graph, base, prob, budget, swap_bandwidth, costs, best, history)
    _, out, sched = best
    rest, predicted = "", sched.predicted_seconds
    if out.plan.peak_bytes > budget and swap_on_top:  # the swap module evicts the rest (parameters, state)
        out, sched, predicted, rest = _swap_on_top(graph, base, prob, budget, swap_bandwidth, costs,
                                                   io_cpu_per_byte, out, sched)
    return _recorded(out, sched, prob, budget, predicted, history, rest, costs, swap_bandwidth), sched


def _round(target: int, sched: JointSchedule, placed: int, **fields) -> dict:
    """One entry of plan.joint.rounds (JointRecord.rounds)."""
    return {"model_budget_bytes": target, "estimate_bytes": sched.estimate_bytes, "placed_peak_bytes": placed,
            "status": sched.status, "gap": fields.pop("gap"), "solve_seconds": fields.pop("solve_seconds", 0.0),
            "warm_start": fields.pop("warm_start"), "recompute_seconds": fields.pop("recompute_seconds"),
            "stall_seconds": fields.pop("stall_seconds", 0.0), "page_ins": fields.pop("page_ins", 0),
            "page_ins_not_lowered": fields.pop("page_ins_not_lowered", []), **fields}


def _rounds(graph: StepGraph, base: PlanOptions, prob, budget: int, swap_bandwidth: float | None, costs,
            time_limit: float, rounds: int, warm_start, work: tuple[float | None, int | None], t_end: float | None,
            total_seconds: float | None) -> tuple[tuple, list[dict]]:
    """The solve rounds: solved, placed; a miss lowers the model's budget by it, slack raises it
    once. Returns (best: (key, outcome, schedule), the rounds' history); key (misses the
    budget, predicted seconds if it fits else the placed peak), least first. `work`:
    (deterministic_limit, page_trials) of each solve (solve_problem)."""
    target, hint = budget, warm_start
    history: list[dict[str, Any]] = []
    best: tuple[tuple[bool, float], PlanOutcome, JointSchedule] | None = None
    for k in range(max(1, rounds)):
        left = float("inf") if t_end is None else t_end - time.perf_counter()
        if k and left < MIN_ROUND_SECONDS:
            history[-1]["stopped"] = f"deadline: {max(0.0, left):.1f} s left of {total_seconds:.0f} s"
            break
        limit = min(time_limit, max(MIN_SOLVE_SECONDS, ROUND_SHARE * left))
        sched = solve_problem(prob, target, swap_bandwidth, limit, hint, costs=costs, deterministic_limit=work[0],
                              page_trials=work[1])
        out = plan_step(graph, replace(base, recompute=sched.code))
        out, missed = lower_swaps(out, sched, base.planner)
        history.append(_round(target, sched, out.plan.peak_bytes, gap=_finite(sched.gap),
                              solve_seconds=sched.wall_seconds, warm_start=sched.warm_start,
                              recompute_seconds=sched.recompute_seconds, stall_seconds=sched.stall_seconds,
                              page_ins=len(sched.decisions.page_in), page_ins_not_lowered=missed,
                              time_limit=limit, cpsat_limits=list(sched.cpsat_limits)))
        key = (out.plan.peak_bytes > budget, sched.predicted_seconds if out.plan.peak_bytes <= budget
               else out.plan.peak_bytes)
        if best is None or key < best[0]:
            best = (key, out, sched)
        slack = budget - out.plan.peak_bytes
        if slack >= 0:
            # the model's fixed order over-counts what the planners place: give the model the
            # slack and solve again (a cheaper schedule may fit), once, while it costs time
            if k or slack < SLACK_FRACTION * budget or not sched.predicted_seconds > prob.step_seconds \
                    or not sched.fits:
                break
            target = max(target, sched.estimate_bytes) + slack
            hint = sched.decisions
            continue
        if not sched.fits:
            break
        target = min(target, sched.estimate_bytes) - (out.plan.peak_bytes - budget) - ALIGNMENT
        hint = "auto"
    if best is None:  # the first round always solves
        raise RuntimeError("joint: no round was solved")
    return best, history


def _rotor_fallback(graph: StepGraph, base: PlanOptions, prob, budget: int, swap_bandwidth: float | None, costs,
                    best: tuple, history: list[dict]) -> tuple:
    """rotor's chain schedule, lowered as is, where the rounds found nothing faster that fits
    (CP-SAT's best-so-far can be far from it on a large DAG: DenseNet, 5,560 booleans)."""
    rotor = rotor_hint(prob, budget, costs)
    if rotor is None or violations(prob, rotor):
        return best
    cand = given_schedule(prob, rotor, budget, swap_bandwidth, "rotor's chain schedule (no faster round fits)",
                          "ROTOR")
    if best[0][0] or cand.predicted_seconds < best[0][1]:
        out_r = plan_step(graph, replace(base, recompute=cand.code))
        if out_r.plan.peak_bytes <= budget:
            history.append(_round(budget, cand, out_r.plan.peak_bytes, gap=None, warm_start="rotor",
                                  recompute_seconds=cand.recompute_seconds))
            return ((False, cand.predicted_seconds), out_r, cand)
    return best


def _swap_on_top(graph: StepGraph, base: PlanOptions, prob, budget: int, swap_bandwidth: float | None, costs,
                 io_cpu_per_byte: float, out: PlanOutcome, sched: JointSchedule):
    """The swap module's auto policy on top of the schedule's recomputations, and with none
    (below the model's floor its least-memory recomputations can cost more than swapping
    alone): the faster that fits, where it lowers the peak. Returns (outcome, schedule,
    predicted seconds, a note; '' when nothing changed)."""
    tries = []
    alone = given_schedule(prob, keep_all(prob), budget, swap_bandwidth, "nothing recomputed: swap auto alone",
                           "SWAP-ONLY")
    for base_sched in [sched] + ([alone] if sched.code else []):
        try:
            more = plan_step(graph, replace(base, recompute=base_sched.code, swap="auto", budget=budget))
        except BudgetNotMet as miss:
            more = miss.outcome
        secs = price_outcome(more, TimeModel(measured=dict(costs or {})),
                             StoreRates(swap_bandwidth, io_cpu_per_byte) if swap_bandwidth else None).seconds
        tries.append((more.plan.peak_bytes > budget, secs if more.plan.peak_bytes <= budget
                      else more.plan.peak_bytes, more, base_sched, secs))
    _, _, more, base_sched, secs = min(tries, key=lambda x: x[:2])
    if more.plan.peak_bytes >= out.plan.peak_bytes:
        return out, sched, sched.predicted_seconds, ""
    rest = (f"{'the joint schedule' + chr(39) + 's recomputations' if base_sched.code else 'no recomputation'}, "
            f"then swap auto for the rest: {len(more.plan.swaps)} swaps ({more.plan.swap.described})")
    return more, base_sched, secs, rest  # transfers at the swap module's estimate


def plain_schedule(prob, budget: int, swap_bandwidth: float | None) -> JointSchedule:
    """The schedule of no recomputation and no paging (every buffer kept), as the solver reports one."""
    return given_schedule(prob, keep_all(prob), budget, swap_bandwidth,
                          "the plain plan fits the budget: nothing recomputed or paged", "PLAIN")


def given_schedule(prob, d, budget: int, swap_bandwidth: float | None, note: str,
                   status: str = "GIVEN") -> JointSchedule:
    """Decisions `d` reported as the solver reports a schedule (no solve: gap 0 only for PLAIN)."""
    secs, rec, stall = step_seconds(prob, d, swap_bandwidth)
    return JointSchedule(prob, d, budget, memory(prob, d)[0], secs, rec, stall, status,
                         0.0 if status == "PLAIN" else float("inf"), 0.0, status.lower(), swap_bandwidth, [note])


def _recorded(out: PlanOutcome, sched: JointSchedule, prob, budget: int, predicted: float, history: list,
              rest: str, costs, swap_bandwidth) -> PlanOutcome:
    """`out` with its plan's joint record."""
    record = JointRecord(
        schedule=sched.code, budget_bytes=budget, status=sched.status, gap=_finite(sched.gap),
        estimate_bytes=sched.estimate_bytes, placed_peak_bytes=out.plan.peak_bytes,
        predicted_step_seconds=predicted, recompute_seconds=sched.recompute_seconds,
        stall_seconds=sched.stall_seconds, swap_bandwidth=swap_bandwidth,
        time_source="profile" if costs else "flops", stages=prob.stages, order_policy=prob.policy,
        recomputations=len(sched.decisions.recompute), rounds=tuple(history),
        notes=(*sched.notes, *([rest] if rest else [])),
        buffers=tuple(JointBuffer(r["buffer"], r["bytes"], tuple(r["kept_into"]), tuple(r["recomputed_in"]),
                                  r["recomputed_by"], r["paged_out"], tuple(r["paged_in_for"]), tuple(r["anchors"]),
                                  r["extra_seconds"])
                      for r in schedule_summary(sched) if r["recomputed_in"] or r["paged_out"]))
    out.plan = replace(out.plan, joint=record)
    return out


def _finite(x: float) -> float | None:
    """A gap as JSON has it: None where there is no bound (inf)."""
    return x if math.isfinite(x) else None
