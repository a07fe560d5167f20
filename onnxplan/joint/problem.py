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
from onnxplan.errors import ModelError
from onnxplan.ir.graph import StepGraph
from onnxplan.offsets import lower_bound
from onnxplan.offsets.buffers import align
from onnxplan.orders import order_nodes
from onnxplan.passes import run_pipeline
from onnxplan.passes.lifetimes import SCRATCH_PREFIX, lifetimes
from onnxplan.planning import HEURISTIC_ORDERS
from onnxplan.step_analysis import step_analysis
from onnxplan.swap.pricing import TRANSFER_SECONDS, Transfer, io_stalls

__all__ = [
    "Buffer",
    "Decisions",
    "JointProblem",
    "alive_at",
    "build_problem",
    "consumers",
    "early_issue",
    "in_place",
    "least_bound_policy",
    "memory",
    "minimal_keeps",
    "model_order",
    "needs",
    "node_costs",
    "recompute_stages",
    "relaxation_bound",
    "restored_at",
    "step_seconds",
    "violations",
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


def in_place(graph: StepGraph) -> StepGraph:
    """The graph after the in-place pass, as the planners will see it (same nodes)."""
    return run_pipeline(graph, ["inplace"])[0]


def model_order(graph: StepGraph, policy: str = "nntrainer", post: StepGraph | None = None) -> tuple[str, ...]:
    """The fixed order the model uses: `policy` on the graph after the in-place pass (`post`,
    computed when not given), its forward nodes moved first (they never depend on the rest)."""
    post = post if post is not None else in_place(graph)
    order = order_nodes(post, policy, buffer_of=step_analysis(post).roots).order
    nodes = step_analysis(graph).nodes
    return tuple([x for x in order if nodes[x].phase == "forward"] + [x for x in order if nodes[x].phase != "forward"])


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
    g = graph
    post = in_place(g)
    if policy == "auto":
        policy = least_bound_policy(g, post)
    order = order or model_order(g, policy, post)
    sa = step_analysis(g)
    nodes = sa.nodes
    eo = {x: i for i, x in enumerate(order)}
    fwd = [x for x in order if nodes[x].phase == "forward"]
    F = len(fwd)
    if any(eo[x] >= F for x in fwd):
        raise ModelError("the model order must run the forward pass first")
    roots, members, producer = sa.roots, sa.members, sa.producer
    outputs = {roots[o] for o in g.outputs if o in roots}
    is_view = {n.name: bool(n.aliases) and all(k == "rv" for _, k in n.aliases.values()) for n in g.nodes}

    # candidate roots: transient, produced by a non-view forward node, not a step output
    cand = {}
    for r, vs in members.items():
        v = g.values[r]
        p = producer.get(r)
        if v.persistent or p is None or nodes[p].phase != "forward" or is_view[p] or r in outputs:
            continue
        cand[r] = p
    # anchors: non-forward nodes reading a candidate root
    anchors = [x for x in order[F:] if any(i and roots.get(i) in cand for i in nodes[x].inputs)]
    starts = [eo[a] for a in anchors]
    if not starts:
        raise ModelError(f"{g.name}: the backward pass reads no forward value: nothing to recompute or swap")
    starts[0] = F
    stage_of_anchor = {a: t + 1 for t, a in enumerate(anchors)}
    direct: dict[str, set[int]] = {}
    for a in anchors:
        for i in nodes[a].inputs:
            if i and roots.get(i) in cand:
                direct.setdefault(roots[i], set()).add(stage_of_anchor[a])
    # recomputable nodes and the last stage each root is needed in (reverse forward order)
    readers: dict[str, list[str]] = {}
    for x in fwd:
        for i in nodes[x].inputs:
            if i and roots.get(i) in cand:
                readers.setdefault(roots[i], []).append(x)
    need: dict[str, int] = {r: max(direct.get(r, {0})) for r in cand}
    node_need: dict[str, int] = {}
    for x in reversed(fwd):
        n = nodes[x]
        outs = [roots[o] for o in n.outputs if o and roots.get(o) in cand and cand[roots[o]] == x]
        node_need[x] = max((need[r] for r in outs), default=0)
        if is_view[x]:  # a view needs its source's buffer wherever the view is needed
            view_need = max((need.get(roots[o], 0) for o in n.outputs if o), default=0)
            node_need[x] = view_need
        for i in n.inputs:
            if i and roots.get(i) in cand and node_need[x] and not is_view[x]:
                need[roots[i]] = max(need[roots[i]], node_need[x])
    decided = [r for r in cand if need[r] > 0]
    index = {r: k for k, r in enumerate(decided)}
    step_inputs = {roots[v] for v in g.inputs if v in roots}
    recomputable = [x for x in fwd if not is_view[x] and node_need.get(x, 0) > 0 and not nondeterminism(nodes[x], sa)
                    and not any(o and roots.get(o) in outputs for o in nodes[x].outputs)]
    rindex = {x: k for k, x in enumerate(recomputable)}
    sec = node_costs(g, costs)

    # fixed bytes per EO: every transient buffer but the decided ones, merged in place as the
    # in-place pass merges them; a buffer that the pass merges with a decided one counts its
    # own span unmerged; step inputs a recomputable node reads live the whole step
    lt = lifetimes(g, order)
    lt_post = lifetimes(post, order)
    post_roots = step_analysis(post).roots
    with_decided = {post_roots[r] for r in index}
    whole = {roots[i] for x in recomputable for i in nodes[x].inputs if i and roots.get(i) in step_inputs}
    n_eo = len(order)
    fixed = [0] * n_eo
    carried = [0] * n_eo
    spans = [b for b in lt_post.buffers if b.name not in with_decided]
    spans += [b for b in lt.buffers if b.name not in index and post_roots.get(b.name) in with_decided]
    for b in spans:
        if not b.nbytes:
            continue
        lo, hi = (0, n_eo - 1) if post_roots.get(b.name, b.name) in whole or b.name in whole else (b.first, b.last)
        for e in range(lo, hi + 1):
            fixed[e] += b.padded
            if e > lo and not b.name.startswith(SCRATCH_PREFIX):
                carried[e] += b.padded
    buffers = []
    rbv = sa.consumers
    post_members = step_analysis(post).members  # a buffer the in-place pass merges with another is not paged
    for r in decided:
        vs = members[r]
        p = cand[r]
        fwd_reads = [eo[x] for v in vs for x in rbv.get(v, ()) if nodes[x].phase == "forward"]
        nbytes = align(max(g.values[v].nbytes for v in vs))
        buffers.append(Buffer(
            r, nbytes, rindex.get(p, -1), eo[p], max([eo[p], *fwd_reads]), frozenset(direct.get(r, ())),
            need[r], swappable=swap_min_bytes is not None and nbytes >= max(swap_min_bytes, 1)
            and set(post_members.get(post_roots[r], ())) == set(vs)))
    node_inputs, node_outputs, node_scratch = [], [], []
    scratch = {b.name[len(SCRATCH_PREFIX):]: b.padded for b in lt_post.buffers if b.name.startswith(SCRATCH_PREFIX)}
    for x in recomputable:
        n = nodes[x]
        node_inputs.append(tuple(sorted({index[roots[i]] for i in n.inputs if i and roots.get(i) in index})))
        node_outputs.append(tuple(sorted({index[roots[o]] for o in n.outputs if o and roots.get(o) in index})))
        node_scratch.append(scratch.get(x, 0))
    views: dict[str, list[str]] = {}
    for x in fwd:
        if is_view[x]:
            src = next(i for i in nodes[x].inputs if i)
            base = producer.get(roots.get(src, src))
            if base is not None:
                views.setdefault(base, []).append(x)
    prob = JointProblem(
        graph=g, order=tuple(order), policy=policy, persistent=g.persistent_bytes, fixed=fixed, carried=carried,
        n_forward=F,
        starts=starts, anchors=anchors, buffers=buffers, nodes=recomputable,
        node_seconds=[sec[x] for x in recomputable], node_inputs=node_inputs, node_outputs=node_outputs,
        node_scratch=node_scratch, step_seconds=sum(sec.values()), views=views,
        forward_seconds=sum(sec[x] for x in fwd))
    prob.stage_seconds = [sum(sec[order[e]] for e in prob.stage_range(t)) for t in range(1, prob.stages + 1)]
    prob.forward_eo_seconds = [sec[order[e]] for e in range(F)]
    prob.io_cpu_per_byte = io_cpu_per_byte
    if swap_bandwidth:
        prob.buffers = [replace(b, release=r, write_exposed=x) if b.swappable else b for b in prob.buffers
                        for r, x in [write_release(prob, b, swap_bandwidth)]]
    return prob


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


def early_issue(prob: JointProblem, t: int, b: int, bandwidth: float) -> tuple[int, float] | None:
    """(issue stage, seconds left unhidden) of an early page-in of buffer b for stage t: the
    latest stage s <= t - 2 whose start leaves stages s .. t-1 (their compute, no recomputation)
    at least b's transfer time at `bandwidth`; when none does, the earliest allowed (stage 1,
    or the stage after the last one before t whose anchor reads b) with what stays exposed.
    None when stage t-1 alone hides it or no stage before t - 1 is allowed (the one-stage
    prefetch is all there is)."""
    buf = prob.buffers[b]
    low = max([1] + [r + 1 for r in buf.reads if r < t])
    need = buf.nbytes / bandwidth
    window = prob.stage_seconds[t - 2] if t >= 2 else 0.0  # stage t-1's compute (the one-stage prefetch)
    if window >= need:
        return None  # one stage ahead hides it
    for s in range(t - 2, low - 1, -1):
        window += prob.stage_seconds[s - 1]
        if window >= need:
            return s, 0.0
    return (low, need - window) if low <= t - 2 else None


def needs(prob: JointProblem, recompute) -> list[set[int]]:
    """Per buffer: the stages it must be in memory in (its anchors, and each recomputation
    that reads it)."""
    out = [set(b.reads) for b in prob.buffers]
    for t, n in recompute:
        for b in prob.node_inputs[n]:
            out[b].add(t)
    return out


def minimal_keeps(prob: JointProblem, recompute, page_in=()) -> frozenset[tuple[int, int]]:
    """The fewest keeps that give every need its buffer: kept from the last restore (forward
    pass, recomputation, page-in) up to each need."""
    restores: set[tuple[int, int]] = {(t, b) for t, b in page_in}
    for t, n in recompute:
        restores.update((t, b) for b in prob.node_outputs[n])
    keep = set()
    for b, ts in enumerate(needs(prob, recompute)):
        pending = False
        for t in range(prob.buffers[b].last_need, 0, -1):
            pending = pending or t in ts
            if (t, b) in restores:
                pending = False
            elif pending:
                keep.add((t, b))
    return frozenset(keep)


def violations(prob: JointProblem, d: Decisions) -> list[str]:
    """What makes `d` not a schedule (empty: it is one): a need not in memory, a keep of a
    buffer absent the stage before, a buffer both kept and restored, a page-in of a buffer
    never written, a recomputation of a paged buffer or of a stage past its need."""
    bad = []
    for b, ts in enumerate(needs(prob, d.recompute)):
        for t in ts:
            if not d.present(prob, t, b):
                bad.append(f"buffer {prob.buffers[b].root} needed at stage {t} is not in memory")
    for t, b in d.keep:
        if t > 1 and not d.present(prob, t - 1, b):
            bad.append(f"buffer {prob.buffers[b].root} kept into stage {t} was not in memory at {t - 1}")
        p = prob.buffers[b].producer
        if (t, b) in d.page_in or (p >= 0 and (t, p) in d.recompute):
            bad.append(f"buffer {prob.buffers[b].root} kept and restored at stage {t}")
    for t, b in d.page_in:
        if b not in d.page_out:
            bad.append(f"buffer {prob.buffers[b].root} paged in at stage {t} but never written")
    for t, b, s in d.early:
        if (t, b) not in d.page_in or not 1 <= s < t - 1:
            bad.append(f"buffer {prob.buffers[b].root}: an early page-in for stage {t} issued at stage {s}")
    for t, n in d.recompute:
        if any(b in d.page_out for b in prob.node_outputs[n]):
            bad.append(f"node {prob.nodes[n]} recomputed although an output is paged")
    return bad


def memory(prob: JointProblem, d: Decisions) -> tuple[int, list[int], list[int]]:
    """(peak with persistent bytes, bytes per forward EO, bytes per stage) of the model."""
    B = prob.buffers
    F = prob.n_forward
    fwd = []
    for e in range(F):
        m = prob.forward_base(e)
        for k, b in enumerate(B):
            if b.last_forward < e:
                m += b.nbytes * ((1, k) in d.keep)
            if b.last_forward < e <= b.held_until:
                m += b.nbytes * (k in d.page_out)
        fwd.append(m)
    stage = []
    readers = consumers(prob)
    issued = d.issued()
    for t in range(1, prob.stages + 1):
        ahead = sum(B[k].nbytes for (tt, k), s in issued.items() if s <= t < tt)
        if t == 1:
            ahead += sum(b.nbytes for k, b in enumerate(B) if k in d.page_out and b.held_until >= F)
        at_anchor = 0
        for k, b in enumerate(B):
            kept = (t, k) in d.keep
            restored = d.present(prob, t, k) and not kept
            at_anchor += b.nbytes * (kept or (restored and (t in b.reads or (t + 1, k) in d.keep)))
        m = prob.stage_fixed(t) + at_anchor + ahead
        kept = sum(b.nbytes for k, b in enumerate(B) if (t, k) in d.keep)
        here = [n for tt, n in d.recompute if tt == t]
        restored = [k for k in range(len(B)) if d.present(prob, t, k) and (t, k) not in d.keep] if here else []
        for n in here:
            m = max(m, prob.carried[prob.starts[t - 1]] + kept + ahead + prob.node_scratch[n]
                    + sum(B[k].nbytes for k in restored_at(prob, d, t, n, readers, restored)))
        stage.append(m)
    return prob.persistent + max(fwd + stage), fwd, stage


def consumers(prob: JointProblem) -> list[list[int]]:
    """Per buffer: the recomputable nodes that read it."""
    out: list[list[int]] = [[] for _ in prob.buffers]
    for n, ins in enumerate(prob.node_inputs):
        for b in ins:
            out[b].append(n)
    return out


def alive_at(prob: JointProblem, b: int, n: int, readers: list[list[int]]) -> bool | None:
    """Whether buffer b, restored in a stage, is still held when node n is recomputed there:
    True when n makes it or a node at or after n may read it, None when only if the anchor reads
    it or it is kept into the next stage, False when n comes before its producer."""
    p = prob.buffers[b].producer
    if p > n:
        return False
    if p == n or any(c >= n for c in readers[b]):
        return True
    return None


def restored_at(prob: JointProblem, d: Decisions, t: int, n: int, readers: list[list[int]] | None = None,
                restored: list[int] | None = None) -> list[int]:
    """The restored (recomputed or paged-in) buffers held while node n is recomputed in stage t
    (`readers`: consumers(prob); `restored`: the buffers present in t and not kept, when the
    caller has them)."""
    readers = readers if readers is not None else consumers(prob)
    if restored is None:
        restored = [k for k in range(len(prob.buffers)) if d.present(prob, t, k) and (t, k) not in d.keep]
    out = []
    for k in restored:
        b = prob.buffers[k]
        alive = alive_at(prob, k, n, readers) if (t, k) not in d.page_in else (
            True if any(c >= n for c in readers[k]) else None)
        if alive is None:
            alive = t in b.reads or (t + 1, k) in d.keep
        if alive:
            out.append(k)
    return out


def step_seconds(prob: JointProblem, d: Decisions, bandwidth: float | None = None) -> tuple[float, float, float]:
    """(predicted step seconds, recompute seconds, exposed transfer seconds): every node once,
    the recomputations, the executor's CPU per transfer (TRANSFER_SECONDS), and the larger of
    the I/O thread's CPU (prob.io_cpu_per_byte) and what one I/O worker cannot hide
    (onnxplan.swap.pricing.io_stalls, the swap module's footing) on the model's segments (each
    forward EO, then each stage with its recomputations): a page-out is issued after its
    buffer's last forward use and due where its memory is freed (Buffer.held_until), a stage's
    page-ins issued as the stage before starts (an early one as its issue stage starts) and due
    at its own start."""
    rec = [0.0] * (prob.stages + 1)
    for t, n in d.recompute:
        rec[t] += prob.node_seconds[n]
    stall = 0.0
    if bandwidth and (d.page_out or d.page_in):
        B = prob.buffers
        # one segment per forward EO, then one per stage: stage t starts at boundary F - 1 + t
        F = len(prob.forward_eo_seconds)
        segments = prob.forward_eo_seconds + [prob.stage_seconds[t - 1] + rec[t] for t in range(1, prob.stages + 1)]
        transfers = [Transfer(B[b].nbytes, B[b].last_forward + 1, min(B[b].held_until + 1, F), write=True)
                     for b in sorted(d.page_out)]
        transfers += [Transfer(B[b].nbytes, F - 1 + max(0, s), F - 1 + t)
                      for (t, b), s in sorted(d.issued().items())]
        transfers.sort(key=lambda tr: tr.issue)
        # the I/O thread's CPU delays the compute stream where it waits for nothing (pricing.StepPrice)
        moved = sum(tr.nbytes for tr in transfers)
        stall = max(sum(io_stalls(segments, transfers, bandwidth)), moved * prob.io_cpu_per_byte)
    handled = TRANSFER_SECONDS * (len(d.page_out) + len(d.page_in))
    return prob.step_seconds + sum(rec) + handled + stall, sum(rec), stall


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


def relaxation_bound(prob: JointProblem, budget: int, node_cost: list[float], swap_cost: float | None = None) -> float:
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
        need, cost = deficit, 0.0
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
