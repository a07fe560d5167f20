"""In-place lowering (NNTrainer's Modify View): an output takes a dying input's buffer.

Rewrite rule: output j of node n is aliased ("mv") to input i when
  - n's kernel declares that output j may overwrite input i (`overwrites` of its @kernel);
  - both have the same byte size and element size, and output j has no alias yet;
  - no other input of n lives in the same buffer (elementwise positions could differ);
  - the buffer holds no step output (the loss) and, unless n's kernel updates that very
    state in place (optimizer updates, BatchNorm running statistics), no persistent value;
  - every other reader of any value in that buffer is an ancestor of n, so in *every*
    execution order nothing reads the overwritten value later (NNTrainer's integrity rule,
    decided from the graph, not from op names). For state updates the pass adds control
    dependencies (readers of a parameter run before its update) instead, as the runtime's
    own in-place update implies.
"""

from __future__ import annotations

from onnxplan.ir.analysis import ancestor_sets
from onnxplan.ir.graph import StepGraph
from onnxplan.kernels.registry import may_overwrite, updates_state
from onnxplan.passes._infra import PassResult
from onnxplan.step_analysis import StepAnalysis, step_analysis

__all__ = ["inplace", "inplace_state"]


class _Buffers:
    """Union-find over values sharing a buffer, with each buffer's members and readers."""

    def __init__(self, a: StepAnalysis) -> None:
        self.root = dict(a.roots)
        self.members: dict[str, list[str]] = {r: list(vs) for r, vs in a.members.items()}
        self.readers: dict[str, set[str]] = {r: {x for v in vs for x in a.consumers.get(v, ())}
                                             for r, vs in a.members.items()}

    def merge(self, out: str, into: str) -> None:
        a, b = self.root[out], self.root[into]
        if a == b:
            return
        for v in self.members.pop(a):
            self.root[v] = b
            self.members[b].append(v)
        self.readers[b] |= self.readers.pop(a)


def inplace(graph: StepGraph) -> PassResult:
    """Alias outputs to dying inputs where the kernel and the graph allow it."""
    return _inplace(graph, state_only=False)


def inplace_state(graph: StepGraph) -> PassResult:
    """Only the state updates in place (optimizer, running statistics), as the runtime does;
    what `--no-inplace` keeps, so that switching in-place off measures the Modify-View
    lowering of activations and gradients alone."""
    return _inplace(graph, state_only=True)


def _inplace(graph: StepGraph, *, state_only: bool) -> PassResult:
    bufs = _Buffers(step_analysis(graph))
    index, anc = ancestor_sets(graph)
    g = graph.copy()
    outputs = set(g.outputs)
    made, control = 0, 0
    for n in g.nodes:
        version = g.opsets.get(n.domain or "")
        is_update = updates_state(n, version)
        if state_only and not is_update:
            continue
        overwrites = may_overwrite(n, version)
        for j, candidates in sorted(overwrites.items()):
            if j >= len(n.outputs) or not n.outputs[j] or n.outputs[j] in n.aliases:
                continue
            out = g.values[n.outputs[j]]
            for i in candidates:
                x = g.values.get(n.inputs[i]) if i < len(n.inputs) and n.inputs[i] else None
                if x is None or out.spec is None or x.spec is None or out.nbytes != x.nbytes \
                        or out.spec.itemsize != x.spec.itemsize:
                    continue
                root = bufs.root[x.name]
                group = bufs.members[root]
                if any(bufs.root.get(o) == root for o in n.inputs if o and o != x.name):
                    continue
                if not is_update and any(v in outputs or g.values[v].persistent for v in group):
                    continue
                late = [r for r in bufs.readers[root] - {n.name} if not (anc[n.name] >> index[r]) & 1]
                if late and (not is_update or any((anc[r] >> index[n.name]) & 1 for r in late)):
                    continue  # a later reader needs the value (or would have to follow n)
                if late:
                    n.after = sorted(set(n.after) | set(late))
                    for r in late:
                        anc[n.name] |= anc[r] | (1 << index[r])
                    control += len(late)
                n.aliases[out.name] = (x.name, "mv")
                bufs.merge(out.name, x.name)
                made += 1
                break
    notes = [f"in-place: {made} output(s) share a dying input's buffer"] if made else []
    if control:
        notes.append(f"in-place: {control} control dependency(ies) before optimizer updates")
    return PassResult(g, made > 0, notes)
