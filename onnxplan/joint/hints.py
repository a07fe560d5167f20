"""Warm starts for the joint model: no recomputation, rotor's chain schedule mapped onto the stages,
recompute-all, and greedy paging."""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping

from onnxplan.checkpoint.chain import build_chain
from onnxplan.checkpoint.costs import TimeModel
from onnxplan.checkpoint.recompute import RECOMPUTE_PHASE, apply_schedule
from onnxplan.checkpoint.rotor import RotorTable, rotor_schedule, rotor_table_for_chain
from onnxplan.errors import ModelError
from onnxplan.ir.graph import StepGraph, original_name
from onnxplan.joint.bounds import recompute_stages
from onnxplan.joint.evaluate import early_issue, memory, minimal_keeps, needs, step_seconds, violations
from onnxplan.joint.problem import Decisions, JointProblem

__all__ = ["RotorColumns", "from_rewritten", "keep_all", "page_hint", "recompute_all", "rotor_hint"]


def keep_all(prob: JointProblem) -> Decisions:
    """Every buffer kept from the forward pass to its last need."""
    return Decisions(keep=minimal_keeps(prob, ()))


def recompute_all(prob: JointProblem) -> Decisions:
    """Every recomputable node recomputed in every stage it may be (just in time), the rest kept:
    a valid schedule of little memory (often near the model's least), slow; the warm start
    that gives CP-SAT a first solution where nothing faster fits."""
    rec = frozenset((t, n) for n, ts in enumerate(recompute_stages(prob)) for t in ts)
    return Decisions(rec, minimal_keeps(prob, rec))


def from_rewritten(prob: JointProblem, rewritten: StepGraph) -> Decisions:
    """The decisions of a graph the chain recompute pass rewrote: each copy of a node the model
    may recompute is placed in the earliest stage whose anchor reads it (through other copies)."""
    eo = {x: i for i, x in enumerate(prob.order)}
    index = {x: k for k, x in enumerate(prob.nodes)}
    copies = [n for n in rewritten.nodes if n.phase == RECOMPUTE_PHASE]
    readers: dict[str, list] = {}
    for n in rewritten.nodes:
        for i in n.inputs:
            if i:
                readers.setdefault(i, []).append(n)
    stage_of: dict[str, int] = {}

    def stage(node) -> int:
        if node.phase != RECOMPUTE_PHASE:
            return bisect.bisect_right(prob.starts, eo[node.name])
        if node.name not in stage_of:
            stage_of[node.name] = min((stage(r) for o in node.outputs if o for r in readers.get(o, ())),
                                      default=prob.stages + 1)
        return stage_of[node.name]

    found = set()
    for c in copies:
        k = index.get(original_name(c.name))
        t = stage(c)
        if k is not None and 1 <= t <= prob.stages:
            found.add((t, k))
    rec = frozenset(found)
    return Decisions(rec, minimal_keeps(prob, rec))


class RotorColumns:
    """rotor's table for the chain of prob.graph; at(col): the schedule of a column as joint
    decisions (None: no schedule there, or the chain pass refuses it)."""

    def __init__(self, prob: JointProblem, costs: Mapping[str, float] | None) -> None:
        self.prob = prob
        self.tab: RotorTable | None = None
        self.lo: int | None = None
        self._cache: dict[int, Decisions | None] = {}
        try:
            self.chain = build_chain(prob.graph, TimeModel(measured=dict(costs or {}),
                                                           source="profile" if costs else "flops"))
        except ModelError:
            return
        if self.chain.length >= 2:
            self.tab = rotor_table_for_chain(self.chain.costs(), 300)
            self.lo = self.tab.min_feasible()

    def at(self, col: int) -> Decisions | None:
        if self.tab is None:  # no chain: no column
            return None
        if col not in self._cache:
            sched = rotor_schedule(self.tab, col)
            try:
                self._cache[col] = None if sched is None else from_rewritten(
                    self.prob, apply_schedule(self.prob.graph, self.chain, sched).graph)
            except ModelError:
                self._cache[col] = None
        return self._cache[col]


def rotor_hint(prob: JointProblem, budget: int, costs: Mapping[str, float] | None,
               cols: RotorColumns | None = None) -> Decisions | None:
    """rotor's fastest schedule whose joint-model peak fits `budget` (bisection over its table's
    columns); its least-memory schedule when none does; None without a chain to recompute.
    `cols`: rotor's table for prob, when the caller asks for several budgets (built here if None)."""
    cols = cols or RotorColumns(prob, costs)
    if cols.lo is None or cols.tab is None:
        return None

    def fits(col: int) -> bool:
        d = cols.at(col)
        return d is not None and memory(prob, d)[0] <= budget

    good, bad = cols.lo, cols.tab.slots
    if not fits(good):
        return cols.at(good)
    if fits(bad):
        return cols.at(bad)
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return cols.at(good)


def page_hint(prob: JointProblem, budget: int, bandwidth: float, base: Decisions | None = None,
              deadline: float | None = None, max_trials: int | None = None) -> Decisions:
    """`base` (None: keep_all) with buffers paged, greedily, until the model's peak fits
    `budget`: each round pages the swappable buffer (not recomputed in `base`) that removes the
    most bytes over the budget (summed over the model's points) per predicted second, with its
    page-ins issued early (evaluate.early_issue) or one stage ahead, whichever scores better; a
    page-in at each stage that needs the buffer unless it is kept from the stage before. Stops
    when it fits, when no paging removes anything, at `deadline` (perf_counter seconds), or
    once `max_trials` schedules were tried (a bound of work that does not depend on the load).
    A warm start of paging for CP-SAT, which from rotor's or recompute-all's point rarely finds
    a paging schedule in its time."""
    d = base or keep_all(prob)

    def excess(x: Decisions) -> int:
        _, fwd, stage = memory(prob, x)
        return sum(max(0, prob.persistent + m - budget) for m in (*fwd, *stage))

    recomputed = {b for t, n in d.recompute for b in prob.node_outputs[n]}
    todo = [k for k, b in enumerate(prob.buffers) if b.swappable and k not in recomputed and k not in d.page_out]
    need = needs(prob, d.recompute)
    over, secs = excess(d), step_seconds(prob, d, bandwidth)[0]
    trials = 0
    while over > 0 and todo:
        if deadline is not None and time.perf_counter() > deadline:
            break
        if max_trials is not None and trials >= max_trials:
            break
        best = None
        for k in todo:
            ins = [t for t in sorted(need[k]) if t >= 2 and t - 1 not in need[k]]
            if not ins:
                continue  # needed from stage 1 on without a break: kept, nothing to page
            page_in = d.page_in | {(t, k) for t in ins}
            keep = minimal_keeps(prob, d.recompute, page_in)
            lead = frozenset((t, k, got[0]) for t in ins for got in [early_issue(prob, t, k, bandwidth)]
                             if got is not None)
            for early in ((lead, frozenset()) if lead else (frozenset(),)):  # issued early, or a stage ahead
                trial = Decisions(d.recompute, keep, d.page_out | {k}, page_in, d.early | early)
                trials += 1
                if violations(prob, trial):
                    continue
                left = excess(trial)
                if left >= over:
                    continue
                trial_secs = step_seconds(prob, trial, bandwidth)[0]
                score = (trial_secs - secs) / (over - left)
                if best is None or score < best[0]:
                    best = (score, k, trial, left, trial_secs)
        if best is None:
            break
        _, k, d, over, secs = best
        todo.remove(k)
    return d
