"""Swap planning for a budget: choose gaps, insert swap nodes, re-plan offsets until the plan fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from onnxplan.ir.graph import StepGraph
from onnxplan.limits import DEFAULT_TIME_LIMIT
from onnxplan.offsets import OffsetPlan, best_heuristic_offsets, plan_offsets
from onnxplan.offsets.buffers import ALIGNMENT
from onnxplan.passes.lifetimes import SCRATCH_PREFIX, Lifetimes, lifetimes
from onnxplan.plan import PlannedSwap
from onnxplan.sizes import format_bytes
from onnxplan.swap.insert import build_order, decide_writes, rewrite_graph
from onnxplan.swap.model import SWAP_MIN_BYTES, SwapModel, swap_model
from onnxplan.swap.policies import PolicyOptions, SwapPolicy, make_policy
from onnxplan.swap.select import Selection, select_all, select_greedy
from onnxplan.verify import verify_offsets

__all__ = ["AUTO_POLICIES", "SWAP_CHOICES", "Floor", "SwapOutcome", "SwapTotals", "plan_swaps", "realize_selection", "resident_touched",
           "swap_totals"]

SWAP_CHOICES = ("none", "auto", "on-demand", "reduced", "proactive", "adaptive", "window")
AUTO_POLICIES = ("proactive", "adaptive")  # what `auto` tries, in order, when a budget is not met
MAX_ROUNDS = 200
SLACK_ROUNDS = 6  # placements tried while spending the slack
SLACK_RESOLUTION = 256 << 10
# offset ILP per placement while spending the slack (CP-SAT's deterministic time: ~1.4 s of wall a
# unit on one worker). 1.0 took BERT-base's `plan --budget` (persistent + 25%) to 31 s of wall with a
# warm cache, 20 of them in 14 solves here; 0.3: 15.7 s (ResNet-50 15.0, GPT-2 5.5; same peaks, load 2)
SLACK_SECONDS = 0.3


@dataclass(frozen=True)
class Floor:
    """The least a policy reaches: every gap it can swap swapped."""

    peak_bytes: int  # planned peak (resident persistent + arena)
    working_set: int  # bytes the node at the peak EO touches
    eo: int  # base EO of that node
    node: str
    scratch: int = 0  # that node's scratch bytes (its kernel's working memory)
    resident: int = 0  # persistent bytes that stay in memory (constants, state the runtime copies back)
    resident_touched: int = 0  # of the working set, bytes of resident values (counted once)
    unsplit: str = ""  # set by the split search (budget/split.py): why that node splits no further
    chunks: int = 0  # set by the split search: the floor is that node's smallest chunk, in this many (0: the node whole)

    @property
    def bound(self) -> int:
        """Bytes in memory while that node runs, whatever else is recomputed or swapped."""
        return self.resident + self.working_set - self.resident_touched + self.scratch

    def describe(self) -> str:
        """The line of a budget below the floor: the bound (never the peak of swapping everything,
        which the offset planners can beat: a floor above the smallest peak reached would
        contradict it). Set by the split search, the node is the one whose least working set
        (its smallest chunk, or whole where it does not split) is the largest of the step's."""
        where = f"node {self.node!r}" + (f", one of its {self.chunks} chunks" if self.chunks else "")
        return (f"floor {format_bytes(self.bound)} ({self.bound} B): the largest single working set is at {where} "
                f"(EO {self.eo}: {format_bytes(self.working_set)} touched + "
                f"{format_bytes(self.scratch)} scratch, {format_bytes(self.resident)} resident), in memory while "
                f"it runs, which no recomputation{', swap or split' if self.unsplit else ' or swap'} avoids"
                + (f" ({self.unsplit})" if self.unsplit else ""))


def resident_touched(model: SwapModel, t: int) -> int:
    """Of the working set of the node at EO `t`, the bytes of resident values (persistent, not
    swappable), counted once: Floor.resident holds them already."""
    return sum(b for _, root, b in model.entries[model.entry_start[t]:model.entry_start[t + 1]]
               if root in model.groups and model.groups[root].persistent and not model.groups[root].swappable)


@dataclass
class SwapOutcome:
    """A swapped step: its graph and order (swap nodes included), lifetimes, offsets, swaps."""

    policy: str  # described, e.g. "proactive (lookahead 1)"
    options: PolicyOptions
    graph: StepGraph
    order: tuple[str, ...]
    lifetimes: Lifetimes
    offsets: OffsetPlan
    swaps: tuple[PlannedSwap, ...]
    budget: int | None = None
    floor: Floor | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return self.lifetimes.persistent_bytes + self.offsets.arena_bytes

    @property
    def fits(self) -> bool:
        return self.budget is None or self.peak_bytes <= self.budget


class SwapTotals(TypedDict):
    """A step's transfers (the SwapRecord fields of the same names)."""

    swaps: int
    transfers: int
    bytes_out: int
    bytes_in: int


def swap_totals(swaps) -> SwapTotals:
    """Transfers per step: count (data moved: swap-ins and writing swap-outs), bytes out, bytes in."""
    out = sum(s.bytes for s in swaps if s.write)
    return {"swaps": len(swaps), "transfers": len(swaps) + sum(1 for s in swaps if s.write),
            "bytes_out": out, "bytes_in": sum(s.bytes for s in swaps)}


def _offsets(buffers, planner: str) -> OffsetPlan:
    if planner in ("auto", "ilp"):
        return best_heuristic_offsets(buffers)
    return plan_offsets(planner, buffers)


def _alone(buffers, planner: str, budget: int, persistent: int, time_limit: float) -> int:
    """The peak order and planner reach without swap (the ILP only when the heuristics miss)."""
    best = _offsets(buffers, planner)
    if planner in ("auto", "ilp") and persistent + best.arena_bytes > budget:
        ilp = plan_offsets("ilp", buffers, time_limit=time_limit, seed_plan=best)
        best = min(best, ilp, key=lambda p: p.arena_bytes)
    return persistent + best.arena_bytes


def realize_selection(g: StepGraph, model: SwapModel, sel: Selection, target: int | None, planner: str,
                      budget: int | None, exact_seconds: float = 0.0) -> SwapOutcome:
    """The swap outcome of a selection of gaps: the policy's final timings, the swap nodes
    inserted in the order, lifetimes, offsets placed by `planner` and verified (`exact_seconds`
    > 0: where the heuristics miss `budget`, planner auto also runs the offset ILP that long)."""
    policy = sel.policy
    gaps = sel.gaps()
    timings = policy.finalize(model, {gp: sel.timings[gp] for gp in gaps}, sel.profile, sel.resident, target)
    if not policy.round_trips:  # a gap whose timing left it nothing to free moves nothing
        useful = [gp for gp in gaps if timings[gp].absent(gp, model.n)]
        inner = {gp.root for gp in useful if not gp.wrap}
        gaps = [gp for gp in gaps if gp in useful or (gp.wrap and gp.root in inner)]
    decisions = decide_writes(model, gaps, timings, policy.clean_drops)
    order, records = build_order(model, decisions)
    g2 = rewrite_graph(g, order, records)
    lt = lifetimes(g2, order)
    op = _offsets(lt.buffers, planner)
    if exact_seconds > 0 and planner in ("auto", "ilp") and budget is not None and \
            lt.persistent_bytes + op.arena_bytes > budget:
        op = min(op, plan_offsets("ilp", lt.buffers, time_limit=exact_seconds, seed_plan=op),
                 key=lambda p: p.arena_bytes)
    verify_offsets(lt.buffers, op)
    return SwapOutcome(policy.describe(), policy.options(), g2, tuple(order), lt, op, tuple(records), budget)


def _run(g: StepGraph, model: SwapModel, policy: SwapPolicy, budget: int | None, planner: str,
         time_limit: float = DEFAULT_TIME_LIMIT) -> SwapOutcome:
    if budget is None:
        out = realize_selection(g, model, select_all(model, policy), None, planner, None)
        out.notes.append(f"swap {out.policy}: every gap it can swap (no budget)")
        return out
    target = budget
    sel: Selection | None = None
    for _ in range(MAX_ROUNDS):
        sel = select_greedy(model, policy, target, sel)
        out = realize_selection(g, model, sel, None if policy.spends_slack else target, planner, budget)
        if out.fits or sel.stuck:
            break
        target = min(target, sel.estimate) - (out.peak_bytes - budget) - ALIGNMENT
    if sel is None:
        raise RuntimeError("swap: no selection round ran")
    if out.fits and policy.spends_slack:
        out = _spend_slack(g, model, sel, out, planner, budget, time_limit)
    if not out.fits:  # stuck at the peak EO: swapping everything may still pack tighter
        every = realize_selection(g, model, select_all(model, policy), None, planner, budget)
        t = select_all(model, policy).peak_eo
        node = model.order[t] if model.n else ""
        scratch = next((b.padded for b in every.lifetimes.buffers if b.name == SCRATCH_PREFIX + node), 0)
        floor = Floor(every.peak_bytes, model.working_set(t), t, node, scratch, every.lifetimes.persistent_bytes,
                      resident_touched(model, t))
        out = every if every.peak_bytes < out.peak_bytes else out
        out.floor = floor
    return out


def _spend_slack(g: StepGraph, model: SwapModel, sel: Selection, fitting: SwapOutcome, planner: str,
                 budget: int, time_limit: float) -> SwapOutcome:
    """The fitting selection's timings stretched into the memory the budget leaves free (the
    policy's finalize, given a target): the budget first; where the placement misses it, the
    highest target that places within it, by bisection between the selection's own live
    bytes and the budget (a longer lead packs worse). The selection never grows. None fits:
    `fitting` as it is."""
    exact = min(time_limit, SLACK_SECONDS)
    out = realize_selection(g, model, sel, budget, planner, budget, exact)
    if out.fits:
        return out
    lo, hi = sel.estimate, budget  # targets: the selection's own live bytes (little lead), the budget
    best = fitting
    for _ in range(SLACK_ROUNDS):
        if hi - lo <= SLACK_RESOLUTION:
            break
        mid = (lo + hi) // 2
        out = realize_selection(g, model, sel, mid, planner, budget, exact)
        if out.fits:
            best, lo = out, mid
        else:
            hi = mid
    return best


def plan_swaps(g: StepGraph, order, lt: Lifetimes, *, swap: str, budget: int | None = None,
               lookahead: int = 1, window_bytes: int | None = None, planner: str = "auto",
               min_bytes: int = SWAP_MIN_BYTES, time_limit: float = DEFAULT_TIME_LIMIT,
               swap_dir: str | None = None) -> SwapOutcome | None:
    """Swap planning over a swap-free order (see onnxplan.swap). `swap` is a policy name, or
    "auto": none when order and planner alone reach `budget` (or there is none), else the first
    of AUTO_POLICIES whose plan fits (the last tried when none does). Returns None for no swap.
    `swap_dir`: the folder the swap file will be in (the store a policy prices transfers at)."""
    if swap == "none":
        return None
    model = swap_model(g, order, lt, min_bytes)
    if swap != "auto":
        return _run(g, model, make_policy(swap, lookahead, window_bytes, swap_dir), budget, planner, time_limit)
    if budget is None:
        return None
    alone = _alone(lt.buffers, planner, budget, lt.persistent_bytes, time_limit)
    if alone <= budget:
        return None
    tried = []
    out: SwapOutcome | None = None
    for name in AUTO_POLICIES:
        out = _run(g, model, make_policy(name, lookahead, window_bytes, swap_dir), budget, planner, time_limit)
        tried.append(f"{out.policy} {format_bytes(out.peak_bytes)}")
        if out.fits:
            break
    if out is None:
        raise RuntimeError("swap auto: AUTO_POLICIES is empty")
    t = swap_totals(out.swaps)
    verdict = "chose" if out.fits else "best tried"
    out.notes.append(f"swap auto: order and planner alone reach {format_bytes(alone)} > budget "
                     f"{format_bytes(budget)}; tried {', '.join(tried)}; {verdict} {out.policy}: "
                     f"{t['swaps']} swaps, {format_bytes(t['bytes_out'])} out, {format_bytes(t['bytes_in'])} in per step")
    return out
