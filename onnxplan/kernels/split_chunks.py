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

onnxplan.GatherRows: a chunk of a Gather over its table's rows (axis 0; split_ops.KIND_TABLE):
(table rows [start, stop) as a piece, the indices whole[, the output so far]) -> the output, with
`rows` the table's. The indices are normalized (a negative i is i + rows) and checked against the
whole table as Gather's kernel does (an index out of [-rows, rows) raises, in every chunk); the
chunk copies the table rows of the output positions whose index falls in [start, stop) and leaves
every other position as it finds it: chunk 0's output is a fresh buffer (positions no chunk has
written yet hold whatever the arena had), chunk j > 0's output is the output so far (input 2, in
place where the in-place pass lets it, else copied first). The chunks' ranges partition [0, rows)
(the split pass makes them so, planning.verify_plan checks it), so every position is written by
exactly one chunk, with the same bytes Gather copies: the same bits.

onnxplan.GatherGradRows: a chunk of com.microsoft GatherGrad (axis 0) over dW's rows: (shape,
indices, dY) whole -> dW rows [start, stop) (a piece, zeroed first), each row adding the dY rows
of the indices that fall in it, in the order of the indices, as GatherGrad's kernel adds them
(_xp.scatter_add: per row in the order of k), so the same bits.
"""

from __future__ import annotations

from typing import Any

from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels._xp import same_buffer, scatter_add
from onnxplan.kernels.conv_grad import conv_grad, conv_grad_scratch
from onnxplan.kernels.matmul import split_matmul
from onnxplan.kernels.registry import KernelContext, kernel

__all__ = ["GATHER_BLOCK", "GEMM_ADD_BLOCK", "conv_grad_weight", "gather_grad_rows", "gather_rows", "gemm_add",
           "piece_rows"]

GEMM_ADD_BLOCK = 4 << 20  # bytes of Y's rows a GemmAdd computes at a time (its scratch)
GATHER_BLOCK = 1 << 20  # bytes of gathered rows a GatherRows copies at a time (a temporary)


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


def _owned(ctx: KernelContext, indices) -> tuple[Any, Any]:
    """The positions (flat) of `indices` whose row lies in the chunk's [start, stop) of the
    table's `rows`, and those rows counted from start; an index out of range raises."""
    xp, rows = ctx.xp, int(ctx.attrs["rows"])
    start, stop = int(ctx.attrs["start"]), int(ctx.attrs["stop"])
    flat = indices.reshape(-1)
    if flat.size:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < -rows or hi >= rows:
            raise IndexError(f"{ctx.node.name}: index {lo if lo < -rows else hi} out of range [-{rows}, {rows - 1}]")
    flat = flat + rows * (flat < 0)  # an indices-sized temporary
    pos = xp.flatnonzero((flat >= start) & (flat < stop))
    return pos, flat[pos] - start


@kernel("GatherRows", "onnxplan", overwrites={0: (2,)})
def gather_rows(ctx: KernelContext, inputs, outputs) -> None:
    """out[p] = table[indices[p]] for the positions p whose index is in [start, stop) (module docstring)."""
    xp, piece, indices, out = ctx.xp, inputs[0], inputs[1], outputs[0]
    if len(inputs) > 2 and not same_buffer(inputs[2], out):
        xp.copyto(out, inputs[2])
    if not indices.size:  # no position to write
        return
    out2 = out.reshape(indices.size, -1)
    table = piece.reshape(int(ctx.attrs["stop"]) - int(ctx.attrs["start"]), out2.shape[1])
    pos, local = _owned(ctx, indices)
    step = max(1, GATHER_BLOCK // max(out2.shape[1] * out2.itemsize, 1))
    for lo in range(0, int(pos.size), step):
        out2[pos[lo:lo + step]] = table[local[lo:lo + step]]


@kernel("GatherGradRows", "onnxplan")
def gather_grad_rows(ctx: KernelContext, inputs, outputs) -> None:
    """dW rows [start, stop): zeros, then the dY rows of the indices in range added in their order."""
    xp, indices, dy, out = ctx.xp, inputs[1], inputs[2], outputs[0]
    out.fill(0)
    if not indices.size:
        return
    dw = out.reshape(1, int(ctx.attrs["stop"]) - int(ctx.attrs["start"]), -1)
    pos, local = _owned(ctx, indices)
    scatter_add(xp, dw, local, dy.reshape(indices.size, -1)[pos][None])
