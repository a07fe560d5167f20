"""Matrix-product kernels: Gemm, MatMul, Einsum and ONNX Runtime's FusedMatMul/TransposeMatMul, straight into their outputs."""

from __future__ import annotations

import itertools

import numpy as np

from onnxplan.kernels import _xp
from onnxplan.kernels.registry import KernelContext, kernel

__all__ = ["fused_matmul", "fused_operand", "gemm", "matmul", "matmul_into"]

MS = "com.microsoft"


def matmul_into(xp, a, b, out) -> None:
    """out = a @ b (numpy.matmul semantics), written into `out` without a full-size temporary.

    A batched left operand times a matrix is folded into one 2-D product when the batch
    dimensions of `a` and `out` collapse into rows (one BLAS call instead of one per batch).
    """
    a, b, out = _matmul_views(a, b, out)
    xp.matmul(a, b, out=out)


def _matmul_views(a, b, out):
    """The (a, b, out) that matmul_into hands to one matmul call: a batched `a` times a matrix
    folded into rows where both `a` and `out` collapse, else the arrays as given."""
    if b.ndim == 2 and a.ndim > 2 and out.ndim == a.ndim:
        rows = out.size // out.shape[-1]
        a2, out2 = _rows_view(a, rows), _rows_view(out, rows)
        if a2 is not None and out2 is not None:
            return a2, b, out2
    return a, b, out


def _rows_view(x, rows: int):
    """x as a (rows, last) matrix when that is a view (leading dims contiguous), else None."""
    dims = [(n, st) for n, st in zip(x.shape[:-1], x.strides[:-1]) if n != 1]
    for (_n0, s0), (n1, s1) in itertools.pairwise(dims):
        if s0 != s1 * n1:
            return None
    return x.reshape(rows, x.shape[-1])


def _scale(xp, out, alpha: float) -> None:
    if alpha != 1.0:
        xp.multiply(out, out.dtype.type(alpha), out=out)


def _gemm_scratch(node, in_specs, out_specs) -> int:
    """beta*C with beta other than 0 or 1 and a C of more than 16 Ki elements: one C-sized buffer."""
    c = in_specs[2] if len(in_specs) > 2 else None
    beta = float(node.attrs.get("beta", 1.0))
    if c is None or beta in (0.0, 1.0) or c.numel <= 16384:
        return 0
    return c.nbytes


@kernel("Gemm", scratch=_gemm_scratch)
def gemm(ctx: KernelContext, inputs, outputs) -> None:
    """Y = alpha * op(A) @ op(B) + beta * C (C unidirectionally broadcast to Y)."""
    xp, attrs = ctx.xp, ctx.attrs
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    y = outputs[0]
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    xp.matmul(a, b, out=y)
    _scale(xp, y, float(attrs.get("alpha", 1.0)))
    beta = float(attrs.get("beta", 1.0))
    if c is None or beta == 0.0:
        return
    if beta == 1.0:
        xp.add(y, c, out=y)
    elif c.size <= 16384:
        xp.add(y, c * y.dtype.type(beta), out=y)
    else:
        scaled = ctx.scratch_array(0, c.shape, c.dtype)
        xp.multiply(c, c.dtype.type(beta), out=scaled)
        xp.add(y, scaled, out=y)


def _bind_matmul(ctx: KernelContext, inputs, outputs):
    """matmul_into's views chosen once: one matmul call per step, same bits."""
    if ctx.xp is not np:
        return None
    a, b, out = _matmul_views(inputs[0], inputs[1], outputs[0])

    def run(ctx_, inputs_, outputs_):
        np.matmul(a, b, out=out)

    return run


@kernel("MatMul", bind=_bind_matmul)
def matmul(ctx: KernelContext, inputs, outputs) -> None:
    """Y = A @ B with numpy.matmul semantics (batch broadcasting, 1-D promotion)."""
    matmul_into(ctx.xp, inputs[0], inputs[1], outputs[0])


def fused_operand(x, trans: bool, trans_batch: bool):
    """A FusedMatMul operand as the plain-matmul view it stands for (never a copy).

    transBatch moves the leading axis to the row position ([b0, b1.., r, c] -> [b1.., b0, c]);
    trans then swaps the last two axes.
    """
    if x.ndim < 2:
        return x
    if trans_batch and x.ndim > 2:
        x = x.transpose(*range(1, x.ndim - 1), 0, x.ndim - 1)
    if trans:
        x = x.swapaxes(-1, -2)
    return x


def _bind_fused_matmul(ctx: KernelContext, inputs, outputs):
    """fused_matmul's operand views and matmul_into's choice made once: same calls, same bits."""
    if ctx.xp is not np:
        return None
    attrs = ctx.attrs
    a = fused_operand(inputs[0], bool(attrs.get("transA", 0)), bool(attrs.get("transBatchA", 0)))
    b = fused_operand(inputs[1], bool(attrs.get("transB", 0)), bool(attrs.get("transBatchB", 0)))
    a, b, out = _matmul_views(a, b, outputs[0])
    y, alpha = outputs[0], float(attrs.get("alpha", 1.0))

    def run(ctx_, inputs_, outputs_):
        np.matmul(a, b, out=out)
        _scale(np, y, alpha)

    return run


@kernel("FusedMatMul", MS, bind=_bind_fused_matmul)
@kernel("TransposeMatMul", MS, bind=_bind_fused_matmul)
def fused_matmul(ctx: KernelContext, inputs, outputs) -> None:
    """Y = alpha * op(A) @ op(B), op = optional batch-axis move then transpose of the last two axes."""
    attrs = ctx.attrs
    a = fused_operand(inputs[0], bool(attrs.get("transA", 0)), bool(attrs.get("transBatchA", 0)))
    b = fused_operand(inputs[1], bool(attrs.get("transB", 0)), bool(attrs.get("transBatchB", 0)))
    matmul_into(ctx.xp, a, b, outputs[0])
    _scale(ctx.xp, outputs[0], float(attrs.get("alpha", 1.0)))


@kernel("Einsum")
def einsum(ctx: KernelContext, inputs, outputs) -> None:
    """numpy's einsum of the equation straight into the output (its sums of products, no BLAS)."""
    equation = ctx.attrs["equation"]
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    operands = [x for x in inputs if x is not None]
    if _xp.is_cupy(ctx.xp):  # CuPy's einsum takes no out=
        ctx.xp.copyto(outputs[0], ctx.xp.einsum(equation.replace(" ", ""), *operands))
        return
    ctx.xp.einsum(equation.replace(" ", ""), *operands, out=outputs[0])
