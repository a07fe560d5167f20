"""The recompute pass for a schedule on the whole step graph ("dag." codes, which the joint solver
makes, onnxplan.joint): the recomputed nodes are copied right before the backward node (the
*anchor*) that needs them, by the recompute pass's own copy rules (onnxplan.checkpoint.recompute),
on the order the schedule was made for (`model_order`).

The code is "dag.<order policy>.<node count>." followed by one "A:n1-n2-..." per stage with
recomputations (A: the anchor's index in the graph's node list, n: the recomputed forward nodes'
indices). Replaying it orders the graph with the same policy (deterministic), so a plan file
rebuilds the same graph. Each recomputed node's forward views (Reshape, ... sharing its buffer)
are copied right after it, at no cost, so readers of a view read the new version.
"""

from __future__ import annotations

from collections import Counter

from onnxplan.checkpoint.recompute import (
    RECOMPUTE_PHASE,
    copy_node,
    is_recomputed,
    read_latest,
    stable_topological,
)
from onnxplan.errors import ModelError
from onnxplan.ir.graph import StepGraph, recompute_suffix
from onnxplan.orders import order_nodes
from onnxplan.passes._infra import PassResult
from onnxplan.passes.inplace import inplace
from onnxplan.step_analysis import step_analysis

__all__ = ["DAG_PREFIX", "dag_recompute_pass", "decode_recompute", "in_place", "lower_recompute", "model_order"]

DAG_PREFIX = "dag."  # a recompute code on the whole graph, not on the chain of stages


def in_place(graph: StepGraph) -> StepGraph:
    """The graph after the in-place pass, as the planners will see it (same nodes)."""
    return inplace(graph).graph


def model_order(graph: StepGraph, policy: str = "nntrainer", post: StepGraph | None = None) -> tuple[str, ...]:
    """The fixed order the model uses: `policy` on the graph after the in-place pass (`post`,
    computed when not given), its forward nodes moved first (they never depend on the rest)."""
    post = post if post is not None else in_place(graph)
    order = order_nodes(post, policy, buffer_of=step_analysis(post).roots).order
    nodes = step_analysis(graph).nodes
    return tuple([x for x in order if nodes[x].phase == "forward"] + [x for x in order if nodes[x].phase != "forward"])


def decode_recompute(code: str, graph: StepGraph) -> tuple[str, dict[str, list[str]]]:
    """(order policy, anchor node -> nodes recomputed before it) of a code, for `graph`."""
    try:
        _, policy, count, *parts = code.split(".")
        if int(count) != len(graph.nodes):
            raise ModelError(f"the joint recompute schedule is for a graph of {count} nodes; "
                             f"this one has {len(graph.nodes)}")
        batches = {}
        for part in parts:
            a, _, ns = part.partition(":")
            batches[graph.nodes[int(a)].name] = [graph.nodes[int(k)].name for k in ns.split("-")]
    except (ValueError, IndexError):
        raise ModelError(f"malformed joint recompute schedule {code[:40]!r}") from None
    return policy, batches


def _views(graph: StepGraph) -> dict[str, list[str]]:
    """Forward node -> the forward view nodes over its outputs' buffers, in file order."""
    a = step_analysis(graph)
    roots, producer = a.roots, a.producer
    out: dict[str, list[str]] = {}
    for n in graph.nodes:
        if n.phase == "forward" and n.aliases and all(k == "rv" for _, k in n.aliases.values()):
            src = next((i for i in n.inputs if i), "")
            base = producer.get(roots.get(src, src))
            if base is not None:
                out.setdefault(base, []).append(n.name)
    return out


def lower_recompute(graph: StepGraph, order: tuple[str, ...], batches: dict[str, list[str]]) -> PassResult:
    """`graph` with the nodes of batches[A] copied right before the anchor A (in `order`,
    whose forward nodes come first), every later reader reading the latest version; the
    graph's node list follows `order` (so the `given` order policy reproduces the model)."""
    if is_recomputed(graph):
        return PassResult(graph, False, [])
    if not batches:
        return PassResult(graph, False, [])
    a = step_analysis(graph)
    g = graph.copy()
    by_name = {n.name: n for n in g.nodes}
    eo = {x: i for i, x in enumerate(order)}
    views = _views(graph)
    current: dict[str, str] = {}
    count: Counter = Counter()
    seq = []
    last = None
    for x in order:
        n = by_name[x]
        if n.phase != "forward":
            made: set[str] = set()
            for y in sorted(batches.get(x, ()), key=eo.__getitem__):
                for z in (y, *views.get(y, ())):
                    count[z] += 1
                    seq.append(copy_node(g, a, by_name[z], recompute_suffix(count[z]), current, made, last))
            read_latest(n, current)
            last = x
        seq.append(n)
    g.nodes = stable_topological(seq)
    copies = sum(1 for n in g.nodes if n.phase == RECOMPUTE_PHASE)
    runs = sum(len(b) for b in batches.values())
    return PassResult(g, True, [(f"recompute (joint): {runs} recomputations of {len(set().union(*batches.values()))} "
                                f"forward nodes before {len(batches)} anchors, {copies} node copies")])


def dag_recompute_pass(code: str):
    """The recompute pass for a joint schedule's code (see the module docstring)."""

    def run(graph: StepGraph) -> PassResult:
        if is_recomputed(graph):
            return PassResult(graph, False, [])
        policy, batches = decode_recompute(code, graph)
        return lower_recompute(graph, model_order(graph, policy), batches)

    return run
