"""Lowering a joint schedule: recomputed copies before their stage's anchor, as the "dag." code of
the recompute pass (onnxplan.checkpoint.dag, replayable from the plan's pass list); then its
page-outs and page-ins as swap nodes of onnxplan.swap (lower_swaps), recorded in the plan's swaps
as any swap policy's.
"""

from __future__ import annotations

from dataclasses import replace

from onnxplan.checkpoint.dag import DAG_PREFIX, decode_recompute, lower_recompute
from onnxplan.checkpoint.recompute import RECOMPUTE_PHASE
from onnxplan.ir.graph import StepGraph
from onnxplan.joint.problem import Decisions, JointProblem
from onnxplan.offsets import lower_bound
from onnxplan.passes.lifetimes import lifetimes
from onnxplan.plan_records import SwapRecord
from onnxplan.planning import planned_buffers, verify_plan
from onnxplan.step_analysis import step_analysis
from onnxplan.swap import swap_totals
from onnxplan.swap.driver import realize_selection
from onnxplan.swap.model import Gap, SwapModel, swap_model
from onnxplan.swap.policies import SwapPolicy, Timing
from onnxplan.swap.select import select_all

__all__ = ["encode_recompute", "lower_joint", "lower_swaps", "swap_timings"]


def encode_recompute(prob: JointProblem, d: Decisions) -> str:
    """The recompute pass argument of `d`'s recomputations ('' when there are none)."""
    if not d.recompute:
        return ""
    index = step_analysis(prob.graph).index
    by_stage: dict[int, list[int]] = {}
    for t, n in sorted(d.recompute):
        by_stage.setdefault(t, []).append(n)
    parts = [f"{index[prob.anchors[t - 1]]}:" + "-".join(str(index[prob.nodes[n]]) for n in sorted(ns))
             for t, ns in sorted(by_stage.items())]
    return f"{DAG_PREFIX}{prob.policy}.{len(prob.graph.nodes)}." + ".".join(parts)


def lower_joint(graph: StepGraph, schedule) -> StepGraph:
    """The step graph (after realize / interleave) with `schedule`'s recomputations in place."""
    prob = schedule.problem
    code = encode_recompute(prob, schedule.decisions)
    if not code:
        return graph
    _, batches = decode_recompute(code, graph)
    return lower_recompute(graph, prob.order, batches).graph


class _ChosenGaps(SwapPolicy):
    """The swap policy of a joint schedule: exactly the chosen gaps, with their timings (every
    other gap gets an empty absence, so select_all takes only the chosen ones)."""

    name = "joint"

    def __init__(self, timings: dict[tuple[str, int], Timing]) -> None:
        self.chosen = timings

    def timing(self, model: SwapModel, gap: Gap) -> Timing:
        if gap.wrap:
            return Timing(model.n, 0)
        return self.chosen.get((gap.root, gap.index), Timing(gap.after + 1, gap.after + 1))


def swap_timings(schedule, graph: StepGraph, order: tuple[str, ...], model: SwapModel) -> tuple[dict, list[str]]:
    """(root, gap index) -> Timing for each page-in of `schedule`, on the planned (recomputed,
    in-place) graph in its base `order`; and the page-ins that found no swappable gap.

    A page-in of buffer b for stage t swaps the gap of b's buffer that ends at its first touch
    in stage t (stage t: its anchor and the recomputations right before it); the swap-in is
    issued at the first EO of stage t-1 (of its issue stage, when early), the swap-out completes
    one EO after the gap's start when it writes (the first gap: or after the forward EOs that
    hide the write, Buffer.held_until), right after it otherwise."""
    prob = schedule.problem
    d = schedule.decisions
    if not d.page_in:
        return {}, []
    roots = step_analysis(graph).roots
    stage_index = {a: t + 1 for t, a in enumerate(prob.anchors)}
    phase = {n.name: n.phase for n in graph.nodes}
    stage_of = [0] * len(order)
    t = 0
    for e, x in enumerate(order):  # a stage runs from its anchor to the next one
        if phase[x] != "forward":
            t = stage_index.get(x, max(t, 1))
        stage_of[e] = t
    for e in range(len(order) - 1, -1, -1):  # copies belong to the stage of the anchor after them
        if phase[order[e]] == RECOMPUTE_PHASE:
            stage_of[e] = stage_of[e + 1] if e + 1 < len(order) else prob.stages
    first_eo: dict[int, int] = {}
    for e, s in enumerate(stage_of):
        first_eo.setdefault(s, e)
    out: dict[tuple[str, int], Timing] = {}
    missed: list[str] = []
    issued = d.issued()
    pos = {x: e for e, x in enumerate(order)}
    n_fwd = sum(1 for x in order if phase[x] == "forward")
    for t, b in sorted(d.page_in):
        root = roots.get(prob.buffers[b].root, prob.buffers[b].root)
        group = model.groups.get(root)
        gap = None
        if group is not None and group.swappable:
            gap = next((g for g in model.gaps(root) if not g.wrap and stage_of[g.before] >= t > stage_of[g.after]
                        and g.after >= 0), None)
        if gap is None:
            why = group.why_not if group is not None and group.why_not else "no gap ends in that stage"
            missed.append(f"{prob.buffers[b].root} for stage {t} ({why})")
            continue
        first = not any(r == root for r, _ in out)
        release = min(gap.after + (2 if first else 1), gap.before)
        if first:  # the write runs while the forward EOs up to held_until run (the backward: pending at its start)
            held = prob.buffers[b].held_until
            end = pos.get(prob.order[held], gap.before) + 1 if held < prob.n_forward else n_fwd
            release = min(max(release, end), gap.before)
        issue = min(max(first_eo.get(issued[t, b], gap.before), release), gap.before)
        out[root, gap.index] = Timing(release, issue)
    return out, missed


def lower_swaps(outcome, schedule, planner: str = "auto"):
    """(outcome, page-ins not lowered): `outcome` (plan_step of the step with the schedule's
    recomputations, no swap) with the schedule's page-outs and page-ins inserted by the swap
    passes (onnxplan.swap.insert) on the model's order (the graph's node order), placed again
    and verified; the outcome unchanged when nothing is paged."""
    g = outcome.graph
    order = tuple(n.name for n in g.nodes)  # the model's order (the `given` policy), copies in place
    model = swap_model(g, order, lifetimes(g, order))
    timings, missed = swap_timings(schedule, g, order, model)
    if not timings:
        return outcome, missed
    sel = select_all(model, _ChosenGaps(timings))
    so = realize_selection(g, model, sel, None, planner, schedule.budget)
    lt = so.lifetimes
    plan = replace(
        outcome.plan, order=so.order, buffers=planned_buffers(lt.buffers, so.offsets), arena_bytes=so.offsets.arena_bytes,
        lower_bound_bytes=lt.persistent_bytes + lower_bound(lt.buffers), planner=so.offsets.planner,
        order_policy="given",
        swaps=so.swaps, swap=SwapRecord("joint", "joint", "joint schedule", schedule.budget, **swap_totals(so.swaps)))
    verify_plan(so.graph, plan)
    return replace(outcome, plan=plan, graph=so.graph, swap=so), missed

