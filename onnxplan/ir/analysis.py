"""Graph analyses at the IR level, shared by passes, orders, checkpointing, swapping and the executor:
dependencies, ancestors, alias groups, readers, and the forward node a gradient node belongs to."""

from __future__ import annotations

from collections.abc import Container

from onnxplan.ir.graph import StepGraph

__all__ = ["GRAD_MARK", "alias_roots", "ancestor_sets", "forward_of_gradient", "node_preds", "readers_by_value"]

GRAD_MARK = "_Grad/"  # ONNX Runtime names gradient nodes "<forward node>_Grad/<op>_<k>"


def forward_of_gradient(name: str, forward_names: Container[str]) -> str | None:
    """The forward node (one of `forward_names`) that gradient node `name` is named after: the
    shortest prefix before a GRAD_MARK that names one (forward names may themselves hold the mark)."""
    at = name.find(GRAD_MARK)
    while at > 0:
        if name[:at] in forward_names:
            return name[:at]
        at = name.find(GRAD_MARK, at + 1)
    return None


def node_preds(g: StepGraph) -> dict[str, list[str]]:
    """node -> nodes it must follow (data producers and control dependencies)."""
    producer = g.producers()
    preds = {}
    for n in g.nodes:
        ps = {producer[i].name for i in n.inputs if i in producer} | set(n.after)
        ps.discard(n.name)
        preds[n.name] = sorted(ps)
    return preds


def ancestor_sets(g: StepGraph) -> tuple[dict[str, int], dict[str, int]]:
    """(index of each node, bitset of its strict ancestors); nodes must be topologically sorted."""
    index = {n.name: i for i, n in enumerate(g.nodes)}
    preds = node_preds(g)
    anc: dict[str, int] = {}
    for n in g.nodes:
        bits = 0
        for p in preds[n.name]:
            if p not in anc:
                raise ValueError(f"node '{n.name}' runs before its dependency '{p}'")
            bits |= anc[p] | (1 << index[p])
        anc[n.name] = bits
    return index, anc


def alias_roots(g: StepGraph) -> dict[str, str]:
    """value -> the value whose buffer it lives in (following every view / in-place alias)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    for n in g.nodes:
        for out, (src, _kind) in n.aliases.items():
            parent[find(out)] = find(src)
    return {v: find(v) for v in g.values}


def readers_by_value(g: StepGraph) -> dict[str, list[str]]:
    """value -> names of the nodes that read it."""
    readers: dict[str, list[str]] = {}
    for n in g.nodes:
        for i in dict.fromkeys(n.inputs):
            if i:
                readers.setdefault(i, []).append(n.name)
    return readers
