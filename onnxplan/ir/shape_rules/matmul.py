"""Shape rules for matrix products: MatMul, Gemm, Einsum and ONNX Runtime's FusedMatMul/TransposeMatMul."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import shape_rule
from onnxplan.ir.shape_rules._common import MS, attr, broadcast, fail, need, outputs
from onnxplan.ir.tensor import TensorSpec

__all__ = ["einsum_terms", "fused_operand_shape", "matmul_shape"]


def matmul_shape(node: Node, a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """numpy.matmul's output shape (1-D operands promoted, then the promotion removed)."""
    if not a or not b:
        raise fail("matmul of a scalar")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise fail(f"matmul of {tuple(a)} and {tuple(b)}: inner dimensions differ")
    out = broadcast(node, a2[:-2], b2[:-2])
    if len(a) > 1:
        out += (a2[-2],)
    if len(b) > 1:
        out += (b2[-1],)
    return out


@shape_rule("MatMul")
def _matmul(node, specs, consts):
    a, b = need(node, specs, 0), need(node, specs, 1)
    return outputs(node, TensorSpec(a.dtype, matmul_shape(node, a.shape, b.shape)))


@shape_rule("Gemm")
def _gemm(node, specs, consts):
    a, b = need(node, specs, 0), need(node, specs, 1)
    if a.rank != 2 or b.rank != 2:
        raise fail(f"Gemm needs 2-D operands, got {a.shape} and {b.shape}")
    m, k = a.shape[::-1] if attr(node, "transA", 0) else a.shape
    k2, n = b.shape[::-1] if attr(node, "transB", 0) else b.shape
    if k != k2:
        raise fail(f"Gemm of {a.shape} and {b.shape} (transA={attr(node, 'transA', 0)}, "
                         f"transB={attr(node, 'transB', 0)}): inner dimensions differ")
    if len(specs) > 2 and specs[2] is not None:
        broadcast(node, specs[2].shape, (m, n))  # C must broadcast to the output
    return outputs(node, TensorSpec(a.dtype, (m, n)))


def fused_operand_shape(shape: Sequence[int], trans: bool, trans_batch: bool) -> tuple[int, ...]:
    """A FusedMatMul operand as the plain-matmul [batch..., rows, cols] it stands for.

    transBatch moves the leading axis into the row position; trans swaps rows and columns.
    """
    shape = tuple(shape)
    if len(shape) < 2:
        return shape
    if trans_batch:
        batch, rows, cols = shape[1:-1], shape[0], shape[-1]
    else:
        batch, rows, cols = shape[:-2], shape[-2], shape[-1]
    return batch + ((cols, rows) if trans else (rows, cols))


@shape_rule("FusedMatMul", MS)
@shape_rule("TransposeMatMul", MS)
def _fused_matmul(node, specs, consts):
    a, b = need(node, specs, 0), need(node, specs, 1)
    a_eff = fused_operand_shape(a.shape, bool(attr(node, "transA", 0)), bool(attr(node, "transBatchA", 0)))
    b_eff = fused_operand_shape(b.shape, bool(attr(node, "transB", 0)), bool(attr(node, "transBatchB", 0)))
    return outputs(node, TensorSpec(a.dtype, matmul_shape(node, a_eff, b_eff)))


def einsum_terms(node: Node, equation: str, shapes: Sequence[Sequence[int]]) -> tuple[list[str], str, dict[str, int]]:
    """(input terms, output term, index -> size) of an Einsum, the ellipsis spelled out as digits
    ('0', '1'...: one per broadcast dim, right-aligned; at most 10)."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise fail(f"Einsum equation {equation!r} has {len(terms)} operands, the node {len(shapes)}")
    sizes: dict[str, int] = {}
    ellipsis_rank = 0
    spelled = []
    for term, shape in zip(terms, shapes):
        letters = term.replace("...", "")
        extra = len(shape) - len(letters)
        if extra < 0 or (extra and "..." not in term):
            raise fail(f"Einsum term {term!r} does not fit an operand of rank {len(shape)}")
        ellipsis_rank = max(ellipsis_rank, extra)
        full = term.replace("...", "".join(str(k) for k in range(extra)))  # right-aligned below
        spelled.append((full, extra))
    result_terms = []
    for (full, extra), shape in zip(spelled, shapes):
        shift = ellipsis_rank - extra
        term = "".join(str(int(ch) + shift) if ch.isdigit() else ch for ch in full)
        for ch, d in zip(term, shape):
            if ch in sizes and sizes[ch] != d and 1 not in (d, sizes[ch]):
                raise fail(f"Einsum index {ch!r} has sizes {sizes[ch]} and {d}")
            sizes[ch] = max(sizes.get(ch, d), d) if ch.isdigit() else (d if sizes.get(ch, 1) == 1 else sizes[ch])
        result_terms.append(term)
    ell = "".join(str(k) for k in range(ellipsis_rank))
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(result_terms)
        out = ell + "".join(sorted(ch for ch in set(letters) if not ch.isdigit() and letters.count(ch) == 1))
    for ch in out:
        if ch not in sizes:
            raise fail(f"Einsum output index {ch!r} is not an input index")
    return result_terms, out, sizes


@shape_rule("Einsum")
def _einsum(node, specs, consts):
    present = [need(node, specs, i) for i in range(len(node.inputs)) if node.inputs[i]]
    for spec in present:  # numpy's (and CuPy's) einsum computes only numpy's own dtypes
        if np.dtype(spec.dtype).isbuiltin != 1:
            raise fail(f"Einsum on {np.dtype(spec.dtype).name} is not supported (numpy's einsum has no such dtype)")
    equation = attr(node, "equation")
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    _, out, sizes = einsum_terms(node, equation, [s.shape for s in present])
    return outputs(node, TensorSpec(present[0].dtype, tuple(sizes[ch] for ch in out)))
