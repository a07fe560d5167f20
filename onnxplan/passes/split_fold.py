"""Folding a transposed weight into the products that read it (issue 28: GPT-2's tied LM head),
the split pass's `K = 1` (SplitSpec(node, 1)): the Transpose leaves the step, so no working set
holds a weight and its transposed copy at once.

GPT-2 small ties its LM head to the token embedding W [50257, 768] (147 MiB): the export reads
Transpose(W) -> W^T [768, 50257] in the forward product, and ORT's gradient makes dW^T = A^T dY
and Transpose(dW^T) -> dW. Each Transpose holds two 147 MiB tensors while it runs (294 MiB: above a
256 MiB budget whatever is split), and a transpose splits neither by its rows nor by pages. The
fold removes them instead, two rules, each exact up to the products' float32 rounding (the same
dot products, BLAS reading an operand transposed; tests/test_split_fold.py, and `run --verify`):
  - a Transpose (perm [1, 0]) read only as the right operand of products: MatMul(X, W^T) becomes
    com.microsoft FusedMatMul(X, W, transB=1), FusedMatMul(X, W^T, transB=b) becomes
    FusedMatMul(X, W, transB=1-b); the products then split over their rows as before;
  - a Transpose of the output of a Gemm(A, B, transA=1, transB=0) without C (a weight gradient
    A^T B) that nothing else reads: Gemm(B, A, transA=1, transB=0) -> (A^T B)^T directly (the
    node keeps its name, so its split over rows, a sum into one dW-sized buffer, applies).
Only under a budget below the floor (the budget layer asks for it, budget/split.py); other
plans are unchanged.
"""

from __future__ import annotations

from onnxplan.ir.graph import Node, StepGraph

__all__ = ["fold", "fold_refusal"]

MS = "com.microsoft"
_PRODUCT_ATTRS = {"alpha": 1.0, "transA": 0, "transBatchA": 0, "transBatchB": 0}


def _perm_swaps(g: StepGraph, node: Node) -> bool:
    """A Transpose of a rank-2 value that swaps its two axes."""
    x = node.inputs[0] if node.inputs else ""
    if x not in g.values or g.values[x].spec is None or len(g.values[x].known_spec.shape) != 2:
        return False
    perm = node.attrs.get("perm")
    return perm is None or [int(p) for p in perm] == [1, 0]


def _reads_as_right_operand(c: Node, t: str) -> bool:
    if c.inputs[:1] == [t] or len(c.inputs) < 2 or c.inputs[1] != t or c.after or c.aliases:
        return False
    if c.key == ("", "MatMul"):
        return True
    return c.key == (MS, "FusedMatMul") and not int(c.attrs.get("transBatchB", 0))


def _weight_gradient(g: StepGraph, node: Node) -> Node | None:
    """The Gemm(A, B, transA=1, transB=0) without C whose output only `node` reads, or None."""
    x = node.inputs[0]
    made = g.producers().get(x)
    if made is None or made.key != ("", "Gemm") or made.after or made.aliases:
        return None
    if not int(made.attrs.get("transA", 0)) or int(made.attrs.get("transB", 0)):
        return None
    if len([i for i in made.inputs if i]) != 2 or x in g.outputs:
        return None
    return made if [c.name for c in g.consumers().get(x, [])] == [node.name] else None


def fold_refusal(g: StepGraph, node: Node) -> str:
    """Why `node` is not folded into its products ("" when it is; module docstring)."""
    if node.key != ("", "Transpose") or not _perm_swaps(g, node):
        return f"op {node.op_type} is not a transpose of a matrix (only those fold into their products)"
    if node.after or node.aliases:
        return "the node aliases an input or has control dependencies"
    t = node.outputs[0]
    readers = g.consumers().get(t, [])
    if readers and t not in g.outputs and all(_reads_as_right_operand(c, t) for c in readers):
        return ""
    if _weight_gradient(g, node) is not None:
        return ""
    return "its output is read otherwise than as a product's right operand, and it transposes no weight gradient"


def fold(g: StepGraph, node: Node) -> None:
    """Fold Transpose `node` into the products around it (in place on `g`; fold_refusal is "")."""
    t, w = node.outputs[0], node.inputs[0]
    made = _weight_gradient(g, node)
    if made is not None:  # (A^T B)^T = B^T A: the Gemm makes the transposed gradient directly
        a, b = made.inputs[:2]
        fused = Node(made.name, "Gemm", "", [b, a], [t], {**made.attrs, "transA": 1, "transB": 0}, made.phase)
        del g.values[made.outputs[0]]
        g.nodes = [fused if n is made else n for n in g.nodes if n is not node]
        return
    for i, c in enumerate(g.nodes):
        if c.inputs[1:2] != [t]:
            continue
        trans_b = 1 - int(c.attrs.get("transB", 0)) if c.op_type == "FusedMatMul" else 1
        attrs = {**_PRODUCT_ATTRS, **(c.attrs if c.op_type == "FusedMatMul" else {}), "transB": trans_b}
        g.nodes[i] = Node(c.name, "FusedMatMul", MS, [c.inputs[0], w, *c.inputs[2:]], c.outputs, attrs, c.phase)
    g.nodes = [n for n in g.nodes if n is not node]
    del g.values[t]
