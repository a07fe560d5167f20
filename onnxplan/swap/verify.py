"""The swap checker: every swap-in brings back the current bytes, nothing reads a stale copy."""

from __future__ import annotations

from onnxplan.ir.graph import StepGraph
from onnxplan.passes.lifetimes import lifetimes
from onnxplan.plan import Plan
from onnxplan.swap.insert import swap_node_name
from onnxplan.swap.model import swap_model
from onnxplan.verify import PlanError

__all__ = ["verify_swap_records", "verify_swaps"]


def verify_swap_records(graph: StepGraph, base_order: list[str], swaps) -> None:
    """Raise PlanError unless every swap entry of a plan file is what swap planning would write
    for `graph` (after the plan's passes, without swap nodes) under `base_order`: a swappable
    buffer group, one of its gaps (between two consecutive touches, or a persistent value's
    wrap gap), that group's byte size and class, the gap's last and next use, and the node
    names of onnxplan.swap.insert; no gap swapped twice. The byte sizes are recomputed from the
    graph: a plan cannot make a swap move fewer bytes than its buffer holds."""

    model = swap_model(graph, base_order, lifetimes(graph, base_order), min_bytes=0)
    seen: set[tuple[str, int]] = set()
    for s in swaps:
        group = model.groups.get(s.value)
        if group is None or not group.swappable:
            why = group.why_not if group is not None else "not a buffer of this step"
            raise PlanError(f"swap of {s.value!r}: it cannot be swapped ({why})")
        gap = next((gp for gp in model.gaps(s.value)
                    if gp.wrap == s.wraps and (model.order[gp.after] if gp.after >= 0 else "") == s.last_use
                    and model.order[gp.before] == s.next_use), None)
        if gap is None:
            raise PlanError(f"swap of {s.value!r}: no idle gap of that buffer from {s.last_use or 'the step start'!r} "
                            f"to {s.next_use!r}")
        if (s.value, gap.index) in seen:
            raise PlanError(f"swap of {s.value!r}: the gap before {s.next_use!r} is swapped twice")
        seen.add((s.value, gap.index))
        if s.bytes != group.nbytes or s.vclass != group.vclass:
            raise PlanError(f"swap of {s.value!r}: {s.bytes} B of class {s.vclass!r} in the plan, the buffer "
                            f"holds {group.nbytes} B of class {group.vclass!r}")
        names = (swap_node_name("out", gap, True), swap_node_name("in", gap, False))
        if (s.out_node, s.in_node) != names:
            raise PlanError(f"swap of {s.value!r}: nodes {s.out_node!r}, {s.in_node!r}, expected {names[0]!r}, "
                            f"{names[1]!r}")


def verify_swaps(graph: StepGraph, plan: Plan) -> None:
    """Raise PlanError on the first broken swap invariant of `plan` over its rewritten graph.

    Checks that each PlannedSwap names a SwapOut and a SwapIn of its slot at its EOs; that a
    swap-out ends its buffer's life (nothing reads the buffer after it); and, simulating
    versions of every slot's bytes along the order: a swap-out saves the current bytes, a
    clean swap-out (write 0) only where the store already holds them, a swap-in only reads a
    slot holding the current bytes, every reader of a swapped buffer reads the current bytes,
    and an evicted persistent value ends the step written back to its slot.
    """
    nodes = {n.name: n for n in graph.nodes}
    eo = {name: i for i, name in enumerate(plan.order)}
    for s in plan.swaps:
        for name, op, t in ((s.out_node, "SwapOut", s.out_eo), (s.in_node, "SwapIn", s.in_eo)):
            n = nodes.get(name)
            if n is None or n.op_type != op or eo.get(name) != t or n.attrs.get("slot") != s.value:
                raise PlanError(f"swap of {s.value!r}: no {op} node {name!r} of that slot at EO {t}")
        if s.wraps != (s.out_eo > s.in_eo):
            raise PlanError(f"swap of {s.value!r}: out EO {s.out_eo}, in EO {s.in_eo} but wraps={s.wraps}")
    lt = lifetimes(graph, plan.order)
    spans = {b.name: b for b in lt.buffers}
    slot_of_root: dict[str, str] = {}
    for n in graph.nodes:
        if n.op_type == "SwapOut" and n.domain == "onnxplan":
            b = spans[lt.buffer_of[n.inputs[0]]]
            if b.last != eo[n.name]:
                raise PlanError(f"swap-out {n.name!r} at EO {eo[n.name]}: buffer {b.name!r} is still read "
                                f"at EO {b.last}")
            slot_of_root[b.name] = n.attrs["slot"]
        elif n.op_type == "SwapIn" and n.domain == "onnxplan":
            for o in n.outputs:
                slot_of_root[lt.buffer_of[o]] = n.attrs["slot"]
    _simulate(graph, plan, {v: slot_of_root[r] for v, r in lt.buffer_of.items() if r in slot_of_root})


def _simulate(graph: StepGraph, plan: Plan, slot_of: dict[str, str]) -> None:
    nodes = {n.name: n for n in graph.nodes}
    wrapped = {s.value for s in plan.swaps if s.wraps}
    # a buffer's bytes by version: ("initial", slot) for what a wrapped slot holds at the start, else a count
    store: dict[str, object] = {s: ("initial", s) for s in wrapped}
    truth = dict(store)
    ver: dict[str, object] = {}
    fresh = iter(range(1 << 62))
    for v in graph.inputs:
        ver[v] = next(fresh)
        if v in slot_of:
            truth[slot_of[v]] = ver[v]
    for t, name in enumerate(plan.order):
        n = nodes[name]
        where = f"EO {t} ({name!r})"
        if n.domain == "onnxplan" and n.op_type == "SwapIn":
            s = n.attrs["slot"]
            if s not in store:
                raise PlanError(f"{where}: swap-in of {s!r} before anything was written to its slot")
            if store[s] != truth.get(s):
                raise PlanError(f"{where}: swap-in of {s!r} would read stale bytes")
            for o in n.outputs:
                ver[o] = store[s]
        elif n.domain == "onnxplan" and n.op_type == "SwapOut":
            s, m = n.attrs["slot"], n.inputs[0]
            if ver.get(m) is None or ver[m] != truth.get(s):
                raise PlanError(f"{where}: swap-out of {s!r} saves {m!r}, not the buffer's current bytes")
            if int(n.attrs.get("write", 1)):
                store[s] = ver[m]
            elif store.get(s) != ver[m]:
                raise PlanError(f"{where}: swap-out of {s!r} writes nothing but its slot holds other bytes")
        else:
            for i in n.inputs:
                if i in slot_of and ver.get(i) != truth.get(slot_of[i]):
                    raise PlanError(f"{where} reads {i!r}, a stale copy of swapped buffer {slot_of[i]!r}")
            for o in n.outputs:
                if not o:
                    continue
                src, kind = n.aliases.get(o, ("", ""))
                ver[o] = ver.get(src) if kind == "rv" else next(fresh)
                if o in slot_of:
                    truth[slot_of[o]] = ver[o]
    for s in sorted(wrapped):
        if store.get(s) != truth.get(s):
            raise PlanError(f"evicted {s!r} ends the step without its current bytes in the swap store")
