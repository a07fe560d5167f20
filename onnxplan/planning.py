"""The planning pipeline: passes, an execution order, lifetimes, offsets, verification."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from onnxplan import __version__
from onnxplan.errors import UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.offsets import PLANNERS, Buffer, OffsetPlan, lower_bound, plan_offsets
from onnxplan.passes import inplace as _inplace  # noqa: F401
from onnxplan.passes import interleave as _interleave  # noqa: F401
from onnxplan.passes import realize as _realize  # noqa: F401  (registers the passes)
from onnxplan.checkpoint import recompute as _recompute  # noqa: F401, I001  (registers "recompute:<schedule>")
from onnxplan.passes._infra import run_pipeline
from onnxplan.passes.lifetimes import lifetimes
from onnxplan.plan import Plan, PlannedBuffer
from onnxplan.verify import verify_offsets

__all__ = ["PlanOptions", "check_time_limit", "PlannerRow", "PlanOutcome", "pipeline_names", "plan_step", "verify_plan",
           "HEURISTIC_ORDERS", "ORDER_CHOICES", "PLANNER_CHOICES"]

HEURISTIC_ORDERS = ("given", "nntrainer", "greedy")
ORDER_CHOICES = ("auto", *HEURISTIC_ORDERS, "ilp")
PLANNER_CHOICES = ("auto", *PLANNERS)


@dataclass(frozen=True)
class PlanOptions:
    order: str = "auto"  # auto = the heuristic order with the smallest lower bound
    planner: str = "auto"  # auto = every planner within the time limit, keep the smallest
    interleave: bool = True
    inplace: bool = True
    time_limit: float = 10.0  # seconds for each ILP
    swap: str = "none"  # none | auto | on-demand | reduced | proactive | window (onnxplan.swap)
    lookahead: int = 1  # proactive: EOs a swap-in is issued ahead of its use
    window_bytes: int | None = None  # window: the byte window (default: largest working set)
    budget: int | None = None  # swap: evict until the peak fits (None: swap all the policy can)
    checkpoint: str = "none"  # none | sqrt | chen | rotor (onnxplan.checkpoint): what to recompute
    slots: int = 500  # rotor: memory slots of its dynamic program
    recompute: str = ""  # a chosen recompute schedule (set by onnxplan.checkpoint; replayed by name)
    profile: bool = False  # checkpoint: time stages by a short run of our kernels (else FLOPs)
    device: str = "cpu"  # where the step will run (cpu | cuda): the profile times our kernels there

    def __post_init__(self) -> None:
        check_time_limit(self.time_limit)


def check_time_limit(seconds: float) -> float:
    """A solver time limit must be a positive finite number of seconds (UsageError, exit 2)."""
    import math

    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"invalid --time-limit {seconds}: must be a positive number of seconds")
    return seconds


@dataclass(frozen=True)
class PlannerRow:
    planner: str
    arena_bytes: int
    peak_bytes: int
    lower_bound_bytes: int
    fragmentation: float
    solve_seconds: float
    optimal: bool | None = None
    gap: float | None = None


@dataclass
class PlanOutcome:
    plan: Plan
    graph: StepGraph  # the rewritten graph the plan refers to
    rows: list[PlannerRow]
    orders: dict[str, int] = field(default_factory=dict)  # policy -> transient lower bound
    pass_notes: list[str] = field(default_factory=list)
    swap: Any = None  # onnxplan.swap.SwapOutcome when swaps were planned


def pipeline_names(opts: PlanOptions) -> list[str]:
    names = ["realize"]
    if opts.interleave:
        names.append("interleave")
    if opts.recompute:
        names.append(f"recompute:{opts.recompute}")
    names.append("inplace" if opts.inplace else "inplace-state")
    return names


def _choose_order(g: StepGraph, opts: PlanOptions):
    from onnxplan.orders import order_nodes
    from onnxplan.passes.analysis import alias_roots

    buffer_of = alias_roots(g)
    policies = HEURISTIC_ORDERS if opts.order == "auto" else (opts.order,)
    if opts.order not in ORDER_CHOICES:
        raise UsageError(f"unknown order {opts.order!r}; known: {', '.join(ORDER_CHOICES)}")
    best = None
    bounds: dict[str, int] = {}
    spent = 0.0
    for policy in policies:
        res = order_nodes(g, policy, buffer_of=buffer_of, time_limit=opts.time_limit)
        spent += res.solve_seconds
        lt = lifetimes(g, res.order)
        bounds[policy] = lower_bound(lt.buffers)
        if best is None or bounds[policy] < best[3]:
            best = (policy, tuple(res.order), lt, bounds[policy], res)
    policy, order, lt, _, res = best
    return policy, order, lt, bounds, spent, res


def plan_step(graph: StepGraph, opts: PlanOptions = PlanOptions()) -> PlanOutcome:
    """Rewrite the step, order it, place every transient buffer; every plan is verified."""
    if opts.planner not in PLANNER_CHOICES:
        raise UsageError(f"unknown planner {opts.planner!r}; known: {', '.join(PLANNER_CHOICES)}")
    if opts.checkpoint != "none" and not opts.recompute:
        from onnxplan.checkpoint.select import plan_with_checkpoint

        return plan_with_checkpoint(graph, opts)  # chooses the schedule, then plans with it
    t0 = time.perf_counter()
    names = pipeline_names(opts)
    g, results = run_pipeline(graph, names)
    notes = [note for _, r in results for note in r.notes]
    policy, order, lt, bounds, order_seconds, order_res = _choose_order(g, opts)
    swap = _plan_swaps(g, order, lt, opts)
    if swap is not None:  # the swap nodes join the order; swapped buffers split in segments
        g, order, lt = swap.graph, swap.order, swap.lifetimes
        notes.extend(swap.notes)
    bound = lower_bound(lt.buffers)
    planners = list(PLANNERS) if opts.planner == "auto" else [opts.planner]
    rows, plans = [], {}
    seed: OffsetPlan | None = None
    for name in planners:
        kw = {"time_limit": opts.time_limit}
        if name == "ilp" and seed is not None:
            kw["seed_plan"] = seed
        op = plan_offsets(name, lt.buffers, **kw)
        verify_offsets(lt.buffers, op)
        plans[name] = op
        if name != "naive" and name != "ilp" and (seed is None or op.arena_bytes < seed.arena_bytes):
            seed = op
        rows.append(PlannerRow(name, op.arena_bytes, lt.persistent_bytes + op.arena_bytes,
                               lt.persistent_bytes + bound,
                               op.arena_bytes / bound - 1.0 if bound else 0.0,
                               op.solve_seconds, op.optimal, op.gap))
    chosen = min(rows, key=lambda r: (r.arena_bytes, r.solve_seconds)).planner
    op = plans[chosen]
    plan = Plan(
        model=graph.name,
        order=order,
        buffers=_planned(lt.buffers, op),
        persistent_bytes=lt.persistent_bytes,
        arena_bytes=op.arena_bytes,
        lower_bound_bytes=lt.persistent_bytes + bound,
        planner=chosen,
        order_policy=policy,
        solve_seconds=time.perf_counter() - t0,
        passes=tuple(names),
        options={"interleave": opts.interleave, "inplace": opts.inplace, "time_limit": opts.time_limit,
                 "order_seconds": order_seconds, "order_optimal": order_res.optimal,
                 "order_gap": order_res.gap, "order_notes": list(order_res.notes),
                 "swap": _swap_options(swap, opts)},
        swaps=swap.swaps if swap is not None else (),
        graph_fingerprint=graph.fingerprint(),
        onnxplan_version=__version__,
    )
    verify_plan(g, plan)
    return PlanOutcome(plan, g, rows, bounds, notes, swap)


def _plan_swaps(g: StepGraph, order, lt, opts: PlanOptions):
    from onnxplan.swap import SWAP_CHOICES, plan_swaps

    if opts.swap not in SWAP_CHOICES:
        raise UsageError(f"unknown swap policy {opts.swap!r}; known: {', '.join(SWAP_CHOICES)}")
    return plan_swaps(g, order, lt, swap=opts.swap, budget=opts.budget, lookahead=opts.lookahead,
                      window_bytes=opts.window_bytes, planner=opts.planner, time_limit=opts.time_limit)


def _swap_options(swap, opts: PlanOptions) -> dict[str, Any]:
    if swap is None:
        return {"policy": "none", "requested": opts.swap}
    from onnxplan.swap import swap_totals

    return {**swap.options, "requested": opts.swap, "described": swap.policy, "budget": opts.budget,
            **swap_totals(swap.swaps)}


def _planned(buffers: tuple[Buffer, ...], op: OffsetPlan) -> tuple[PlannedBuffer, ...]:
    return tuple(PlannedBuffer(b.name, b.nbytes, b.vclass, b.first, b.last, op.offsets[b.name], b.aliases)
                 for b in sorted(buffers, key=lambda b: (b.first, b.name)))


def verify_plan(graph: StepGraph, plan: Plan) -> None:
    """Check a plan against its (rewritten) graph: lifetimes and merges re-derived from the
    order (the integrity rule), then no two live buffers share a byte, all inside the arena."""
    lt = lifetimes(graph, plan.order)
    offsets = {b.name: b.offset for b in plan.buffers}
    verify_offsets(lt.buffers, OffsetPlan(plan.planner, offsets, plan.arena_bytes, 0.0))
    if plan.swaps:  # swap-ins bring back the current bytes; nothing reads a stale copy
        from onnxplan.swap.verify import verify_swaps

        verify_swaps(graph, plan)
