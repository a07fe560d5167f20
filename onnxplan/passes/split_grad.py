"""Split fused gradient nodes into their halves (NNTrainer's CG and CD as separate EOs).

ONNX Runtime's ConvGrad computes dX (the derivative, NNTrainer's CD) and dW, dB (the gradient,
CG) in one node, so X, dY, dX and dW are live at once. Rewrite rule: a ConvGrad with dX and
at least one of dW, dB becomes
- `NAME/dW` = ConvGrad(dY, X, W) -> ("", dW, dB): reads X;
- `NAME/dX` = onnxplan.ConvGradInput(dY, W) -> dX, with X's shape as `x_shape`: does not read X.
Same kernels (ConvGrad's with one part requested), same bits. An order may now run the dW half,
let X die, then create dX: the working set of the node drops from X + dY + dX + dW to the larger
of X + dY + dW and dY + dX. No FLOPs are added (the halves are separate products). Control
dependencies on the fused node become dependencies on both halves. Idempotent.
"""

from __future__ import annotations

from onnxplan.ir.graph import Node, StepGraph
from onnxplan.passes._infra import PassResult

__all__ = ["SPLIT_OPS", "split_grad", "splittable"]

MS = "com.microsoft"
SPLIT_OPS = {(MS, "ConvGrad")}


def splittable(n: Node) -> bool:
    """A ConvGrad that makes dX and at least one of dW, dB."""
    outs = [*n.outputs, "", "", ""][:3]
    return n.key in SPLIT_OPS and bool(outs[0]) and bool(outs[1] or outs[2]) and len(n.inputs) >= 3


def split_grad(graph: StepGraph) -> PassResult:
    targets = [n for n in graph.nodes if splittable(n)]
    if not targets:
        return PassResult(graph, False, [])
    g = graph.copy()
    halves: dict[str, list[str]] = {}
    nodes: list[Node] = []
    for n in g.nodes:
        if not splittable(n):
            nodes.append(n)
            continue
        outs = [*n.outputs, "", "", ""][:3]
        dy, x, w = n.inputs[:3]
        dw_half = Node(f"{n.name}/dW", n.op_type, n.domain, list(n.inputs), ["", outs[1], outs[2]],
                       dict(n.attrs), n.phase, {}, list(n.after))
        attrs = {**n.attrs, "x_shape": [int(d) for d in g.values[x].known_spec.shape]}
        dx_half = Node(f"{n.name}/dX", "ConvGradInput", "onnxplan", [dy, w], [outs[0]], attrs, n.phase,
                       {}, list(n.after))
        nodes += [dw_half, dx_half]
        halves[n.name] = [dw_half.name, dx_half.name]
    for n in nodes:
        if any(a in halves for a in n.after):
            n.after = [h for a in n.after for h in halves.get(a, [a])]
    g.nodes = nodes
    return PassResult(g, True, [f"split-grad: {len(targets)} ConvGrad node(s) into dW and dX halves"])
