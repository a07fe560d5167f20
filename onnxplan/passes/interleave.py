"""Optimizer interleaving (NNTrainer "apply gradient", OLLA "early weight updates").

Rewrite rule: the joined optimizer node (AdamWOptimizer / SGDOptimizerV2 over all
parameters) is split into one update per parameter (onnxplan.AdamWUpdate(lr, step, p, g,
m, v) -> p', m', v'; onnxplan.SGDUpdate(lr, p, g) -> p'), each free to run as soon as its
gradient is final, so gradients stop living until the end of the step. The math is the
runtime's, parameter by parameter; in-place aliases and control dependencies of the joined
node are carried over to the update of the parameter they concern. The joined node's
`updated_flag` output is read by nobody and is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

from onnxplan.ir.graph import Node, StepGraph
from onnxplan.passes._infra import PassResult
from onnxplan.step_analysis import step_analysis

__all__ = ["UPDATE_OPS", "interleave"]

JOINED = {("com.microsoft", "AdamWOptimizer"): "AdamWUpdate", ("com.microsoft", "SGDOptimizerV2"): "SGDUpdate"}
UPDATE_OPS = frozenset({("onnxplan", "AdamWUpdate"), ("onnxplan", "SGDUpdate")})


def _split(n: Node, readers: Mapping[str, tuple[str, ...]]) -> list[Node]:
    k = int(n.attrs["num_params"])
    adamw = n.op_type == "AdamWOptimizer"
    head = n.inputs[:2] if adamw else n.inputs[:1]  # lr, step | lr
    blocks = len(n.inputs[len(head):]) // max(k, 1)
    col = lambda b, p: n.inputs[len(head) + b * k + p]
    attrs = {a: v for a, v in n.attrs.items() if a != "num_params"}
    updates = []
    for p in range(k):
        inputs = [*head, *(col(b, p) for b in range(blocks))]
        outputs = [n.outputs[1 + b * k + p] for b in range(blocks - 1)]  # skip the grads block
        state_inputs = [x for b, x in enumerate(inputs[len(head):]) if b != 1]
        aliases = {o: n.aliases[o] for o in outputs if o in n.aliases}
        touched = {r for x in state_inputs for r in readers.get(x, ())}
        after = [a for a in n.after if a in touched]
        updates.append(Node(f"{n.name}/{inputs[len(head)]}", JOINED[n.key], "onnxplan", inputs,
                            outputs, dict(attrs), "optimizer", aliases, after))
    return updates


def interleave(graph: StepGraph) -> PassResult:
    """Split the joined optimizer node into per-parameter updates (see module docstring)."""
    joined = [n for n in graph.nodes if n.key in JOINED]
    if not joined:
        return PassResult(graph, False, [])
    readers = step_analysis(graph).consumers
    g = graph.copy()
    nodes, count = [], 0
    for n in g.nodes:
        if n.key in JOINED:
            split = _split(n, readers)
            nodes.extend(split)
            count += len(split)
            g.values.pop(n.outputs[0], None)
        else:
            nodes.append(n)
    g.nodes = nodes
    return PassResult(g, True, [f"interleave: {len(joined)} optimizer node(s) -> {count} per-parameter updates"])
