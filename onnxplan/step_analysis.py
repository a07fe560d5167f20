"""One analysis of a step graph, computed once per graph and read by every stage that needs it:
lifetimes, the order memory model, swap, joint, checkpoint, the executor's binding, verification.

`step_analysis(g)` returns the `StepAnalysis` of `g`, cached on the graph. Passes never rewrite
a graph in place: they rewrite a copy (`StepGraph.copy()`, which starts without an analysis) and
return it, so a new graph gets a new analysis. A cached analysis is also dropped when the graph's
node list or value table is replaced or changes length; code that edits the nodes of a graph in
place after reading its analysis calls `forget_analysis(g)`.

It lives above `ir` and `kernels` (the scratch bytes, the random flag and the state updates are
kernel declarations), so `ir` keeps no import of the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxplan.ir.analysis import alias_roots, readers_by_value
from onnxplan.ir.graph import Node, StepGraph
from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.registry import is_random, may_overwrite, scratch_bytes, updates_state

__all__ = ["StateUpdate", "StepAnalysis", "forget_analysis", "step_analysis"]


@dataclass(frozen=True)
class StateUpdate:
    """Node `node` writes the new contents of persistent value `state` (its input `in_index`)
    as its output `updated` (index `out_index`): an optimizer update, BatchNorm running
    statistics. In place when both share one buffer (`StepAnalysis.in_place`); else the
    executor copies the update back."""

    node: str
    out_index: int
    in_index: int
    state: str
    updated: str


@dataclass(frozen=True)
class StepAnalysis:
    """What the graph says about who makes, reads and shares each value (read-only mappings)."""

    index: dict[str, int]  # node -> position in file order
    nodes: dict[str, Node]  # node name -> node
    producer: dict[str, str]  # value -> the node that writes it (the last writer in file order)
    consumers: dict[str, tuple[str, ...]]  # value -> nodes reading it, file order, each once
    roots: dict[str, str]  # value -> the value whose buffer it lives in (every view / in-place alias)
    members: dict[str, tuple[str, ...]]  # root -> its values (itself included), in value-table order
    state_updates: tuple[StateUpdate, ...]  # file order
    updates_of: dict[str, tuple[StateUpdate, ...]]  # node -> its state updates (nodes that make some)
    scratch: dict[str, int]  # node -> kernel scratch bytes at its EO (nodes that need some)
    random: frozenset[str]  # nodes whose kernel draws at random (KernelDecl.random)

    def in_place(self, u: StateUpdate) -> bool:
        """True when the update writes into the state's own buffer."""
        return self.roots[u.state] == self.roots[u.updated]

    def producer_node(self, value: str) -> Node | None:
        p = self.producer.get(value)
        return None if p is None else self.nodes[p]


def _key(g: StepGraph) -> tuple[int, int, int, int]:
    return (id(g.nodes), len(g.nodes), id(g.values), len(g.values))


def step_analysis(g: StepGraph) -> StepAnalysis:
    """The analysis of `g`, computed on first use and cached on the graph."""
    cached = g.__dict__.get("_analysis")
    if cached is not None and cached[0] == _key(g):
        return cached[1]
    a = _analyse(g)
    g.__dict__["_analysis"] = (_key(g), a)
    return a


def forget_analysis(g: StepGraph) -> None:
    """Drop the cached analysis of a graph whose nodes were edited in place."""
    g.__dict__.pop("_analysis", None)


def _analyse(g: StepGraph) -> StepAnalysis:
    roots = alias_roots(g)
    members: dict[str, list[str]] = {}
    for v, r in roots.items():
        members.setdefault(r, []).append(v)
    scratch, random = {}, set()
    for n in g.nodes:
        version = g.opsets.get(n.domain or "")
        nbytes = _scratch(g, n, version)
        if nbytes > 0:
            scratch[n.name] = nbytes
        if is_random(n, version):
            random.add(n.name)
    updates = tuple(u for n in g.nodes for u in _state_updates(g, n))
    updates_of: dict[str, list[StateUpdate]] = {}
    for u in updates:
        updates_of.setdefault(u.node, []).append(u)
    return StepAnalysis(
        index={n.name: i for i, n in enumerate(g.nodes)},
        nodes={n.name: n for n in g.nodes},
        producer={v: n.name for v, n in g.producers().items()},
        consumers={v: tuple(ns) for v, ns in readers_by_value(g).items()},
        roots=roots,
        members={r: tuple(vs) for r, vs in members.items()},
        state_updates=updates,
        updates_of={k: tuple(us) for k, us in updates_of.items()},
        scratch=scratch,
        random=frozenset(random),
    )


def _scratch(g: StepGraph, n: Node, version: int | None) -> int:
    def spec(name: str) -> TensorSpec | None:
        v = g.values.get(name) if name else None
        return v.spec if v is not None else None

    return scratch_bytes(n, [spec(i) for i in n.inputs], [spec(o) for o in n.outputs], version)


def _state_updates(g: StepGraph, n: Node) -> list[StateUpdate]:
    """Per output the kernel declares as a state update, the first input it may overwrite that
    holds persistent state (the declarations give one)."""
    version = g.opsets.get(n.domain or "")
    if not updates_state(n, version):
        return []
    out = []
    for j, candidates in may_overwrite(n, version).items():
        updated = n.outputs[j] if j < len(n.outputs) else ""
        if not updated:
            continue
        for i in candidates:
            src = n.inputs[i] if i < len(n.inputs) else ""
            if src in g.values and g.values[src].persistent:
                out.append(StateUpdate(n.name, j, i, src, updated))
                break
    return out
