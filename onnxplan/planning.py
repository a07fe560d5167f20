"""The planning pipeline: passes, an execution order, lifetimes, offsets, verification."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from onnxplan._version import __version__
from onnxplan.errors import BudgetError, ModelError, UsageError
from onnxplan.ir.graph import Node, StepGraph
from onnxplan.limits import DEFAULT_TIME_LIMIT  # the one default (re-exported: planning.DEFAULT_TIME_LIMIT)
from onnxplan.offsets import PLANNERS, Buffer, OffsetPlan, lower_bound, plan_offsets
from onnxplan.orders import memory_model, order_policy
from onnxplan.passes.lifetimes import lifetime_model, lifetimes
from onnxplan.passes.split import (
    OFF_PAGE_MIN,
    PIECE_ALIGN,
    SplitSpec,
    homed_slots,
    piece_ranges,
    row_chunks,
    slot_bytes,
    split_pass_name,
    split_records,
)
from onnxplan.pipeline import run_pipeline
from onnxplan.plan import Plan, PlannedBuffer
from onnxplan.plan_records import PlanSettings, SolverStats, SwapRecord
from onnxplan.sizes import format_bytes
from onnxplan.swap import SWAP_CHOICES, SwapOutcome, plan_swaps, swap_totals, verify_swaps
from onnxplan.verify import PlanError, verify_chunks, verify_offsets, verify_pieces, verify_row_chunks

__all__ = ["BudgetNotMet", "PlanOptions", "require_budget", "check_time_limit", "ilp_budget", "PlannerRow", "PlanOutcome", "pipeline_names", "plan_step",
           "planned_buffers", "verify_plan", "DEFAULT_TIME_LIMIT", "HEURISTIC_ORDERS", "ORDER_CHOICES", "PLANNER_CHOICES"]

HEURISTIC_ORDERS = ("given", "nntrainer", "greedy")
ORDER_CHOICES = ("auto", *HEURISTIC_ORDERS, "ilp")
PLANNER_CHOICES = ("auto", *PLANNERS)
HEURISTIC_PLANNERS = tuple(p for p in PLANNERS if p != "ilp")
# The anytime default (planner auto, no --time-limit): the offset ILP gets ILP_SECONDS_PER_GAP
# seconds per unit of fragmentation left by the best heuristic, times sqrt(buffers / 100), at most
# ILP_AUTO_MAX_SECONDS; below ILP_AUTO_MIN_SECONDS it cannot pay and is skipped.
ILP_SECONDS_PER_GAP = 25.0
ILP_AUTO_MAX_SECONDS = 1.0
ILP_AUTO_MIN_SECONDS = 0.2
ILP_AUTO_MAX_BUFFERS = 2000  # larger: building the model alone eats the budget


@dataclass(frozen=True)
class PlanOptions:
    """Fixed decisions for plan_step. Choosing them for a budget (which swap or checkpoint
    policy, which recompute schedule) is onnxplan.budget's."""

    order: str = "auto"  # auto = the heuristic order with the smallest lower bound
    planner: str = "auto"  # auto = every planner within the time limit, keep the smallest
    interleave: bool = True
    inplace: bool = True
    time_limit: float | None = None  # seconds for each ILP; None: the anytime default (ilp_budget)
    swap: str = "none"  # none | auto | on-demand | reduced | proactive | window (onnxplan.swap)
    lookahead: int = 1  # proactive: EOs a swap-in is issued ahead of its use
    window_bytes: int | None = None  # window: the byte window (default: largest working set)
    budget: int | None = None  # the peak must fit (else BudgetNotMet); swap: evict until it does
    recompute: str = ""  # a recompute schedule (chosen by onnxplan.budget; replayed by name)
    split_grad: bool = False  # split ConvGrad into its dW and dX halves (passes/split_grad.py)
    splits: tuple[SplitSpec, ...] = ()  # nodes split in chunks (passes/split.py; chosen by onnxplan.budget)
    swap_dir: str | None = None  # the folder the swap file will be in (run --swap-dir; None: the default):
    # transfers are priced with that store's rates (onnxplan.swap.pricing.store_rates)

    def __post_init__(self) -> None:
        check_time_limit(self.time_limit)

    @property
    def solver_seconds(self) -> float:
        """The limit of an ILP that runs because it was asked for: --time-limit, else 10 s."""
        return DEFAULT_TIME_LIMIT if self.time_limit is None else self.time_limit


def check_time_limit(seconds: float | None) -> float | None:
    """A solver time limit must be a positive finite number of seconds (UsageError, exit 2);
    None (not given) is the anytime default."""
    if seconds is None:
        return None
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


class BudgetNotMet(BudgetError):
    """plan_step planned the step but its peak misses opts.budget (exit 3); `outcome` is that
    plan, the least peak these fixed decisions reach."""

    def __init__(self, message: str, outcome: PlanOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass
class PlanOutcome:
    plan: Plan
    graph: StepGraph  # the rewritten graph the plan refers to
    rows: list[PlannerRow]
    orders: dict[str, int] = field(default_factory=dict)  # policy -> transient lower bound
    pass_notes: list[str] = field(default_factory=list)
    swap: SwapOutcome | None = None  # when swaps were planned
    skipped: list[str] = field(default_factory=list)  # what the anytime default did not run, and why
    stage_seconds: dict[str, float] = field(default_factory=dict)  # passes, orders, swap, planners, verify


def pipeline_names(opts: PlanOptions) -> list[str]:
    names = ["realize"]
    if opts.interleave:
        names.append("interleave")
    if opts.split_grad:  # before recompute: a recompute schedule indexes the graph it is made on
        names.append("split-grad")
    if opts.splits:  # before recompute and in-place: chunks are ordinary nodes to both
        names.append(split_pass_name(opts.splits))
    if opts.recompute:
        names.append(f"recompute:{opts.recompute}")
    names.append("inplace" if opts.inplace else "inplace-state")
    return names


def ilp_budget(gap: float, buffers: int) -> float:
    """Seconds the anytime default gives the offset ILP: more for a larger remaining gap
    (arena / lower bound - 1 of the best heuristic) and a larger graph, capped."""
    return min(ILP_AUTO_MAX_SECONDS, ILP_SECONDS_PER_GAP * gap * max(1.0, (buffers / 100) ** 0.5))


def _heuristic_orders(g: StepGraph, opts: PlanOptions) -> list[tuple]:
    """(policy, order, lifetimes, transient bound, OrderResult) per order policy to try,
    the smallest bound first (file order of HEURISTIC_ORDERS on ties)."""
    if opts.order not in ORDER_CHOICES:
        raise UsageError(f"unknown order {opts.order!r}; known: {', '.join(ORDER_CHOICES)}")
    policies = HEURISTIC_ORDERS if opts.order == "auto" else (opts.order,)
    model = lifetime_model(g)  # one memory model and one lifetime model for every policy
    mm = memory_model(g, model.roots)
    out = []
    for policy in policies:
        res = order_policy(g, mm, policy, time_limit=opts.solver_seconds)
        lt = lifetimes(g, res.order, model)
        out.append((policy, tuple(res.order), lt, lower_bound(lt.buffers), res))
    out.sort(key=lambda c: c[3])  # stable: ties keep HEURISTIC_ORDERS' order
    return out


def _run_planner(name: str, buffers, **kw) -> OffsetPlan:
    op = plan_offsets(name, buffers, **kw)
    verify_offsets(buffers, op)
    return op


def _row(name: str, op: OffsetPlan, persistent: int, bound: int) -> PlannerRow:
    return PlannerRow(name, op.arena_bytes, persistent + op.arena_bytes, persistent + bound,
                      op.arena_bytes / bound - 1.0 if bound else 0.0, op.solve_seconds, op.optimal, op.gap)


def _place(candidates: list[tuple], opts: PlanOptions, swapping: bool, skipped: list[str], ilp: bool = True):
    """Run the planners; returns (candidate, rows, plans, chosen planner name).

    Heuristic planners first, on the order of smallest bound; then on each other order
    whose bound is below the best arena so far (it may pack better). The ILP runs when
    asked for (--planner ilp, or --time-limit with planner auto); with planner auto and no
    --time-limit only when the best heuristic leaves a gap to its order's lower bound,
    for ilp_budget(gap, buffers) seconds. Every skip is recorded in `skipped`.
    """
    heuristics = list(HEURISTIC_PLANNERS) if opts.planner == "auto" else \
        [opts.planner] if opts.planner != "ilp" else []
    # (arena, candidate index, rows, plans)
    best: tuple[int, int, list[PlannerRow], dict[str, OffsetPlan]] | None = None
    for i, cand in enumerate(candidates if not swapping else candidates[:1]):
        policy, _, lt, bound, _ = cand
        if best is not None and bound >= best[0]:
            skipped.append(f"order {policy}: its lower bound {bound} B is not below the best arena "
                           f"{best[0]} B (order {candidates[best[1]][0]})")
            continue
        rows, plans = [], {}
        for name in heuristics:
            plans[name] = _run_planner(name, lt.buffers, time_limit=opts.solver_seconds)
            rows.append(_row(name, plans[name], lt.persistent_bytes, bound))
        arena = min((r.arena_bytes for r in rows), default=None)
        if best is None or (arena is not None and arena < best[0]):
            best = (arena if arena is not None else 1 << 62, i, rows, plans)
        if arena is None:
            break  # --planner ilp: the ILP places the first order only
    if best is None:
        raise RuntimeError("no order to place buffers on")
    _, i, rows, plans = best
    cand = candidates[i]
    _, _, lt, bound, _ = cand
    if ilp and opts.planner in ("auto", "ilp"):
        _maybe_ilp(lt, bound, opts, rows, plans, skipped)
    # Ties go to the planner run first (min keeps the first of equals), never to the faster solve:
    # a plan must not depend on the machine's load.
    chosen = min(rows, key=lambda r: r.arena_bytes).planner if rows else None
    return cand, rows, plans, chosen


def _maybe_ilp(lt, bound: int, opts: PlanOptions, rows: list, plans: dict, skipped: list[str]) -> None:
    seed = min((plans[n] for n in plans if n != "naive"), key=lambda p: p.arena_bytes, default=None)
    limit = opts.solver_seconds
    if opts.planner == "auto" and opts.time_limit is None:
        gap = seed.arena_bytes / bound - 1.0 if bound and seed is not None else 0.0
        nbuf = sum(1 for b in lt.buffers if b.nbytes)
        limit = ilp_budget(gap, nbuf)
        why = None
        if seed is None or seed.arena_bytes <= bound:
            why = f"{seed.planner if seed else 'the best heuristic'} reaches the lower bound (optimal for this order)"
        elif nbuf > ILP_AUTO_MAX_BUFFERS:
            why = f"{nbuf} buffers > {ILP_AUTO_MAX_BUFFERS}, gap {gap:.2%} (--planner ilp or --time-limit forces it)"
        elif limit < ILP_AUTO_MIN_SECONDS:
            why = (f"gap {gap:.2%} of {seed.planner} to the lower bound is too small to pay "
                   f"(budget {limit:.2f} s < {ILP_AUTO_MIN_SECONDS} s; --time-limit forces it)")
        if why is not None:
            skipped.append(f"planner ilp: {why}")
            return
    kw: dict[str, Any] = {"time_limit": limit}
    if seed is not None:
        kw["seed_plan"] = seed
    plans["ilp"] = _run_planner("ilp", lt.buffers, **kw)
    rows.append(_row("ilp", plans["ilp"], lt.persistent_bytes, bound))


def plan_step(graph: StepGraph, opts: PlanOptions = PlanOptions()) -> PlanOutcome:
    """Rewrite the step, order it, place every transient buffer; every plan is verified.
    With `opts.budget` the plan honours it or BudgetNotMet is raised (carrying the plan):
    only a swap policy works towards a budget here; choosing what to do for one is
    onnxplan.budget.plan_for_budget's."""
    if opts.planner not in PLANNER_CHOICES:
        raise UsageError(f"unknown planner {opts.planner!r}; known: {', '.join(PLANNER_CHOICES)}")
    t0 = time.perf_counter()
    names = pipeline_names(opts)
    g, results = run_pipeline(graph, names)
    notes = [note for _, r in results for note in r.notes]
    stages = {"passes": time.perf_counter() - t0}
    candidates = _heuristic_orders(g, opts)
    stages["orders"] = time.perf_counter() - t0 - sum(stages.values())
    bounds = {c[0]: c[3] for c in candidates}
    order_seconds = sum(c[4].solve_seconds for c in candidates)
    skipped: list[str] = []
    if opts.order == "auto":
        skipped.append("order ilp: auto uses the heuristic orders (--order ilp runs OLLA's lifetime ILP)")
    swap = None
    if opts.swap != "none":  # the swap nodes join the order the heuristic planners pack best
        first = _place(candidates, opts, False, [], ilp=False)[0]
        candidates = [first, *(c for c in candidates if c is not first)]
        policy, order, lt, _, _ = first
        swap = _plan_swaps(g, order, lt, opts)
        if swap is not None:  # swapped buffers split in segments
            g, order, lt = swap.graph, swap.order, swap.lifetimes
            notes.extend(swap.notes)
            candidates = [(policy, order, lt, lower_bound(lt.buffers), candidates[0][4])]
    stages["swap"] = time.perf_counter() - t0 - sum(stages.values())
    cand, rows, plans, chosen = _place(candidates, opts, swap is not None, skipped)
    stages["planners"] = time.perf_counter() - t0 - sum(stages.values())
    policy, order, lt, bound, order_res = cand
    op = plans[chosen]
    plan = Plan(
        model=graph.name,
        order=order,
        buffers=planned_buffers(lt.buffers, op),
        persistent_bytes=lt.persistent_bytes,
        arena_bytes=op.arena_bytes,
        lower_bound_bytes=lt.persistent_bytes + bound,
        planner=chosen,
        order_policy=policy,
        solve_seconds=time.perf_counter() - t0,
        passes=tuple(names),
        settings=PlanSettings(opts.interleave, opts.inplace, opts.time_limit, opts.split_grad),
        solver=SolverStats(order_seconds, order_res.optimal, order_res.gap, tuple(order_res.notes), tuple(skipped)),
        swap=_swap_record(swap, opts),
        swaps=swap.swaps if swap is not None else (),
        splits=split_records(g, names),
        pieces=piece_ranges(g),
        graph_fingerprint=graph.fingerprint(),
        onnxplan_version=__version__,
    )
    _check_model_reads(graph, g)
    verify_plan(g, plan)
    stages["verify"] = time.perf_counter() - t0 - sum(stages.values())
    outcome = PlanOutcome(plan, g, rows, bounds, notes, swap, skipped, stages)
    if opts.budget is not None and plan.peak_bytes > opts.budget:
        raise BudgetNotMet(budget_miss(outcome, opts.budget), outcome)
    return outcome


def budget_miss(outcome: PlanOutcome, budget: int) -> str:
    """The line for a plan that misses `budget`: the smallest peak reached and by what."""
    plan, sw = outcome.plan, outcome.swap
    head = (f"no plan reaches the budget {format_bytes(budget)}: smallest peak "
            f"{format_bytes(plan.peak_bytes)} ({plan.peak_bytes} B)")
    if sw is not None and sw.floor is not None:
        line = f"{head} even swapping everything ({sw.policy}); {sw.floor.describe()}"
        if sw.floor.bound <= budget:  # the floor allows the budget: the search stopped short of it
            line += "; the budget is above that floor, but no plan searched reaches it"
        return line
    return f"{head} by order {plan.order_policy} + planner {plan.planner}"


def require_budget(outcome: PlanOutcome, budget: int | None) -> None:
    """BudgetError (exit 3) naming the smallest peak when `outcome`'s plan misses `budget`
    (None: no budget). `plan` and `run` both end here: a plan that misses never runs."""
    if budget is not None and outcome.plan.peak_bytes > budget:
        raise BudgetError(budget_miss(outcome, budget))


def _plan_swaps(g: StepGraph, order, lt, opts: PlanOptions) -> SwapOutcome | None:
    if opts.swap not in SWAP_CHOICES:
        raise UsageError(f"unknown swap policy {opts.swap!r}; known: {', '.join(SWAP_CHOICES)}")
    return plan_swaps(g, order, lt, swap=opts.swap, budget=opts.budget, lookahead=opts.lookahead,
                      window_bytes=opts.window_bytes, planner=opts.planner, time_limit=opts.solver_seconds,
                      swap_dir=opts.swap_dir)


def _swap_record(swap: SwapOutcome | None, opts: PlanOptions) -> SwapRecord:
    if swap is None:
        return SwapRecord("none", opts.swap)
    from onnxplan.swap.pricing import store_rates

    store = store_rates(opts.swap_dir).record() if swap.swaps else None  # what its transfers are priced at
    return SwapRecord(requested=opts.swap, described=swap.policy, budget=opts.budget,
                      **swap.options, **swap_totals(swap.swaps), store=store)


def planned_buffers(buffers: tuple[Buffer, ...], op: OffsetPlan) -> tuple[PlannedBuffer, ...]:
    """The plan's buffer rows: each buffer at its offset in `op`, by first EO then name."""
    return tuple(PlannedBuffer(b.name, b.nbytes, b.vclass, b.first, b.last, op.offsets[b.name], b.aliases)
                 for b in sorted(buffers, key=lambda b: (b.first, b.name)))


def _unprovided_reads(graph: StepGraph) -> Iterator[tuple[Node, str]]:
    """(node, value) for every read of a value that is not persistent, not step data and made by no node."""
    made = set(graph.inputs) | {o for n in graph.nodes for o in n.outputs if o}
    for n in graph.nodes:
        for i in n.inputs:
            if i and i not in made and not graph.values[i].persistent:
                yield n, i


def _check_model_reads(source: StepGraph, graph: StepGraph) -> None:
    """ModelError (exit 2) when the step reads a value of the model itself (`source`, before the
    passes) that it never provides (e.g. a gradient accumulation buffer read without a reset
    flag). A value the passes made and left unprovided is the checker's (verify_plan: PlanError)."""
    for n, i in _unprovided_reads(graph):
        if i in source.values:
            raise ModelError(f"node {n.name!r} reads {i!r}, a value of the model that the step never provides "
                             "(not a parameter or optimizer state, not step data, made by no node)")


def _check_reads(graph: StepGraph) -> None:
    """PlanError unless every value a node reads is persistent, a step input or made by a node."""
    for n, i in _unprovided_reads(graph):
        raise PlanError(f"node {n.name!r} reads {i!r}, which is neither persistent, a step input, "
                        "nor made by a node")


def verify_plan(graph: StepGraph, plan: Plan) -> None:
    """Check a plan against its (rewritten) graph: lifetimes and merges re-derived from the
    order (the integrity rule), then no two live buffers share a byte, all inside the arena."""
    _check_reads(graph)
    lt = lifetimes(graph, plan.order)
    offsets = {b.name: b.offset for b in plan.buffers}
    verify_offsets(lt.buffers, OffsetPlan(plan.planner, offsets, plan.arena_bytes, 0.0))
    if plan.swaps:  # swap-ins bring back the current bytes; nothing reads a stale copy
        verify_swaps(graph, plan)
    if plan.pieces:  # piece ranges: none written twice, none read before it is written
        verify_pieces(plan.pieces, plan.order, slot_bytes(graph), PIECE_ALIGN, homed_slots(graph), OFF_PAGE_MIN)
    if plan.splits:  # every split node's K chunks, none left out
        verify_chunks(plan.splits, plan.order)
    chunks = row_chunks(graph)
    if chunks or plan.splits:  # a table's chunks partition its rows (every row written by one chunk)
        verify_row_chunks(chunks, plan.splits)
