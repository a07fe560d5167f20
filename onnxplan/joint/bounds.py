"""Bounds of the joint model: the stages a node may be recomputed in, and a lower bound on the extra
cost of any schedule that fits a budget (a fractional-knapsack relaxation)."""

from __future__ import annotations

from collections.abc import Sequence

from onnxplan.joint.evaluate import memory, minimal_keeps
from onnxplan.joint.problem import Decisions, JointProblem

__all__ = ["recompute_stages", "relaxation_bound"]


def recompute_stages(prob: JointProblem) -> list[set[int]]:
    """Per recomputable node: the stages it may be recomputed in, just in time: where one of its
    buffers is read by an anchor, or where a node reading them may be recomputed. (Recomputing
    earlier only holds the outputs longer; the model is restricted to these stages.)"""
    consumers: dict[int, list[int]] = {}
    for n, ins in enumerate(prob.node_inputs):
        for b in ins:
            consumers.setdefault(b, []).append(n)
    out: list[set[int]] = [set() for _ in prob.nodes]
    for n in reversed(range(len(prob.nodes))):
        for b in prob.node_outputs[n]:
            out[n] |= prob.buffers[b].reads
            for c in consumers.get(b, ()):
                if c != n:
                    out[n] |= out[c]
    return out


def relaxation_bound(prob: JointProblem, budget: int, node_cost: Sequence[float], swap_cost: float | None = None) -> float:
    """A valid lower bound on the extra cost of any schedule whose model peak fits `budget`
    (persistent bytes included): at each point of the schedule that keeps every buffer (a
    forward EO, a stage's anchor), the bytes over the budget must leave; a buffer kept there
    that the point does not read leaves only if it is restored later, by recomputing its
    producer (at least `node_cost[producer]` for all of that node's buffers there) or, when
    `swap_cost` is given and the buffer is swappable, by paging it (at least `swap_cost`).
    The least cost of that cover, fractional knapsack (a relaxation), at the worst point.
    0 where some point cannot be covered (nothing fits: the bound is the solver's to find)."""
    d = Decisions(keep=minimal_keeps(prob, ()))
    _, fwd, stage = memory(prob, d)
    cap = budget - prob.persistent
    points = []  # (deficit, removable buffers)
    for e, m in enumerate(fwd):
        if m > cap:
            points.append((m - cap, [k for k, b in enumerate(prob.buffers) if b.last_forward < e and (1, k) in d.keep]))
    for t, m in enumerate(stage, start=1):
        if m > cap:
            points.append((m - cap, [k for k, b in enumerate(prob.buffers) if (t, k) in d.keep and t not in b.reads]))
    best = 0.0
    for deficit, ks in points:
        items: dict[object, list[float]] = {}  # (cost, bytes) per way to remove
        for k in ks:
            b = prob.buffers[k]
            if swap_cost is not None and b.swappable:
                items[("swap", k)] = [swap_cost, b.nbytes]
            elif b.producer >= 0:
                items.setdefault(b.producer, [node_cost[b.producer], 0])[1] += b.nbytes
        need: float = deficit
        cost = 0.0
        for c, w in sorted(items.values(), key=lambda cw: cw[0] / cw[1]):
            take = min(w, need)
            cost += c * take / w
            need -= take
            if need <= 0:
                break
        if need > 0:
            return 0.0
        best = max(best, cost)
    return best
