"""Realizer lowering (NNTrainer Table 1 adapted to ONNX training graphs).

Rewrite rules, applied until none matches:
  1. fold: a node all of whose outputs are statically known (shape subgraphs such as
     Shape -> Gather -> Concat, folded by the shape engine) is removed; its outputs become
     constants, so they cost nothing at run time;
  2. drop Identity: readers of its output read its input instead;
  3. read-only views: Reshape / Flatten / Squeeze / Unsqueeze outputs share their data
     input's buffer (alias kind "rv");
  4. reset accumulation: InPlaceAccumulatorV2 with a constant-true reset flag never reads its
     buffer, so the buffer input is dropped (the update is the incoming gradient).
Multi-output fan-out (NNTrainer's multiout layer) needs no node here: ONNX values already
have many readers, the backward graph already sums their derivatives, and lifetimes run
to the last reader.
"""

from __future__ import annotations

import numpy as np

from onnxplan.ir.graph import StepGraph, ValueClass
from onnxplan.passes._infra import PassResult

__all__ = ["READ_ONLY_VIEW_OPS", "realize"]

READ_ONLY_VIEW_OPS = {("", "Reshape"), ("", "Flatten"), ("", "Squeeze"), ("", "Unsqueeze")}


def _fold(g: StepGraph, notes: list[str]) -> bool:
    keep, changed = [], False
    for n in g.nodes:
        outs = [o for o in n.outputs if o]
        if outs and all(o in g.folded for o in outs) and not any(o in g.outputs for o in outs):
            for o in outs:
                g.initializers[o] = np.asarray(g.folded[o])
                g.values[o].vclass = ValueClass.CONSTANT
            changed = True
            continue
        keep.append(n)
    if changed:
        notes.append(f"fold: removed {len(g.nodes) - len(keep)} constant node(s)")
        g.nodes = keep
        _drop_unread_constants(g)
    return changed


def _drop_unread_constants(g: StepGraph) -> None:
    read = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
    for name in [k for k, v in g.values.items() if v.vclass == ValueClass.CONSTANT and k not in read]:
        del g.values[name]
        g.initializers.pop(name, None)


def _rename_reads(g: StepGraph, renames: dict[str, str]) -> None:
    """Every read of a key of `renames` reads its value instead, in one sweep over the nodes."""
    def to(v: str) -> str:
        return renames.get(v, v)

    for n in g.nodes:
        if any(i in renames for i in n.inputs):
            n.inputs = [to(i) for i in n.inputs]
        if any(src in renames for src, _ in n.aliases.values()):
            n.aliases = {o: (to(src), k) for o, (src, k) in n.aliases.items()}
    g.outputs = [to(o) for o in g.outputs]


def _drop_identity(g: StepGraph, notes: list[str]) -> bool:
    dropped = [n for n in g.nodes if n.key == ("", "Identity") and n.inputs and n.inputs[0]]
    renames: dict[str, str] = {}
    for n in dropped:  # file order: an Identity of an Identity reads the first one's source
        src = n.inputs[0]
        renames[n.outputs[0]] = renames.get(src, src)
        g.values.pop(n.outputs[0], None)
    if dropped:
        _rename_reads(g, renames)
        names = {n.name for n in dropped}
        g.nodes = [n for n in g.nodes if n.name not in names]
        for n in g.nodes:
            n.after = [a for a in n.after if a not in names]
        notes.append(f"identity: dropped {len(dropped)}")
    return bool(dropped)


def _views(g: StepGraph, notes: list[str]) -> bool:
    count = 0
    for n in g.nodes:
        if n.key in READ_ONLY_VIEW_OPS and n.outputs[0] not in n.aliases:
            n.aliases[n.outputs[0]] = (n.inputs[0], "rv")
            count += 1
    if count:
        notes.append(f"views: {count} read-only view(s)")
    return bool(count)


def _reset_accumulation(g: StepGraph, notes: list[str]) -> bool:
    count = 0
    for n in g.nodes:
        if n.key != ("com.microsoft", "InPlaceAccumulatorV2") or not n.inputs[0]:
            continue
        flag = n.inputs[2] if len(n.inputs) > 2 else ""
        if flag and flag in g.initializers and bool(np.all(g.initializers[flag])):
            n.inputs = ["", *n.inputs[1:]]
            count += 1
    if count:
        _drop_unread_inputs(g)
        notes.append(f"accumulation: {count} reset buffer(s) dropped")
    return bool(count)


def _drop_unread_inputs(g: StepGraph) -> None:
    read = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
    produced = {o for n in g.nodes for o in n.outputs}
    for name, v in list(g.values.items()):
        if name not in read and name not in produced and v.vclass in (ValueClass.GRADIENT, ValueClass.CONSTANT):
            del g.values[name]
            g.initializers.pop(name, None)


def realize(graph: StepGraph) -> PassResult:
    """Apply the realizer rules (see module docstring) to a copy of `graph`."""
    g = graph.copy()
    notes: list[str] = []
    changed = False
    for rule in (_fold, _drop_identity, _reset_accumulation, _views):
        changed |= rule(g, notes)
    return PassResult(g, changed, notes)


