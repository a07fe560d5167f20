"""Swap insertion: SwapOut / SwapIn nodes in the order, and each swapped buffer split in segments.

Rewrite rules, for every chosen gap of a buffer (an alias group, named by its root):
  - a node `swap-out:ROOT:K` (domain onnxplan, op SwapOut, phase "swap") reads the value that
    holds the buffer's bytes and runs right before the base node at its release EO: the
    buffer's life ends there. Attributes: slot (ROOT), nbytes, write (0: the store already
    holds these bytes), issue_after (the last use: the write may start right after it);
  - a node `swap-in:ROOT:K` (op SwapIn, no data input, a control dependency on the swap-out)
    outputs a fresh copy `VALUE@inK` (`VALUE@start` for an evicted persistent value) of every value of the buffer read in the segment that
    follows, before anything in that segment writes it (several outputs are read-only views of
    the first); it runs before the base node at its issue EO. Attributes: slot, nbytes, use;
  - readers in that segment read the copies, so each segment is its own buffer for the
    lifetimes, the offset planners and the verifier;
  - a persistent value (parameter, optimizer state) that is evicted becomes a SwappedValue:
    not persistent (no state slot; its segments live in the arena) and its home between steps
    is the swap store; its first segment starts with `swap-in:ROOT:start`, its last ends with
    the write-back `swap-out:ROOT:end`, and its updated copy is no longer a step output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from onnxplan.errors import OnnxplanError
from onnxplan.ir.graph import Node, StepGraph, Value, swap_in_suffix
from onnxplan.plan import PlannedSwap
from onnxplan.step_analysis import step_analysis
from onnxplan.swap.model import Gap, SwapModel
from onnxplan.swap.policies import Timing

__all__ = [
    "SWAP_DOMAIN",
    "Decision",
    "SwappedValue",
    "build_order",
    "decide_writes",
    "is_swap_node",
    "rewrite_graph",
    "swap_node_name",
]

SWAP_DOMAIN = "onnxplan"


@dataclass
class SwappedValue(Value):
    """A parameter or optimizer state whose home between steps is the swap store: inside the
    step it lives in the arena, in the segments its swap-ins and swap-outs leave in memory."""

    @property
    def persistent(self) -> bool:
        return False


@dataclass(frozen=True)
class Decision:
    gap: Gap
    timing: Timing
    write: bool


def is_swap_node(node: Node) -> bool:
    return node.domain == SWAP_DOMAIN and node.op_type in ("SwapOut", "SwapIn")


def decide_writes(model: SwapModel, gaps: list[Gap], timings: dict[Gap, Timing],
                  clean_drops: bool) -> list[Decision]:
    """Each chosen gap with its timing and whether its swap-out must write: it must unless
    clean drops are allowed and no write touched the buffer since its bytes were last stored
    (a persistent value is stored at the start of the step; a transient one never is)."""
    out = []
    by_root: dict[str, list[Gap]] = {}
    for g in gaps:
        by_root.setdefault(g.root, []).append(g)
    for root in sorted(by_root):
        group = model.groups[root]
        seq = sorted(by_root[root], key=lambda g: (1, 0) if g.wrap else (0, g.index))
        stored = group.persistent  # does the store hold the current bytes?
        since = -2  # writes at EOs >= since change the bytes after the last sync
        for g in seq:
            dirty = not stored or any(since <= w <= g.after for w in group.writes) or (
                g.wrap and any(w >= since for w in group.writes))
            write = dirty or not clean_drops
            out.append(Decision(g, timings[g], write))
            stored, since = True, g.before
    return out


def swap_node_name(kind: str, gap: Gap, end: bool) -> str:
    """The name of a gap's swap node: swap-out:ROOT:K / swap-in:ROOT:K (K: the gap's index;
    "start" / "end" for a persistent value's wrap gap)."""
    if gap.wrap:
        return f"swap-{kind}:{gap.root}:{'end' if end else 'start'}"
    return f"swap-{kind}:{gap.root}:{gap.index}"


def build_order(model: SwapModel, decisions: list[Decision]) -> tuple[list[str], list[PlannedSwap]]:
    """The base order with the swap nodes in place, and one PlannedSwap per decision.

    Before a base node: first the swap-outs that complete there (oldest use first), then the
    swap-ins issued there (earliest use first)."""
    n = model.n
    outs: dict[int, list[tuple]] = {}
    ins: dict[int, list[tuple]] = {}
    for d in decisions:
        g = d.gap
        outs.setdefault(d.timing.release, []).append((g.after, g.root, swap_node_name("out", g, True)))
        ins.setdefault(d.timing.issue, []).append((g.before, g.root, swap_node_name("in", g, False)))
    order: list[str] = []
    taken = set(model.order)
    for t in range(n + 1):
        for _, _, name in sorted(outs.get(t, ())) + sorted(ins.get(t, ())):
            if name in taken:
                raise OnnxplanError(f"swap node name {name!r} is already a node of the step")
            taken.add(name)
            order.append(name)
        if t < n:
            order.append(model.order[t])
    eo = {name: i for i, name in enumerate(order)}
    records = []
    for d in decisions:
        g = d.gap
        group = model.groups[g.root]
        out_name, in_name = swap_node_name("out", g, True), swap_node_name("in", g, False)
        records.append(PlannedSwap(
            g.root, group.nbytes, group.vclass, out_name, in_name, eo[out_name], eo[in_name],
            model.order[g.after] if g.after >= 0 else "", model.order[g.before], d.write, g.wrap))
    records.sort(key=lambda r: (r.out_eo, r.value))
    return order, records


def rewrite_graph(graph: StepGraph, order: list[str] | tuple[str, ...],
                  swaps: tuple[PlannedSwap, ...] | list[PlannedSwap]) -> StepGraph:
    """`graph` (after the plan's passes, without swap nodes) with the swap nodes of `swaps`
    inserted and the swapped buffers split in segments (see the module docstring); its nodes
    in `order`, which must hold every swap node. Deterministic: a plan's graph is rebuilt
    from the plan alone."""
    g = graph.copy()
    a = step_analysis(graph)
    roots, members = a.roots, a.members
    by_out = {s.out_node: s for s in swaps}
    by_in = {s.in_node: s for s in swaps}
    eo = {name: i for i, name in enumerate(order)}
    base = {n.name: n for n in g.nodes}
    if set(base) | set(by_out) | set(by_in) != set(eo):
        raise OnnxplanError("the order does not hold exactly the step's nodes and its swap nodes")

    # evicted persistent values: not persistent any more, not step outputs
    for s in swaps:
        if s.wraps:
            for v in members[s.value]:
                old = g.values[v]
                g.values[v] = SwappedValue(old.name, old.spec, old.vclass, old.trainable)
            g.outputs = [o for o in g.outputs if roots.get(o) != s.value]

    outs_of: dict[str, list[int]] = {}
    for s in swaps:
        outs_of.setdefault(s.value, []).append(s.out_eo)
    rename: dict[str, dict[str, str]] = {}  # root -> value -> its copy in the current segment
    holder: dict[str, str] = {}  # root -> the value holding the buffer's bytes now
    last_out: dict[str, str] = {}
    for v in graph.inputs:
        if v in roots:
            holder.setdefault(roots[v], v)
    nodes: list[Node] = []
    for t, name in enumerate(order):
        if name in by_in:
            s = by_in[name]
            end = min([e for e in outs_of.get(s.value, []) if e > t], default=len(order))
            node, copies = _swap_in(g, graph, s, name, order[t + 1:end], base, last_out.get(s.value))
            nodes.append(node)
            rename[s.value] = copies
            holder[s.value] = node.outputs[0]
        elif name in by_out:
            s = by_out[name]
            src = holder.get(s.value)
            if src is None:
                raise OnnxplanError(f"swap-out {name!r}: {s.value!r} holds nothing at EO {t}")
            nodes.append(Node(name, "SwapOut", SWAP_DOMAIN, [src], [],
                              {"slot": s.value, "nbytes": s.bytes, "write": int(s.write),
                               "issue_after": s.last_use}, "swap"))
            last_out[s.value] = name
            rename.pop(s.value, None)
            holder.pop(s.value, None)
        else:
            nd = base[name]
            nd.inputs = [_renamed(i, roots, rename) for i in nd.inputs]
            nd.aliases = {o: (_renamed(src, roots, rename), kind) for o, (src, kind) in nd.aliases.items()}
            for o in nd.outputs:
                if o and roots.get(o) in rename or (o and roots.get(o) in outs_of):
                    r = roots[o]
                    kind = nd.aliases.get(o, ("", ""))[1]
                    if kind != "rv" or r not in holder:
                        holder[r] = o
            nodes.append(nd)
    g.nodes = nodes
    return g


def _swap_in(g: StepGraph, graph: StepGraph, s: PlannedSwap, name: str, segment: tuple[str, ...] | list[str],
             base: dict[str, Node], last_out: str | None) -> tuple[Node, dict[str, str]]:
    """The swap-in node `name` of `s` and its copies (value -> copy) of every value of the buffer
    that the nodes of `segment` read and do not make themselves; the copy of a value of the
    buffer's full size holds the bytes, the others are read-only views of it. Values are added to g."""
    a = step_analysis(graph)
    inside = set(segment)
    needed: list[str] = []
    for other in segment:
        nd = base.get(other)
        for i in (nd.inputs if nd else ()):
            if i and a.roots.get(i) == s.value and a.producer.get(i) not in inside and i not in needed:
                needed.append(i)
    if not needed:
        raise OnnxplanError(f"swap-in {name!r}: nothing reads {s.value!r} before its next swap-out")
    needed.sort(key=lambda v: (graph.values[v].nbytes != s.bytes, v))
    copies = {v: v + swap_in_suffix(name.rsplit(":", 1)[1]) for v in needed}
    for v, c in copies.items():
        g.values[c] = replace(g.values[v], name=c)
    main = copies[needed[0]]
    aliases = {c: (main, "rv") for c in list(copies.values())[1:]}
    node = Node(name, "SwapIn", SWAP_DOMAIN, [], list(copies.values()),
                {"slot": s.value, "nbytes": s.bytes, "use": s.next_use}, "swap", aliases,
                [last_out] if last_out else [])
    return node, copies


def _renamed(v: str, roots: dict[str, str], rename: dict[str, dict[str, str]]) -> str:
    if not v:
        return v
    return rename.get(roots.get(v, ""), {}).get(v, v)
