"""Kernels of the split pass's own chunk nodes (passes/split.py, passes/split_ops.py).

onnxplan.PieceRows: indices [start, stop) of `axis` of a value whole in the arena copied into a
chunk's piece (a small piece off the store's page; a dW ConvGrad's dY channels).

onnxplan.ConvGradWeight: a chunk of a dW ConvGrad split over dW's output channels (KIND_CHANNELS):
(dY's channels m0..m1, X) -> dW[m0:m1], with the piece's shape as the attribute `w_shape` and
ConvGrad's other attributes: dW's rows need dY's channels m0..m1 and all of X, not W's values.
Computed by ConvGrad's own kernel with only dW requested, on a zero-strided stand-in for W that is
never read (as ConvGradInput's for X).

onnxplan.GemmAdd: a chunk of a weight gradient summed over rows (passes/split.py's _Sums):
Y = alpha op(A) op(B) + beta C (C optional; chunk j > 0 has C the running sum and beta 1), Y
allowed to be C's memory (the running sum updated in place: one dW-sized buffer, not two), by
blocks of Y's rows: each block's product into a scratch block of at most GEMM_ADD_BLOCK bytes,
then added to C's rows. The same dot products as Gemm's, blocked otherwise (a few ulps:
tests/test_split_products.py). Blocks also keep OpenBLAS's working memory small: one product
with a transposed A of GPT-2's 50257 rows grew the process by 50 MiB outside the arena (its
packing of the whole operand), 4 MiB blocks of rows by 2 MiB.
"""

from __future__ import annotations

from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.conv_grad import conv_grad, conv_grad_scratch
from onnxplan.kernels.matmul import split_matmul
from onnxplan.kernels.registry import KernelContext, kernel

__all__ = ["GEMM_ADD_BLOCK", "conv_grad_weight", "gemm_add", "piece_rows"]

GEMM_ADD_BLOCK = 4 << 20  # bytes of Y's rows a GemmAdd computes at a time (its scratch)


def _scratch(node, in_specs, out_specs) -> int:
    dy, x = in_specs[0], in_specs[1]
    return conv_grad_scratch(node, [dy, x, TensorSpec(dy.dtype, tuple(int(d) for d in node.attrs["w_shape"]))],
                             [None, out_specs[0]])


@kernel("ConvGradWeight", "onnxplan", scratch=_scratch)
def conv_grad_weight(ctx: KernelContext, inputs, outputs) -> None:
    """dW of ConvGrad(dY, X, W) for W of shape w_shape."""
    xp, dy, x = ctx.xp, inputs[0], inputs[1]
    w = xp.broadcast_to(xp.zeros((), dtype=dy.dtype), tuple(int(d) for d in ctx.attrs["w_shape"]))
    conv_grad(ctx, [dy, x, w], [None, outputs[0]])


@kernel("PieceRows", "onnxplan")
def piece_rows(ctx: KernelContext, inputs, outputs) -> None:
    """outputs[0] = inputs[0][start:stop] along `axis` (0 unless given)."""
    axis = int(ctx.attrs.get("axis", 0))
    at = (slice(None),) * axis + (slice(int(ctx.attrs["start"]), int(ctx.attrs["stop"])),)
    ctx.xp.copyto(outputs[0], inputs[0][at])


def _row_bytes(y: TensorSpec) -> int:
    return y.nbytes // y.shape[0] if y.shape and y.shape[0] else y.nbytes


def _block_rows(y: TensorSpec) -> int:
    return max(1, min(y.shape[0] if y.shape else 1, GEMM_ADD_BLOCK // max(_row_bytes(y), 1)))


def _gemm_add_scratch(node, in_specs, out_specs) -> int:
    y = out_specs[0]
    return _block_rows(y) * _row_bytes(y) if y is not None and y.shape and y.shape[0] else 0


@kernel("GemmAdd", "onnxplan", overwrites={0: (2,)}, scratch=_gemm_add_scratch)
def gemm_add(ctx: KernelContext, inputs, outputs) -> None:
    """Y = alpha op(A) op(B) + beta C, Y possibly C's memory: by blocks of Y's rows (module docstring)."""
    xp, attrs, y = ctx.xp, ctx.attrs, outputs[0]
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    a = a.T if int(attrs.get("transA", 0)) else a
    b = b.T if int(attrs.get("transB", 0)) else b
    alpha, beta = (y.dtype.type(float(attrs.get(k, 1.0))) for k in ("alpha", "beta"))
    by_rows = c is not None and c.ndim == 2 and c.shape[0] == y.shape[0]  # else C broadcasts to every row
    step = _block_rows(TensorSpec(str(y.dtype), tuple(y.shape)))
    block = ctx.scratch_array(0, (step, *y.shape[1:]), y.dtype)
    for lo in range(0, y.shape[0], step):
        hi = min(y.shape[0], lo + step)
        part = block[:hi - lo]
        split_matmul(xp, a[lo:hi], b, part)
        if alpha != 1:
            xp.multiply(part, alpha, out=part)
        if c is None or beta == 0:
            xp.copyto(y[lo:hi], part)
            continue
        rows = c[lo:hi] if by_rows else c
        if beta != 1:  # beta C into Y's rows first (Y may be C's memory: the same rows), no temporary
            xp.multiply(rows, beta, out=y[lo:hi])
            xp.add(y[lo:hi], part, out=y[lo:hi])
        else:
            xp.add(rows, part, out=y[lo:hi])
