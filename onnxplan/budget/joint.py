"""The joint solver (onnxplan.joint) as strategies of the budget layer: recompute on the whole
step graph and paging, chosen together by CP-SAT. Two are registered:

"joint-quick" (auto: fit_budget plans it by default, one more candidate under the one price and
tie rule): plan_joint with paging, every CP-SAT solve stopped by a deterministic limit
(QUICK_DETERMINISTIC, one worker, seed 0), QUICK_ROUNDS rounds, its greedy paging warm start
bounded by QUICK_PAGE_TRIALS schedules, so the same request gives
the same plan on a loaded or an idle machine; skipped (StrategySkipped, fit_budget notes it)
on a graph over QUICK_MAX_NODES nodes, where its solve would no longer take a few seconds.

"joint" (opt-in, `--strategy joint`): a minute of wall clock (JOINT_SECONDS) per budget.

The strategy never returns a plan predicted slower than one it could have chosen: it also plans
the joint model without paging, rotor's schedule (the "recompute" strategy) and the swap
module's policy (the "swap" strategy), prices every placed plan on one footing
(budget.decide.price: the profile's node times, transfers on one I/O worker at the swap
store's measured bandwidth) and returns the one budget.decide.choose keeps (its one tie rule;
plan.joint.chosen and .candidates say which won and what was weighed).
All of it within JOINT_SECONDS per budget.

Importing this module also registers the joint recompute code ("dag.") with the recompute pass
(onnxplan.joint.lower), so any process that imports onnxplan replays joint plans."""

from __future__ import annotations

import time
from dataclasses import replace

from onnxplan.budget import decide
from onnxplan.budget.attempt import step_before_inplace
from onnxplan.budget.costs import CostModel
from onnxplan.budget.strategies import STRATEGIES, StrategySkipped, register_strategy
from onnxplan.ir.graph import StepGraph
from onnxplan.joint import plan_joint
from onnxplan.joint.fit import MIN_ROUND_SECONDS
from onnxplan.plan_records import JointRecord
from onnxplan.planning import DEFAULT_TIME_LIMIT, PlanOptions, PlanOutcome
from onnxplan.sizes import format_bytes
from onnxplan.swap.pricing import store_rates

__all__ = ["JOINT_SECONDS", "QUICK_DETERMINISTIC", "QUICK_MAX_NODES", "QUICK_ROUNDS", "plan_joint_quick",
           "plan_joint_strategy"]

JOINT_SECONDS = 60.0  # everything the joint strategy solves for one budget (CP-SAT rounds, descents, variants)
PAGING_SHARE = 0.5  # of the total, the joint model with paging gets this share
RECOMPUTE_SHARE = 0.75  # of what is then left (rotor and swap planned), the model without paging gets this share
# (the rest: placement, rotor's schedule and swap on top after the last round, outside CP-SAT's limits)


QUICK_DETERMINISTIC = 0.5  # CP-SAT's deterministic time per solve of joint-quick (one worker: ~1 s of wall here)
QUICK_ROUNDS = 2  # joint-quick's solve rounds (a miss lowers the model's budget; slack raises it once)
QUICK_MAX_NODES = 400  # joint-quick declines larger graphs: ResNet-50 (552 nodes), MobileNet-v2 (787), GPT-2, BERT
QUICK_PAGE_TRIALS = 100  # schedules each greedy paging warm start of joint-quick tries at most (resnet18: 11 s -> 3 s)
QUICK_WALL_SECONDS = 60.0  # joint-quick's wall-clock safety net per CP-SAT solve (never reached at QUICK_MAX_NODES)


@register_strategy("joint-quick")
def plan_joint_quick(graph: StepGraph, budget: int, costs: CostModel, time_limit: float | None,
                     base: PlanOptions) -> PlanOutcome:
    """plan_joint with paging at the swap store's rates (as the "joint" strategy's first
    candidate), stopped by deterministic limits only (the module docstring): node times from
    `costs`; `time_limit` is not used (the deterministic limit is the limit). Raises
    StrategySkipped on a graph over QUICK_MAX_NODES nodes."""
    if len(graph.nodes) > QUICK_MAX_NODES:
        raise StrategySkipped(f"{len(graph.nodes)} nodes > {QUICK_MAX_NODES}, its deterministic solve would take "
                              "more than a few seconds (--strategy joint plans it on a wall-clock limit)")
    times, _ = costs.times(step_before_inplace(graph, base), inplace=base.inplace, order=base.order)
    rates = store_rates(base.swap_dir)
    out, _ = plan_joint(graph, budget, base, costs=times.measured or None, swap_bandwidth=rates.bandwidth,
                        time_limit=QUICK_WALL_SECONDS, rounds=QUICK_ROUNDS, deterministic_limit=QUICK_DETERMINISTIC,
                        io_cpu_per_byte=rates.cpu_per_byte, page_trials=QUICK_PAGE_TRIALS)
    return _with_store(out, rates)


@register_strategy("joint", auto=False)
def plan_joint_strategy(graph: StepGraph, budget: int, costs: CostModel, time_limit: float | None,
                        base: PlanOptions, *, total_seconds: float = JOINT_SECONDS,
                        rates=None, seen: dict[str, PlanOutcome] | None = None) -> PlanOutcome:
    """The plan under `budget` budget.decide.choose keeps among: plan_joint with paging (at the swap
    store's measured rates, onnxplan.swap.pricing.store_rates, or `rates`), plan_joint without
    paging, and the budget layer's "recompute" and "swap" strategies; node times from `costs`
    (a profile, or the FLOP estimate). CP-SAT gets `time_limit` seconds per round at most (None:
    10); the joint solves together stop by `total_seconds` after the call starts (best so far).
    `seen`: filled with every candidate's outcome by name (benchmarks measure them all)."""
    t_end = time.perf_counter() + total_seconds
    times, note = costs.times(step_before_inplace(graph, base), inplace=base.inplace, order=base.order)
    limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    rates = rates or store_rates(base.swap_dir)
    node_costs = times.measured or None
    cands: list[tuple[str, PlanOutcome]] = []
    paged, _ = plan_joint(graph, budget, base, costs=node_costs, swap_bandwidth=rates.bandwidth, time_limit=limit,
                          total_seconds=max(MIN_ROUND_SECONDS, _left(t_end) * PAGING_SHARE),
                          io_cpu_per_byte=rates.cpu_per_byte)
    cands.append(("joint", paged))
    paged_record = paged.plan.joint
    if paged_record is None:
        raise RuntimeError("plan_joint gave a plan without its joint record")
    if paged_record.status != "PLAIN":  # the plain plan fits: nothing is faster
        for name in ("recompute", "swap"):
            cands.append((name, STRATEGIES[name](graph, budget, costs, time_limit, base)))
        if _left(t_end) * RECOMPUTE_SHARE >= MIN_ROUND_SECONDS:
            alone, _ = plan_joint(graph, budget, base, costs=node_costs, swap_bandwidth=None, time_limit=limit,
                                  swap_on_top=False, total_seconds=_left(t_end) * RECOMPUTE_SHARE)
            cands.append(("joint-recompute", alone))
    if seen is not None:
        seen.update((name, out) for name, out in cands)
    weighed = [decide.weigh(name, out, budget, times, rates) for name, out in cands]
    best = decide.choose(weighed)
    name, out, secs = best.name, best.outcome, best.seconds
    why = (f"{name} chosen: predicted {secs * 1e3:.2f} ms, peak {format_bytes(out.plan.peak_bytes)} for budget "
           f"{format_bytes(budget)} (weighed: " + ", ".join(
               f"{c.name} {c.seconds * 1e3:.2f} ms" + ("" if c.fits else " misses") for c in weighed) + ")")
    record = out.plan.joint if out.plan.joint is not None else _borrowed(paged_record, out, name)
    record = replace(record, time_source=note, chosen=name, candidates=tuple(c.record() for c in weighed),
                     predicted_step_seconds=secs, notes=(*record.notes, why))
    out.plan = replace(out.plan, joint=record)
    return _with_store(out, rates)


def _with_store(out: PlanOutcome, rates) -> PlanOutcome:
    """`out` with the store `rates` recorded where its plan swaps and records none (the joint
    schedule's page-ins: priced at the rates they were solved with)."""
    if out.plan.swaps and out.plan.swap.store is None:
        out.plan = replace(out.plan, swap=replace(out.plan.swap, store=rates.record()))
    return out


def _borrowed(joint: JointRecord, out: PlanOutcome, name: str) -> JointRecord:
    """A joint record for a plan of another strategy (rotor's, the swap module's) that won: its
    own recompute schedule (what the recompute pass replays), the joint solve's rounds kept."""
    code = next((p.partition(":")[2] for p in out.plan.passes if p.startswith("recompute:")), "")
    return JointRecord(schedule=code, budget_bytes=joint.budget_bytes, status=f"{name.upper()}-STRATEGY",
                       gap=None, estimate_bytes=joint.estimate_bytes, placed_peak_bytes=out.plan.peak_bytes,
                       swap_bandwidth=joint.swap_bandwidth, stages=joint.stages, order_policy=joint.order_policy,
                       rounds=joint.rounds,
                       notes=((f"the {name!r} strategy's plan wins over the joint schedule (budget.decide.choose: "
                               f"predicted faster, or within the tie margin and first in its preference) "
                               f"({joint.status}, {joint.recomputations} recomputations, placed peak "
                               f"{format_bytes(joint.placed_peak_bytes)})"),))


def _left(t_end: float) -> float:
    return max(0.0, t_end - time.perf_counter())
