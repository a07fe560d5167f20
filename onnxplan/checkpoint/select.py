"""Choose a schedule with a named policy for a chain, within a memory limit (planning the rewritten
step with it is onnxplan.budget's)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from onnxplan.checkpoint.chain import Chain
from onnxplan.checkpoint.chen import chen_candidates
from onnxplan.checkpoint.recompute import apply_schedule
from onnxplan.checkpoint.rotor import DEFAULT_SLOTS, rotor_schedule, rotor_table_for_chain
from onnxplan.checkpoint.schedule import FALL, FCK, FNONE, Op, Schedule, simulate, store_all
from onnxplan.checkpoint.sqrt import sqrt_schedule
from onnxplan.errors import UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.json_models import typed_items
from onnxplan.offsets import lower_bound, plan_offsets
from onnxplan.orders import order_nodes
from onnxplan.passes.inplace import inplace, inplace_state
from onnxplan.passes.lifetimes import lifetimes
from onnxplan.plan_records import CheckpointStage
from onnxplan.step_analysis import step_analysis

__all__ = [
    "CHECKPOINT_POLICIES",
    "PeakEvaluator",
    "Selection",
    "choose_schedule",
    "stage_summary",
]

CHECKPOINT_POLICIES = ("none", "sqrt", "chen", "rotor")
_MODE = {FALL: "keep all", FCK: "keep input", FNONE: "keep nothing"}


@dataclass
class Selection:
    """The chosen schedule, the ones tried (by planned peak), and what was decided why."""

    policy: str
    schedule: Schedule
    chain: Chain
    planned_peak: int | None = None  # by the quick evaluation (best-fit, file order)
    tried: list[tuple[Schedule, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    solve_seconds: float = 0.0


class PeakEvaluator:
    """Planned peak of a schedule, quickly, the way plan_step will plan it: rewrite, the
    in-place pass, each heuristic order (or the one asked for), the order of least lower
    bound, best-fit offsets on it. Cached by schedule."""

    def __init__(self, pre: StepGraph, chain: Chain, inplace: bool = True, order: str = "auto") -> None:
        self.pre, self.chain, self.inplace = pre, chain, inplace
        self.orders = ("given", "nntrainer", "greedy") if order in ("auto", "ilp") else (order,)
        self.cache: dict[tuple, int] = {}

    def __call__(self, schedule: Schedule) -> int:
        if schedule.ops not in self.cache:
            g = apply_schedule(self.pre, self.chain, schedule).graph
            g = (inplace if self.inplace else inplace_state)(g).graph
            roots = step_analysis(g).roots
            # the order of the least lower bound (the first such)
            lt = min((lifetimes(g, order_nodes(g, policy, buffer_of=roots).order) for policy in self.orders),
                     key=lambda lt: lower_bound(lt.buffers))
            self.cache[schedule.ops] = lt.persistent_bytes + plan_offsets("best-fit", lt.buffers).arena_bytes
        return self.cache[schedule.ops]


def choose_schedule(pre: StepGraph, chain: Chain, policy: str, budget: int | None = None, *,
                    inplace: bool = True, slots: int = DEFAULT_SLOTS, max_evaluations: int = 12,
                    order: str = "auto") -> Selection:
    """The schedule of `policy` for the chain of `pre` (the step after realize/interleave).

    Without a budget each policy gives its least-memory schedule (sqrt has one; chen the
    search candidate of least planned peak; rotor the smallest memory its table reaches).
    With a budget: the fastest schedule whose planned peak fits (rotor: the largest memory
    limit that fits, found by bisection on the table's columns; chen: its candidates)."""
    if policy not in CHECKPOINT_POLICIES:
        raise UsageError(f"unknown checkpoint policy {policy!r}; known: {', '.join(CHECKPOINT_POLICIES)}")
    t0 = time.perf_counter()
    costs = chain.costs()
    evaluate = PeakEvaluator(pre, chain, inplace, order)
    everything = Schedule(store_all(chain.length), policy)
    sel = Selection(policy, everything, chain)
    if policy == "none" or chain.length < 2:
        sel.notes.append("no recomputation" + (" (one stage: nothing to cut)" if chain.length < 2 else ""))
    elif budget is not None and evaluate(everything) <= budget:
        sel.notes.append("the step fits without recomputation")
    elif policy == "sqrt":
        sel.schedule = sqrt_schedule(costs)
    elif policy == "chen":
        scored = [(s, evaluate(s)) for s in chen_candidates(costs)]
        sel.tried = scored
        fit = [x for x in scored if budget is not None and x[1] <= budget]
        time_of = lambda s: simulate(costs, s.ops).time
        best = min(fit, key=lambda x: (time_of(x[0]), x[1])) if fit else min(scored, key=lambda x: (x[1], time_of(x[0])))
        sel.schedule = best[0]
    else:
        sel.schedule, sel.tried = _rotor(costs, evaluate, budget, slots, max_evaluations, sel.notes)
    sel.planned_peak = evaluate(sel.schedule)
    sel.solve_seconds = time.perf_counter() - t0
    return sel


def _rotor(costs, evaluate, budget, slots, max_evaluations, notes) -> tuple[Schedule, list]:
    top = simulate(costs, store_all(costs.length)).peak
    tab = rotor_table_for_chain(costs, slots)
    slots = tab.slots
    notes.append(f"rotor: {costs.length} stages x {slots} slots of {tab.slot_bytes:.0f} B solved in "
                 f"{tab.solve_seconds:.2f} s")
    lo = tab.min_feasible()
    hi = tab.slots  # the most memory the table knows: every larger column is store-all-like
    if lo is None:
        return Schedule(store_all(costs.length), "rotor", ("no schedule within the table",)), []
    tried: dict[int, int] = {}

    def at(m: int) -> Schedule:
        """Column m's schedule (every column from lo up has one)."""
        sched = rotor_schedule(tab, m)
        if sched is None:
            raise RuntimeError(f"rotor: no schedule in column {m} of the table (its first is {lo})")
        return sched

    def fits(m: int) -> bool:
        sched = rotor_schedule(tab, m)
        tried[m] = evaluate(sched) if sched is not None else 1 << 62
        return budget is not None and tried[m] <= budget

    def scan_least(count: int) -> int:
        """Columns lo, lo+1, ..: the first `count` distinct schedules (the model's memory is
        not the plan's: the least planned peak may be a column or two up)."""
        seen: set[tuple[Op, ...]] = set()
        m = lo
        while m <= hi and len(seen) < count:
            ops = at(m).ops
            if ops not in seen:
                seen.add(ops)
                fits(m)
            m += 1
        ok = [k for k in tried if budget is not None and tried[k] <= budget]
        return max(ok) if ok else min(tried, key=lambda k: (tried[k], -k))

    if budget is None:
        best = scan_least(4)
        return at(best), [(at(m), p) for m, p in sorted(tried.items())]
    # the largest column whose schedule's planned peak fits: start from the chain model's
    # estimate (the store-all gap between model and plan taken as fixed), then bisect
    gap = evaluate(Schedule(store_all(costs.length))) - top
    guess = min(max(tab.slots_for(budget - gap), lo), hi)
    if fits(guess):
        good, bad = guess, hi + 1
    elif guess > lo and fits(lo):
        good, bad = lo, guess
    else:
        best = scan_least(6)
        if tried[best] > budget:
            notes.append(f"rotor: even its least-memory schedules plan {min(tried.values())} B")
        return at(best), [(at(m), p) for m, p in sorted(tried.items())]
    while bad - good > 1 and len(tried) < max_evaluations:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return at(good), [(at(m), p) for m, p in sorted(tried.items())]


def stage_summary(chain: Chain, schedule: Schedule) -> tuple[CheckpointStage, ...]:
    """Per stage: what the forward pass keeps, what is recomputed, how often it runs."""
    L = chain.length
    runs = schedule.executions(L)
    first = schedule.first_pass(L)
    rows = []
    for st in chain.stages:
        mode = first[st.index]
        kept = list(st.saved) if mode == FALL else ([st.input] if mode == FCK and st.input else [])
        recomputed = [] if mode == FALL else list(st.saved)
        rows.append({
            "stage": st.index, "nodes": len(st.nodes), "first": st.nodes[0], "last": st.nodes[-1],
            "input": st.input, "output": st.output, "a_bytes": st.a_bytes, "abar_bytes": st.abar_bytes,
            "forward_pass": _MODE.get(mode, mode), "runs": runs[st.index], "kept": kept,
            "recomputed": recomputed, "forward_seconds": st.forward_seconds,
            "extra_seconds": st.forward_seconds * max(runs[st.index] - 1, 0),
            "not_recomputable": st.nondeterministic,
        })
    return typed_items(CheckpointStage, rows)
