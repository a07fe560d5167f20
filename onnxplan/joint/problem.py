"""What the joint solver sees: a fixed order of the step, stages over its backward part, and the
forward buffers whose presence in each stage is decided (kept, recomputed or paged in).

The step is ordered once (a heuristic order policy on the graph after realize / interleave; its
forward nodes first). Forward EOs are the forward pass, run once as is. The rest is cut into
**stages**: a stage starts at each non-forward node that reads a decided buffer (its *anchor*)
and runs to the next anchor; the first stage also holds what runs between the forward pass and
the first anchor. Between stages the solver may recompute forward nodes (just before the
anchor) and page buffers in; a buffer read by an anchor must be in memory at its stage.

A **decided buffer** is the alias group (views share it) of a transient value produced by a
forward node that the backward pass needs, directly or through a forward node it may recompute.
Every other transient buffer (backward values, gradients, the step's inputs, the loss) has the
fixed lifetime the order gives it; a step input that a recomputable node reads stays live the
whole step (conservative). Memory of an EO is its fixed bytes (scratch included) plus the
decided buffers present. In a stage, the recomputations run first, in forward order (at each,
the fixed bytes carried into the stage, the kept buffers, and the restored ones still held: made
by it or earlier and read by it or a later recomputation, or held for the anchor or the next
stage; a buffer with a reader at or after it counts as held), then
the anchor and the rest of the stage (the stage's most fixed bytes, the buffers kept into the
stage, and the restored ones the anchor reads or that are kept into the next stage).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from onnxplan.checkpoint.chain import nondeterminism
from onnxplan.checkpoint.costs import TimeModel
from onnxplan.checkpoint.dag import in_place, model_order
from onnxplan.errors import ModelError
from onnxplan.ir.graph import StepGraph
from onnxplan.offsets import lower_bound
from onnxplan.offsets.buffers import align
from onnxplan.passes.lifetimes import SCRATCH_PREFIX, lifetimes
from onnxplan.planning import HEURISTIC_ORDERS
from onnxplan.step_analysis import StepAnalysis, step_analysis

__all__ = [
    "Buffer",
    "Decisions",
    "JointProblem",
    "build_problem",
    "in_place",
    "least_bound_policy",
    "model_order",
    "node_costs",
    "write_release",
]


@dataclass(frozen=True)
class Buffer:
    """A decided buffer: its root value, aligned bytes, producer, and where it is needed."""

    root: str
    nbytes: int  # aligned
    producer: int  # index of the producing node in JointProblem.nodes (-1: not recomputable)
    born: int  # EO of its producer
    last_forward: int  # EO of its last forward reader (>= born)
    reads: frozenset[int]  # stages whose anchor reads it
    last_need: int  # last stage it is needed in (read, or an input of a recomputation)
    swappable: bool = False
    # paged out: the last forward EO its memory is held while its write runs (n_forward: still
    # pending when the backward starts), and the write's seconds no forward compute hides
    release: int = -1  # -1: last_forward + 1
    write_exposed: float = 0.0

    @property
    def held_until(self) -> int:
        return self.last_forward + 1 if self.release < 0 else self.release


@dataclass
class JointProblem:
    graph: StepGraph  # the step after realize / interleave (what the recompute pass rewrites)
    order: tuple[str, ...]  # forward nodes first
    policy: str  # the order policy that gave it
    persistent: int  # bytes outside the arena
    fixed: list[int]  # per EO: aligned bytes of the fixed buffers live there, scratch included
    carried: list[int]  # per EO: aligned bytes of the fixed buffers live before it and at it (no scratch)
    n_forward: int  # EOs 0 .. n_forward-1 are the forward pass
    starts: list[int]  # starts[t-1]: first EO of stage t (t = 1..T); the anchor is at anchors[t-1]
    anchors: list[str]
    buffers: list[Buffer]
    nodes: list[str]  # recomputable forward nodes, in order
    node_seconds: list[float]  # their costs
    node_inputs: list[tuple[int, ...]]  # decided buffers each recomputable node reads
    node_outputs: list[tuple[int, ...]]  # decided buffers it writes
    node_scratch: list[int]  # aligned scratch bytes of each
    step_seconds: float  # the step without recomputation or swap, by the same costs
    stage_seconds: list[float] = field(default_factory=list)  # compute of each stage (no recompute)
    forward_seconds: float = 0.0
    forward_eo_seconds: list[float] = field(default_factory=list)  # compute of each forward EO
    io_cpu_per_byte: float = 0.0  # the I/O thread's CPU per byte moved (onnxplan.swap.pricing.StoreRates)
    views: dict[str, list[str]] = field(default_factory=dict)  # forward node -> view nodes of its outputs

    @property
    def stages(self) -> int:
        return len(self.starts)

    def stage_range(self, t: int) -> range:
        end = self.starts[t] if t < len(self.starts) else len(self.order)
        return range(self.starts[t - 1], end)

    def stage_fixed(self, t: int) -> int:
        return max(self.fixed[e] for e in self.stage_range(t))

    def forward_base(self, e: int) -> int:
        """Bytes at forward EO `e` no decision changes: fixed ones, and decided buffers
        between their producer and last forward reader."""
        return self.fixed[e] + sum(b.nbytes for b in self.buffers if b.born <= e <= b.last_forward)


def node_costs(graph: StepGraph, costs: Mapping[str, float] | None = None) -> dict[str, float]:
    """Seconds per node: `costs` where given (a profile), else the FLOP/byte estimate."""
    times = TimeModel()
    given = costs or {}
    return {n.name: float(given[n.name]) if n.name in given else times.node_seconds(graph, n) for n in graph.nodes}


def least_bound_policy(graph: StepGraph, post: StepGraph | None = None) -> str:
    """The heuristic order policy whose order (forward first) has the least live-bytes bound
    on the graph after the in-place pass (file order of the policies on ties)."""
    post = post if post is not None else in_place(graph)
    bounds = [(lower_bound(lifetimes(post, model_order(graph, p, post)).buffers), k, p)
              for k, p in enumerate(HEURISTIC_ORDERS)]
    return min(bounds)[2]


def build_problem(graph: StepGraph, costs: Mapping[str, float] | None = None, *, policy: str = "nntrainer",
                  order: tuple[str, ...] | None = None, swap_min_bytes: int | None = None,
                  swap_bandwidth: float | None = None, io_cpu_per_byte: float = 0.0) -> JointProblem:
    """The problem for `graph` (after realize / interleave; no recompute, swap or in-place yet),
    in the order of `policy` (a heuristic order policy, or "auto": the one of least bound).
    `swap_min_bytes`: decided buffers at least this large may be paged out (None: none).
    `swap_bandwidth`: the store's bytes/s, which sets how long a paged buffer's memory is held
    while its write runs (write_release; None: one EO after its last forward use);
    `io_cpu_per_byte`: the I/O thread's CPU per byte moved, priced as pricing.StepPrice does."""
    post = in_place(graph)
    if policy == "auto":
        policy = least_bound_policy(graph, post)
    b = _Build.of(graph, post, order or model_order(graph, policy, post))
    anchors, starts, direct = _anchors(b)
    need, node_need = _needs(b, direct)
    decided = [r for r in b.cand if need[r] > 0]
    index = {r: k for k, r in enumerate(decided)}
    recomputable = [x for x in b.fwd if not b.is_view[x] and node_need.get(x, 0) > 0
                    and not nondeterminism(b.sa.nodes[x], b.sa)
                    and not any(o and b.sa.roots.get(o) in b.outputs for o in b.sa.nodes[x].outputs)]
    rindex = {x: k for k, x in enumerate(recomputable)}
    fixed, carried = _fixed_bytes(b, index, recomputable)
    buffers = [_buffer(b, r, rindex, direct, need, swap_min_bytes) for r in decided]
    node_inputs, node_outputs, node_scratch = _node_buffers(b, recomputable, index)
    sec = node_costs(graph, costs)
    order = b.order
    prob = JointProblem(
        graph=graph, order=order, policy=policy, persistent=graph.persistent_bytes, fixed=fixed, carried=carried,
        n_forward=len(b.fwd), starts=starts, anchors=anchors, buffers=buffers, nodes=recomputable,
        node_seconds=[sec[x] for x in recomputable], node_inputs=node_inputs, node_outputs=node_outputs,
        node_scratch=node_scratch, step_seconds=sum(sec.values()), views=_views(b),
        forward_seconds=sum(sec[x] for x in b.fwd), io_cpu_per_byte=io_cpu_per_byte)
    prob.stage_seconds = [sum(sec[order[e]] for e in prob.stage_range(t)) for t in range(1, prob.stages + 1)]
    prob.forward_eo_seconds = [sec[order[e]] for e in range(prob.n_forward)]
    if swap_bandwidth:
        prob.buffers = [replace(x, release=r, write_exposed=w) if x.swappable else x for x in prob.buffers
                        for r, w in [write_release(prob, x, swap_bandwidth)]]
    return prob


@dataclass(frozen=True)
class _Build:
    """What build_problem's parts share: the graph before and after the in-place pass, their
    analyses, the order, and the candidate roots (transient, produced by a non-view forward
    node, not a step output) with their producers."""

    g: StepGraph
    post: StepGraph
    sa: StepAnalysis
    post_sa: StepAnalysis
    order: tuple[str, ...]
    eo: dict[str, int]
    fwd: list[str]
    outputs: set[str]
    is_view: dict[str, bool]
    cand: dict[str, str]

    @classmethod
    def of(cls, g: StepGraph, post: StepGraph, order: tuple[str, ...]) -> _Build:
        sa = step_analysis(g)
        eo = {x: i for i, x in enumerate(order)}
        fwd = [x for x in order if sa.nodes[x].phase == "forward"]
        if any(eo[x] >= len(fwd) for x in fwd):
            raise ModelError("the model order must run the forward pass first")
        outputs = {sa.roots[o] for o in g.outputs if o in sa.roots}
        is_view = {n.name: bool(n.aliases) and all(k == "rv" for _, k in n.aliases.values()) for n in g.nodes}
        cand = {}
        for r in sa.members:
            p = sa.producer.get(r)
            if g.values[r].persistent or p is None or sa.nodes[p].phase != "forward" or is_view[p] or r in outputs:
                continue
            cand[r] = p
        return cls(g, post, sa, step_analysis(post), tuple(order), eo, fwd, outputs, is_view, cand)


def _anchors(b: _Build) -> tuple[list[str], list[int], dict[str, set[int]]]:
    """(anchors: non-forward nodes reading a candidate root, the first EO of each stage, root ->
    the stages whose anchor reads it)."""
    roots, nodes = b.sa.roots, b.sa.nodes
    anchors = [x for x in b.order[len(b.fwd):] if any(i and roots.get(i) in b.cand for i in nodes[x].inputs)]
    starts = [b.eo[a] for a in anchors]
    if not starts:
        raise ModelError(f"{b.g.name}: the backward pass reads no forward value: nothing to recompute or swap")
    starts[0] = len(b.fwd)
    direct: dict[str, set[int]] = {}
    for t, a in enumerate(anchors, start=1):
        for i in nodes[a].inputs:
            if i and roots.get(i) in b.cand:
                direct.setdefault(roots[i], set()).add(t)
    return anchors, starts, direct


def _needs(b: _Build, direct: dict[str, set[int]]) -> tuple[dict[str, int], dict[str, int]]:
    """(root -> the last stage it is needed in, forward node -> the last stage it may be
    recomputed for), in reverse forward order: a view needs its source's buffer wherever the
    view is needed."""
    roots, cand = b.sa.roots, b.cand
    need: dict[str, int] = {r: max(direct.get(r, {0})) for r in cand}
    node_need: dict[str, int] = {}
    for x in reversed(b.fwd):
        n = b.sa.nodes[x]
        outs = [roots[o] for o in n.outputs if o and roots.get(o) in cand and cand[roots[o]] == x]
        node_need[x] = max((need[r] for r in outs), default=0)
        if b.is_view[x]:
            node_need[x] = max((need.get(roots[o], 0) for o in n.outputs if o), default=0)
        for i in n.inputs:
            if i and roots.get(i) in cand and node_need[x] and not b.is_view[x]:
                need[roots[i]] = max(need[roots[i]], node_need[x])
    return need, node_need


def _fixed_bytes(b: _Build, index: dict[str, int], recomputable: list[str]) -> tuple[list[int], list[int]]:
    """(fixed, carried) per EO: every transient buffer but the decided ones, merged in place as the
    in-place pass merges them; a buffer that the pass merges with a decided one counts its own
    span unmerged; step inputs a recomputable node reads live the whole step."""
    roots, post_roots = b.sa.roots, b.post_sa.roots
    lt = lifetimes(b.g, b.order)
    lt_post = lifetimes(b.post, b.order)
    with_decided = {post_roots[r] for r in index}
    step_inputs = {roots[v] for v in b.g.inputs if v in roots}
    whole = {roots[i] for x in recomputable for i in b.sa.nodes[x].inputs if i and roots.get(i) in step_inputs}
    n_eo = len(b.order)
    fixed, carried = [0] * n_eo, [0] * n_eo
    spans = [x for x in lt_post.buffers if x.name not in with_decided]
    spans += [x for x in lt.buffers if x.name not in index and post_roots.get(x.name) in with_decided]
    for x in spans:
        if not x.nbytes:
            continue
        lo, hi = (0, n_eo - 1) if post_roots.get(x.name, x.name) in whole or x.name in whole else (x.first, x.last)
        for e in range(lo, hi + 1):
            fixed[e] += x.padded
            if e > lo and not x.name.startswith(SCRATCH_PREFIX):
                carried[e] += x.padded
    return fixed, carried


def _buffer(b: _Build, r: str, rindex: dict[str, int], direct: dict[str, set[int]], need: dict[str, int],
            swap_min_bytes: int | None) -> Buffer:
    """The decided buffer of root r; a buffer the in-place pass merges with another is not paged."""
    vs, p = b.sa.members[r], b.cand[r]
    fwd_reads = [b.eo[x] for v in vs for x in b.sa.consumers.get(v, ()) if b.sa.nodes[x].phase == "forward"]
    nbytes = align(max(b.g.values[v].nbytes for v in vs))
    merged = set(b.post_sa.members.get(b.post_sa.roots[r], ()))
    return Buffer(r, nbytes, rindex.get(p, -1), b.eo[p], max([b.eo[p], *fwd_reads]), frozenset(direct.get(r, ())),
                  need[r], swappable=swap_min_bytes is not None and nbytes >= max(swap_min_bytes, 1)
                  and merged == set(vs))


def _node_buffers(b: _Build, recomputable: list[str], index: dict[str, int]):
    """Per recomputable node: the decided buffers it reads, those it writes, its aligned scratch."""
    roots = b.sa.roots
    ins, outs, scratch = [], [], []
    for x in recomputable:
        n = b.sa.nodes[x]
        ins.append(tuple(sorted({index[roots[i]] for i in n.inputs if i and roots.get(i) in index})))
        outs.append(tuple(sorted({index[roots[o]] for o in n.outputs if o and roots.get(o) in index})))
        scratch.append(align(b.post_sa.scratch.get(x, 0)))
    return ins, outs, scratch


def _views(b: _Build) -> dict[str, list[str]]:
    """Forward node -> the forward view nodes over its outputs' buffers."""
    views: dict[str, list[str]] = {}
    for x in b.fwd:
        if b.is_view[x]:
            src = next(i for i in b.sa.nodes[x].inputs if i)
            base = b.sa.producer.get(b.sa.roots.get(src, src))
            if base is not None:
                views.setdefault(base, []).append(x)
    return views


def write_release(prob: JointProblem, b: Buffer, bandwidth: float) -> tuple[int, float]:
    """(the last forward EO b's memory is held, seconds exposed) of paging b out: its write is
    issued after its last forward use and must be done before its memory is reused, so the
    memory is held over the forward EOs whose compute hides the write (at least one EO);
    n_forward when the forward pass ends first (pending into stage 1), with what is left."""
    need = b.nbytes / bandwidth
    done = 0.0
    for e in range(b.last_forward + 1, prob.n_forward):
        done += prob.forward_eo_seconds[e]
        if done >= need:
            return e, 0.0
    return prob.n_forward, need - done


@dataclass(frozen=True)
class Decisions:
    """One point of the model: (stage, node) recomputed before the stage's anchor, (stage, buffer)
    kept in memory from the stage before, buffers written to the swap store after their last
    forward use, (stage, buffer) paged in for the stage (issued one stage ahead, or earlier:
    `early` holds (stage, buffer, issue stage) for a page-in issued at the start of an earlier
    stage, so that the compute of the stages between hides its transfer)."""

    recompute: frozenset[tuple[int, int]] = frozenset()
    keep: frozenset[tuple[int, int]] = frozenset()
    page_out: frozenset[int] = frozenset()
    page_in: frozenset[tuple[int, int]] = frozenset()
    early: frozenset[tuple[int, int, int]] = frozenset()

    def present(self, prob: JointProblem, t: int, b: int) -> bool:
        p = prob.buffers[b].producer
        return (t, b) in self.keep or (t, b) in self.page_in or (p >= 0 and (t, p) in self.recompute)

    def issued(self) -> dict[tuple[int, int], int]:
        """(stage, buffer) -> the stage at whose start each page-in is issued."""
        out = {(t, b): t - 1 for t, b in self.page_in}
        out.update(((t, b), s) for t, b, s in self.early)
        return out
