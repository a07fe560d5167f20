"""The chain view: the forward graph cut at single-tensor cuts into stages, with per-stage costs."""

from __future__ import annotations

from dataclasses import dataclass

from onnxplan.checkpoint.costs import TimeModel
from onnxplan.checkpoint.schedule import ChainCosts
from onnxplan.errors import ModelError
from onnxplan.ir.analysis import forward_of_gradient
from onnxplan.ir.graph import Node, StepGraph
from onnxplan.kernels.registry import may_overwrite
from onnxplan.step_analysis import StepAnalysis, step_analysis

__all__ = ["Chain", "Stage", "build_chain", "nondeterminism"]

def nondeterminism(node: Node, analysis: StepAnalysis) -> str:
    """Why `node` may not run twice ("" if it may): its kernel draws at random (KernelDecl.random),
    unless it is a Dropout whose `ratio` attribute (opset < 12) is 0, which keeps every element."""
    if node.name not in analysis.random:
        return ""
    ratio = node.attrs.get("ratio")
    if node.op_type == "Dropout" and ratio is not None and float(ratio) == 0.0:
        return ""
    seed = " (a seed fixes the generator's sequence, not each call's mask)" if "seed" in node.attrs else ""
    return f"{node.op_type} '{node.name}' is random{seed}"


@dataclass(frozen=True)
class Stage:
    """Stage l of the chain: forward nodes from a^(l-1) to a^l, and its backward B^l."""

    index: int  # 1-based
    nodes: tuple[str, ...]  # forward nodes, file order
    input: str  # a^(l-1) ("" for the first stage: it reads step inputs only)
    output: str  # a^l (the last stage: the loss)
    saved: tuple[str, ...]  # a-bar^l: values of the stage the backward reads, and a^l
    backward: tuple[str, ...]  # nodes of B^l, file order
    forward_seconds: float
    backward_seconds: float
    a_bytes: int
    abar_bytes: int
    delta_bytes: int  # bytes B^l hands to the stages before it (delta^(l-1))
    forward_overhead: int  # F_ck / F_none: peak beyond a^l (inner values, scratch)
    forward_all_overhead: int  # F_all: peak beyond a-bar^l
    backward_overhead: int  # B^l: peak beyond a-bar^l, delta^l and delta^(l-1)
    nondeterministic: str = ""  # why the stage may not run twice ("" if it may)


@dataclass(frozen=True)
class Chain:
    """The stages of one step's forward graph, in order, and what the cost model used."""

    stages: tuple[Stage, ...]
    time_source: str  # flops | profile

    @property
    def length(self) -> int:
        return len(self.stages)

    def costs(self) -> ChainCosts:
        st = self.stages
        wdelta = [s.delta_bytes for s in st] + [0]  # delta^(l-1) made by B^l; delta^L: the seed
        return ChainCosts.make(
            [s.forward_seconds for s in st], [s.backward_seconds for s in st],
            [0, *(s.a_bytes for s in st)], [s.abar_bytes for s in st], wdelta,
            [s.forward_overhead for s in st], [s.backward_overhead for s in st],
            [not s.nondeterministic for s in st], [s.forward_all_overhead for s in st])

    def stage_of(self) -> dict[str, int]:
        """Forward and backward node -> its stage."""
        out = {}
        for s in self.stages:
            out.update({n: s.index for n in s.nodes})
            out.update({n: s.index for n in s.backward})
        return out


def _cuts(a: StepAnalysis, fwd: list[Node], transient: set[str]) -> list[tuple[str, int]]:
    """(value, ancestor bitset) of every single-tensor cut, nested, in chain order."""
    index = {n.name: i for i, n in enumerate(fwd)}  # position among the forward nodes
    producer = {v: a.nodes[p] for v, p in a.producer.items() if p in index}  # made in the forward pass
    anc: dict[str, int] = {}
    for n in fwd:
        bits = 0
        for i in n.inputs:
            p = producer.get(i)
            if p is not None:
                bits |= anc[p.name] | (1 << index[p.name])
        for x in n.after:
            if x in anc:
                bits |= anc[x] | (1 << index[x])
        anc[n.name] = bits
    readers: dict[str, int] = {}
    for n in fwd:
        for i in n.inputs:
            if i in producer and i in transient:
                readers[i] = readers.get(i, 0) | (1 << index[n.name])
    flows = {v: (1 << index[producer[v].name], r) for v, r in readers.items()}
    found = []
    for v in readers:
        p = producer[v]
        if p.aliases.get(v, ("", ""))[1] == "rv":
            continue  # a view shares its source's buffer: cut at the source instead
        A = anc[p.name] | (1 << index[p.name])
        if all(w == v or not (A & pb) or not (rb & ~A) for w, (pb, rb) in flows.items()):
            found.append((v, A))
    found.sort(key=lambda x: (x[1].bit_count(), index[producer[x[0]].name]))
    chain: list[tuple[str, int]] = []
    for v, A in found:
        if not chain or (chain[-1][1] & ~A) == 0 and chain[-1][1] != A:
            chain.append((v, A))
    return chain


def _backward_stages(a: StepAnalysis, bwd: list[Node], fwd_stage: dict[str, int],
                     value_stage: dict[str, int], cut_values: set[str], last: int) -> dict[str, int]:
    """B-node -> stage: the forward node it is named after (`<fwd>_Grad/`); else the latest
    stage whose inner values it reads; else the earliest stage of the backward nodes that
    feed it; else the stage of its first reader; else the last stage."""
    in_bwd = {n.name for n in bwd}
    producer = {v: p for v, p in a.producer.items() if p in in_bwd}
    stage: dict[str, int | None] = {}
    for n in bwd:
        forward = forward_of_gradient(n.name, fwd_stage)
        found = None if forward is None else fwd_stage[forward]
        if found is None:
            inner = [value_stage[i] for i in n.inputs if i in value_stage and i not in cut_values]
            found = max(inner) if inner else None
        if found is None:
            fed = [s for i in n.inputs if i in producer and (s := stage.get(producer[i]))]
            found = min(fed) if fed else None
        stage[n.name] = found
    for n in reversed(bwd):
        if stage[n.name] is None:
            users = [s for o in n.outputs for r in a.consumers.get(o, ()) if r in in_bwd and (s := stage.get(r))]
            stage[n.name] = users[0] if users else last
    return {k: int(v) for k, v in stage.items() if v is not None}  # every node has its stage by now


def _peak(g: StepGraph, nodes: list[Node], roots: dict[str, str], counted, release: dict[str, int],
          live0: dict[str, int] | None = None) -> int:
    """Most bytes live while `nodes` run: buffers of `counted` values from their writer (or
    from the start, `live0`) to their index in `release` (kept when absent), plus each
    node's scratch. An output the kernel may write into a counted input dying at that node
    takes its buffer (as the in-place pass will)."""
    live: dict[str, int] = dict(live0 or {})
    peak = sum(live.values())
    scratch = step_analysis(g).scratch
    for k, n in enumerate(nodes):
        version = g.opsets.get(n.domain or "")
        overwrite = may_overwrite(n, version)
        for j, o in enumerate(n.outputs):
            if not o or not counted(o):
                continue
            r = roots.get(o, o)
            for i in overwrite.get(j, ()):
                x = n.inputs[i] if i < len(n.inputs) else ""
                rx = roots.get(x, x)
                if x and rx in live and release.get(rx, -2) == k and live[rx] == g.values[o].nbytes:
                    live[r] = live.pop(rx)  # the output lives on in the dying input's buffer
                    break
            else:
                live[r] = max(live.get(r, 0), g.values[o].nbytes)
        peak = max(peak, sum(live.values()) + scratch.get(n.name, 0))
        for r in [r for r in live if release.get(r, len(nodes)) <= k]:
            del live[r]
    return peak


def build_chain(graph: StepGraph, times: TimeModel | None = None) -> Chain:
    """Cut the forward graph at its single-tensor cuts: a value v is a cut when the forward
    nodes it depends on (and its producer) hand no other transient value to the rest of the
    forward graph. Residual blocks, transformer half-blocks and layers become stages."""
    times = times or TimeModel()
    fwd = [n for n in graph.nodes if n.phase == "forward"]
    if not fwd:
        raise ModelError(f"{graph.name}: no forward nodes to checkpoint")
    bwd = [n for n in graph.nodes if n.phase == "backward"]
    transient = {k for k, v in graph.values.items() if not v.persistent}
    a = step_analysis(graph)
    cuts = _cuts(a, fwd, transient)
    roots = a.roots
    index = {n.name: i for i, n in enumerate(fwd)}
    groups: list[list[Node]] = []
    prev = 0
    for _, A in cuts:
        groups.append([n for n in fwd if (A & ~prev) >> index[n.name] & 1])
        prev = A
    rest = [n for n in fwd if not (prev >> index[n.name]) & 1]
    if rest:
        groups.append(rest)
    else:  # the last cut feeds nothing forward: merge it into the stage before
        cuts = cuts[:-1]
    fwd_stage = {n.name: k + 1 for k, grp in enumerate(groups) for n in grp}
    value_stage = {o: fwd_stage[n.name] for n in fwd for o in n.outputs if o and o in transient}
    outputs = [v for v, _ in cuts] + [graph.loss or next(o for o in groups[-1][-1].outputs if o)]
    cut_values = set(outputs)
    bstage = _backward_stages(a, bwd, fwd_stage, value_stage, cut_values, len(groups))
    later_readers: dict[str, set[str]] = {}
    for n in graph.nodes:
        if n.phase != "forward":
            for i in n.inputs:
                later_readers.setdefault(i, set()).add(n.name)
    stages = []
    for k, grp in enumerate(groups):
        s = k + 1
        inp = outputs[k - 1] if k else ""
        out = outputs[k]
        saved = [o for n in grp for o in n.outputs if o in transient and (later_readers.get(o) or o == out)]
        b_nodes = [n for n in bwd if bstage[n.name] == s]
        in_root = roots.get(inp, inp) if inp else None
        abar = {roots.get(v, v): graph.values[v].nbytes for v in saved if roots.get(v, v) != in_root}
        b_names = {n.name for n in b_nodes}
        b_out = {o for n in b_nodes for o in n.outputs if o and o in transient}
        handed = {roots.get(o, o) for o in b_out if any(bstage.get(r, s) < s for r in later_readers.get(o, ()))}
        handed &= b_out
        f_none, f_all = _forward_peaks(graph, grp, roots, transient, inp, out, saved)
        stages.append(Stage(
            index=s, nodes=tuple(n.name for n in grp), input=inp, output=out, saved=tuple(saved),
            backward=tuple(n.name for n in b_nodes),
            forward_seconds=sum(times.node_seconds(graph, n) for n in grp),
            backward_seconds=sum(times.node_seconds(graph, n) for n in b_nodes),
            a_bytes=graph.values[out].nbytes, abar_bytes=sum(abar.values()),
            delta_bytes=sum(graph.values[o].nbytes for o in handed),
            forward_overhead=f_none - graph.values[out].nbytes, forward_all_overhead=f_all - sum(abar.values()),
            backward_overhead=_backward_peak(graph, b_nodes, b_names, roots, transient, handed, abar)
            - sum(abar.values()),
            nondeterministic="; ".join(filter(None, (nondeterminism(n, a) for n in grp))),
        ))
    return Chain(tuple(stages), times.source)


def _last_use(nodes: list[Node], roots: dict[str, str]) -> dict[str, int]:
    last: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for x in (*n.inputs, *n.outputs):
            if x:
                last[roots.get(x, x)] = k
    return last


def _forward_peaks(g, grp, roots, transient, inp, out, saved) -> tuple[int, int]:
    """Peak bytes of the stage's forward beyond a^(l-1): F_none (inner values die at their
    last reader in the stage, a^l stays) and F_all (the values of a-bar^l stay too)."""
    skip = roots.get(inp, inp) if inp else None
    counted = lambda v: v in transient and roots.get(v, v) != skip
    last = _last_use(grp, roots)
    keep_out = {roots.get(out, out)}
    none = _peak(g, grp, roots, counted, {r: k for r, k in last.items() if r not in keep_out})
    keep_all = keep_out | {roots.get(v, v) for v in saved}
    full = _peak(g, grp, roots, counted, {r: k for r, k in last.items() if r not in keep_all})
    return none, full


def _backward_peak(g, b_nodes, b_names, roots, transient, handed, abar: dict[str, int]) -> int:
    """Peak bytes of B^l beyond delta^l and what it hands on (delta^(l-1)): a-bar^l until its
    last reader in B^l, B^l's own values until theirs (gradients read later, by the
    optimizer, to the end of B^l)."""
    made = {o for n in b_nodes for o in n.outputs if o}
    last = _last_use(b_nodes, roots)
    release = {r: last.get(r, -1) for r in abar}
    for r, k in last.items():
        if r in made:
            release[r] = k
    outside = {roots.get(i, i) for n in g.nodes if n.name not in b_names for i in n.inputs if i in made}
    for r in outside:
        release.pop(r, None)  # read after B^l: live to its end
    counted = lambda v: v in transient and roots.get(v, v) in made and roots.get(v, v) not in handed
    live0 = {r: b for r, b in abar.items() if release.get(r, 0) >= 0}
    return _peak(g, b_nodes, roots, counted, release, live0)
