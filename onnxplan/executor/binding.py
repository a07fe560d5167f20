"""Bind every value of a planned step to a view: transient values in the arena, state in its region."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onnxplan.errors import ModelError
from onnxplan.executor.arena import Arena, region_layout
from onnxplan.ir.graph import StepGraph, ValueClass
from onnxplan.passes.lifetimes import SCRATCH_PREFIX
from onnxplan.plan import Plan
from onnxplan.step_analysis import step_analysis

__all__ = ["Binding", "StateLayout", "bind", "is_view_node", "state_layout", "state_values"]


@dataclass(frozen=True)
class StateLayout:
    """Where each persistent buffer (parameters, optimizer state, constants) lives in the state
    region: one aligned slot per alias group, in a stable order."""

    offsets: dict[str, int]  # group root -> byte offset in the state region
    sizes: dict[str, int]  # group root -> bytes
    nbytes: int  # the region's size, slots aligned


@dataclass
class Binding:
    """Value -> array view, plus what the runner does besides calling kernels."""

    arrays: dict[str, Any]  # every value of the step, by name
    root: dict[str, str]  # value -> the value whose buffer it lives in
    transient: dict[str, str]  # value -> its arena buffer's name (transient values only)
    scratch: dict[str, Any]  # node -> its planned scratch (1-D uint8)
    # state updated by a node that could not write it in place (no alias): copied back
    # right after the node (transient output) or at the end of the step (persistent output)
    writeback_after: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    writeback_end: list[tuple[Any, Any]] = field(default_factory=list)


def is_view_node(node) -> bool:
    """True for a node every output of which is a read-only view of an input: the binding
    already made that view, so the node has nothing to compute."""
    outs = [o for o in node.outputs if o]
    return bool(outs) and all(node.aliases.get(o, ("", ""))[1] == "rv" for o in outs)


def state_layout(graph: StepGraph) -> StateLayout:
    """One slot per alias group holding a persistent value, sized by its largest member."""
    members = step_analysis(graph).members
    sizes = {}
    for r in sorted(members):
        vals = [graph.values[v] for v in members[r]]
        if any(v.persistent for v in vals):
            sizes[r] = max(v.nbytes for v in vals)
    offsets, total = region_layout(sizes)
    return StateLayout(offsets, sizes, total)


def bind(graph: StepGraph, plan: Plan, arena: Arena, state: Arena, layout: StateLayout) -> Binding:
    """Views of every value at its planned place; ModelError if the plan misses a buffer."""
    a = step_analysis(graph)
    roots = a.roots
    planned = {b.name: b for b in plan.buffers}
    arrays: dict[str, Any] = {}
    transient: dict[str, str] = {}
    for name, value in graph.values.items():
        if value.spec is None:
            raise ModelError(f"value {name!r} has no static shape; cannot bind it")
        r = roots[name]
        if r in layout.offsets:
            arrays[name] = state.view(layout.offsets[r], value.spec)
        elif r in planned:
            b = planned[r]
            if value.nbytes > b.bytes:
                raise ModelError(f"plan buffer {r!r} has {b.bytes} B, value {name!r} needs {value.nbytes} B")
            arrays[name] = arena.view(b.offset, value.spec)
            transient[name] = r
        elif name in a.consumers or name in a.producer:
            raise ModelError(f"the plan places no buffer for value {name!r} (buffer {r!r})")
    scratch = {}
    for b in plan.buffers:
        if b.name.startswith(SCRATCH_PREFIX):
            scratch[b.name[len(SCRATCH_PREFIX):]] = arena.bytes(b.offset, b.bytes)
    binding = Binding(arrays, roots, transient, scratch)
    _state_writebacks(graph, plan, binding, layout)
    return binding


def _state_writebacks(graph: StepGraph, plan: Plan, binding: Binding, layout: StateLayout) -> None:
    """Persistent state a node updates (optimizer, running statistics) but that the passes did
    not alias to its input: the runtime updates it in place, so copy the new value back."""
    a = step_analysis(graph)
    eo = {name: i for i, name in enumerate(plan.order)}
    last_read = {v: max(eo[r] for r in readers) for v, readers in a.consumers.items()}
    for u in a.state_updates:
        if a.in_place(u):
            continue
        pair = (binding.arrays[u.state], binding.arrays[u.updated])
        if a.roots[u.updated] in layout.offsets:
            binding.writeback_end.append(pair)
        elif last_read.get(u.state, -1) > eo[u.node]:
            raise ModelError(f"state {u.state!r} is updated by {u.node!r} but read after it; "
                             "cannot write the update back in place")
        else:
            binding.writeback_after.setdefault(u.node, []).append(pair)


def state_values(graph: StepGraph) -> dict[str, list[str]]:
    """Persistent values by class: parameters (not their updated copies), optimizer state,
    constants."""
    produced = step_analysis(graph).producer
    out: dict[str, list[str]] = {c.value: [] for c in (ValueClass.PARAMETER, ValueClass.OPTIMIZER_STATE,
                                                       ValueClass.CONSTANT)}
    for v in graph.values.values():
        if v.persistent and v.name not in produced:
            out[v.vclass.value].append(v.name)
    return out

