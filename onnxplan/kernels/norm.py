"""Normalization kernels: LayerNormalization (and its simplified form) with ONNX Runtime's
gradients, Instance/Group/Lp/MeanVariance normalization and LRN; the row-chunking and
elementwise-pass helpers batch_norm.py shares."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from math import prod
from typing import Any

import numpy as np

from onnxplan.kernels import _torch, _xp, norm_loops, parallel, scratch
from onnxplan.kernels.registry import KernelContext, KernelFn, bind_prepared, kernel, prepared_call
from onnxplan.kernels.scratch import align

__all__ = [
    "layer_norm",
    "layer_norm_grad",
    "rows_per_chunk",
    "simplified_layer_norm_grad",
]

MS = "com.microsoft"


def rows_per_chunk(rows: int, row_bytes: int) -> int:
    """Rows (or images) per chunk: as many as fit the scratch target (8 MiB), at least one."""
    return max(1, min(rows, scratch.SCRATCH_TARGET // max(row_bytes, 1)))


def _get(seq, i):
    return seq[i] if len(seq) > i else None


# From this many elements the BatchNorm and LayerNorm bind rules run their tensor-sized
# elementwise passes (subtract, multiply, divide, add by a per-channel or per-row vector; the
# layer norm's transposed copy) with torch's out= operators on zero-copy views: the same IEEE
# operation per element as numpy's ufunc (same bits), 1.2-3x faster with a broadcast operand;
# smaller tensors keep numpy (cheaper per call).
TORCH_ELEMS = 1 << 14


def _torch_passes(x) -> bool:
    return _torch.enabled() and x.size >= TORCH_ELEMS and x.dtype in (np.float32, np.float64)


def _ew_pass(xp: Any, use_torch: bool, op: str, a: Any, b: Any, out: Any) -> Callable[[], Any]:
    """A zero-argument call computing out = a <op> b elementwise (op: "subtract", "multiply",
    "divide", "add"; b broadcast): torch's out= operator on views made once, or xp's ufunc;
    same bits."""
    if use_torch:
        t, torch = _torch.tensor, _torch.load()
        fn = {"subtract": torch.sub, "multiply": torch.mul, "divide": torch.div, "add": torch.add}[op]
        ta, tb, to = t(a), t(b), t(out)
        return lambda: fn(ta, tb, out=to)
    ufunc = getattr(xp, op)
    return lambda: ufunc(a, b, out=out)


def _copy_pass(xp: Any, use_torch: bool, dst: Any, src: Any) -> Callable[[], Any]:
    """A zero-argument call copying src (a strided view, e.g. a transposed chunk) into dst:
    torch's copy_ (blocked for a matrix transpose) or xp's copyto; an exact copy either way."""
    if use_torch:
        td, ts = _torch.tensor(dst), _torch.tensor(src)
        return lambda: td.copy_(ts)
    return lambda: xp.copyto(dst, src)


def _ln_dims(shape, axis: int) -> tuple[int, int]:
    """(rows, normalized size) of a layer norm over the axes from `axis` on."""
    axis = axis + len(shape) if axis < 0 else axis
    return prod(shape[:axis]), prod(shape[axis:])


def _ln_chunk(rows: int, m: int, itemsize: int) -> tuple[int, int]:
    """(rows per chunk, columns of the transposed chunk): at least two columns, so numpy sums
    across rows of the transposed chunk in order instead of pairwise along one contiguous row."""
    nr = rows_per_chunk(rows, m * itemsize)
    return nr, max(nr, 2)


def _layer_norm_scratch(node, in_specs, out_specs) -> int:
    """A transposed chunk of rows (normalized size x rows, fitting 8 MiB) and two row vectors."""
    x = in_specs[0]
    rows, m = _ln_dims(x.shape, int(node.attrs.get("axis", -1)))
    _, cols = _ln_chunk(rows, m, x.itemsize)
    return align(m * cols * x.itemsize) + 2 * align(cols * x.itemsize)


# A layer norm (and its gradient) cuts each chunk's rows across the compute threads as a kernel
# of this many passes per element would (kernels.parallel.parts_for): a part from MIN_ELEMS /
# LN_PASSES elements. A part takes about 15 numpy or torch calls (the transposed copy, two sums,
# the square, three or four normalizing passes), and two parts running them at once contend for
# the interpreter lock between calls: at 16 (parts from 65K elements: transformer b16's 16 x 64 x
# 128 nodes in two) the split nodes took longer at 2 threads than whole, on an idle machine
# (LayerNormalization 1.29x, its gradient 1.44x, paired in one process: reports/threads.md,
# session 12). At 4, a part holds 256K elements or more. Each part keeps at least
# ROW_PART_MIN rows (a transposed part of one column would be summed pairwise, not in ORT's order).
LN_PASSES = 4
ROW_PART_MIN = 2


def row_parts(xp: Any, rows: int, m: int) -> list[tuple[int, int]]:
    """(lo, hi) ranges of a chunk's `rows` rows of `m` elements for the compute threads."""
    return parallel.row_parts(xp, rows, m, passes=LN_PASSES, min_rows=ROW_PART_MIN)


def _prepare_layer_norm(ctx: KernelContext, inputs: list, outputs: list, bound: bool,
                        simplified: bool) -> KernelFn:
    """ORT's LayerNormImpl: per row, sequential sums of x and x*x, then
    y = (x - mean) / sqrt(E[x^2] - mean^2 + eps) * scale + bias (simplified: x / sqrt(E[x^2] + eps) * scale).

    The sums run over a transposed copy so numpy reduces in ORT's left-to-right order. Every
    chunk's views made once (`bound`: the tensor-sized copy and elementwise passes by torch from
    TORCH_ELEMS elements, the same bits). A chunk's rows are cut across the compute threads
    (row_parts), each part with its own block of the transposed scratch and its own slice of
    the row vectors: every row's arithmetic as on one thread, the same bits.
    """
    xp = ctx.xp
    x, scale, bias = inputs[0], inputs[1], _get(inputs, 2)
    y = outputs[0]
    mean_out = None if simplified else _get(outputs, 1)
    inv_out = _get(outputs, 1 if simplified else 2)
    rows, m = _ln_dims(x.shape, int(ctx.attrs.get("axis", -1)))
    t = x.dtype.type
    eps, size, one = t(np.float32(ctx.attrs.get("epsilon", 1e-5))), t(m), t(1)
    x2, y2 = x.reshape(rows, m), y.reshape(rows, m)
    scale1 = scale.reshape(m)
    bias1 = bias.reshape(m) if bias is not None and not simplified else None
    if xp is np:  # one C call over the rows where the fused loops take the node (the numpy path's bits)
        fused = norm_loops.layer_norm_loops(x, scale, bias, y, mean_out, inv_out, rows, m, float(eps), simplified)
        if fused is not None:
            return fused
    nr, cols = _ln_chunk(rows, m, x.itemsize)
    vec_at = align(m * cols * x.itemsize)
    use_torch = bound and _torch_passes(x)

    def part(r0: int, lo: int, hi: int) -> Callable[[], None]:
        """Rows r0 + lo .. r0 + hi of the chunk at r0, with the scratch from its `lo`th column."""
        k = hi - lo
        kk = max(k, 2)
        xt = ctx.scratch_array(m * lo * x.itemsize, (m, kk), x.dtype)
        sums = ctx.scratch_array(vec_at + lo * x.itemsize, (kk,), x.dtype)
        squares = ctx.scratch_array(vec_at + align(cols * x.itemsize) + lo * x.itemsize, (kk,), x.dtype)
        mean, std = sums[:k], squares[:k]
        xc, yc = x2[r0 + lo:r0 + hi], y2[r0 + lo:r0 + hi]
        if simplified:
            normalize = [_ew_pass(xp, use_torch, "divide", xc, std[:, None], yc)]
        else:
            normalize = [_ew_pass(xp, use_torch, "subtract", xc, mean[:, None], yc),
                         _ew_pass(xp, use_torch, "divide", yc, std[:, None], yc)]
        normalize.append(_ew_pass(xp, use_torch, "multiply", yc, scale1, yc))
        if bias1 is not None:
            normalize.append(_ew_pass(xp, use_torch, "add", yc, bias1, yc))
        return partial(_layer_norm_rows, xp, simplified, size, eps, one,
                       _copy_pass(xp, use_torch and kk == k, xt[:, :k], xc.T), xt[:, k:] if kk > k else None, xt,
                       sums, squares, mean, std, xt[0, :k], normalize,
                       None if mean_out is None else mean_out.reshape(rows)[r0 + lo:r0 + hi],
                       None if inv_out is None else inv_out.reshape(rows)[r0 + lo:r0 + hi])

    chunks = [[part(r0, lo, hi) for lo, hi in row_parts(xp, min(nr, rows - r0), m)] for r0 in range(0, rows, nr)]

    def run(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        for tasks in chunks:
            parallel.run(tasks)

    return run


def _layer_norm_rows(xp: Any, simplified: bool, size: Any, eps: Any, one: Any, transpose: Callable[[], Any],
                     xt_pad: Any, xt: Any, sums: Any, squares: Any, mean: Any, std: Any, square: Any,
                     normalize: list[Callable[[], Any]], mean_o: Any, inv_o: Any) -> None:
    """One part of a chunk's rows: its transposed copy, sums, statistics, then Y."""
    transpose()
    if xt_pad is not None:
        xt_pad[...] = 0
    xp.sum(xt, axis=0, out=sums)
    xp.multiply(xt, xt, out=xt)
    xp.sum(xt, axis=0, out=squares)
    xp.divide(mean, size, out=mean)
    xp.divide(std, size, out=std)
    if not simplified:
        xp.multiply(mean, mean, out=square)
        xp.subtract(std, square, out=std)
    xp.add(std, eps, out=std)
    xp.sqrt(std, out=std)
    for step in normalize:
        step()
    if mean_o is not None:
        xp.copyto(mean_o, mean, casting="same_kind")
    if inv_o is not None:
        xp.divide(one, std, out=std)
        xp.copyto(inv_o, std, casting="same_kind")


_LN = partial(_prepare_layer_norm, simplified=False)
_RMS = partial(_prepare_layer_norm, simplified=True)


@kernel("LayerNormalization", scratch=_layer_norm_scratch, bind=bind_prepared(_LN))
@kernel("LayerNormalization", MS, scratch=_layer_norm_scratch, bind=bind_prepared(_LN))
def layer_norm(ctx: KernelContext, inputs, outputs) -> None:
    """(X, Scale, B?) -> Y, Mean?, InvStdDev? over the axes from `axis` on."""
    prepared_call(_LN, ctx, inputs, outputs)


@kernel("SimplifiedLayerNormalization", scratch=_layer_norm_scratch, bind=bind_prepared(_RMS))
@kernel("SimplifiedLayerNormalization", MS, scratch=_layer_norm_scratch, bind=bind_prepared(_RMS))
def simplified_layer_norm(ctx: KernelContext, inputs, outputs) -> None:
    """(X, Scale) -> Y, InvStdDev? (RMS norm: no mean, no bias)."""
    prepared_call(_RMS, ctx, inputs, outputs)


def _layer_norm_grad_scratch(node, in_specs, out_specs) -> int:
    """Normalized x for a chunk of rows (fitting 8 MiB), a dX workspace when dX is not wanted,
    two row vectors and two partial sums of the normalized size."""
    x = in_specs[1]
    rows, m = _ln_dims(x.shape, int(node.attrs.get("axis", -1)))
    nr = rows_per_chunk(rows, m * x.itemsize)
    block = align(nr * m * x.itemsize)
    work = block if not out_specs or out_specs[0] is None else 0
    return block + work + 2 * align(nr * x.itemsize) + 2 * align(m * x.itemsize)


def _sum_rows_into(xp, src, out, partial, first: bool) -> None:
    """out (+)= src summed over its rows (axis 0)."""
    if first:
        xp.sum(src, axis=0, out=out)
    else:
        xp.sum(src, axis=0, out=partial)
        xp.add(out, partial, out=out)


def _ln_grad_views(ctx: KernelContext, inputs, outputs, simplified: bool) -> tuple:
    """What (Simplified)LayerNormalizationGrad starts from: X, (rows, m), m as X's scalar type, the 2-D / 1-D views of every input and output (None
    where absent), rows per chunk and the scratch offsets (see _layer_norm_grad_scratch)."""
    dy, x, scale = inputs[0], inputs[1], inputs[2]
    mean = None if simplified else inputs[3]
    inv = inputs[3] if simplified else inputs[4]
    dx, dscale = _get(outputs, 0), _get(outputs, 1)
    dbias = None if simplified else _get(outputs, 2)
    rows, m = _ln_dims(x.shape, int(ctx.attrs.get("axis", -1)))
    nr = rows_per_chunk(rows, m * x.itemsize)
    block, vec = align(nr * m * x.itemsize), align(nr * x.itemsize)
    vec_at = block + (block if dx is None else 0)
    return (x, rows, m, x.dtype.type(m), x.reshape(rows, m), dy.reshape(rows, m),
            dx.reshape(rows, m) if dx is not None else None, scale.reshape(m),
            mean.reshape(rows) if mean is not None else None, inv.reshape(rows),
            dscale.reshape(m) if dscale is not None else None, dbias.reshape(m) if dbias is not None else None,
            nr, block, vec, vec_at, vec_at + 2 * vec)


def _prepare_layer_norm_grad(ctx: KernelContext, inputs: list, outputs: list, bound: bool,
                             simplified: bool) -> KernelFn:
    """ORT's LayerNormGrad: xhat = (x - mean) * inv_std, B = dY * scale * inv_std,
    dX = B - mean(B) - xhat * mean(B * xhat), dscale = sum(dY * xhat), dbias = sum(dY). Every
    chunk's views made once (`bound`: the tensor-sized elementwise passes by torch from
    TORCH_ELEMS elements, the same bits). Two passes over each chunk across the compute threads:
    by columns, xhat and dY * xhat and their sums over the rows (dscale, dbias: each column
    summed in the same order), then by rows (row_parts) dX: every element's arithmetic as on
    one thread, the same bits."""
    xp = ctx.xp
    (x, rows, m, size, x2, dy2, dx2, scale1, mean1, inv1, dscale1, dbias1, nr, block, vec, vec_at,
     part_at) = _ln_grad_views(ctx, inputs, outputs, simplified)
    part = ctx.scratch_array(part_at, (m,), x.dtype)
    part_b = ctx.scratch_array(part_at + align(m * x.itemsize), (m,), x.dtype) if dbias1 is not None else None
    if xp is np:  # the fused loops where they take the node (dscale and dbias in the numpy path's order)
        fused = norm_loops.layer_norm_grad_loops(dy2, x2, scale1, mean1, inv1, dx2, dscale1, dbias1, part, part_b,
                                                 rows, m, nr, simplified)
        if fused is not None:
            return fused
    use_torch = bound and _torch_passes(x)

    def ew(op: str, a: Any, b: Any, out: Any) -> Callable[[], Any]:
        return _ew_pass(xp, use_torch, op, a, b, out)

    def rows_task(passes: list[Callable[[], Any]]) -> Callable[[], None]:
        return partial(_run_all, passes)

    chunks = []
    for r0 in range(0, rows, nr):
        k = min(nr, rows - r0)
        xh_c = ctx.scratch_array(0, (k, m), x.dtype)
        ws_c = dx2[r0:r0 + k] if dx2 is not None else ctx.scratch_array(block, (k, m), x.dtype)
        mean_b_c = ctx.scratch_array(vec_at, (k,), x.dtype)
        mean_c_c = ctx.scratch_array(vec_at + vec, (k,), x.dtype)
        first = []  # by columns: xhat, dY * xhat, then their sums over the rows (dscale, dbias)
        # two columns a part at least: one column's sum over the rows would be a strided run numpy
        # sums pairwise, not row by row as the whole kernel does (other bits)
        for lo, hi in parallel.bounds(m, max(1, min(len(row_parts(xp, k, m)), m // 2))):
            xc, dyc, xh, ws = x2[r0:r0 + k, lo:hi], dy2[r0:r0 + k, lo:hi], xh_c[:, lo:hi], ws_c[:, lo:hi]
            steps = [ew("subtract", xc, mean1[r0:r0 + k, None], xh) if mean1 is not None
                     else _copy_pass(xp, use_torch, xh, xc), ew("multiply", xh, inv1[r0:r0 + k, None], xh)]
            if dscale1 is not None:
                steps += [ew("multiply", dyc, xh, ws), partial(_sum_rows_into, xp, ws, dscale1[lo:hi], part[lo:hi],
                                                               r0 == 0)]
            if dbias1 is not None and part_b is not None:
                steps.append(partial(_sum_rows_into, xp, dyc, dbias1[lo:hi], part_b[lo:hi], r0 == 0))
            first.append(rows_task(steps))
        second = []  # by rows: dX
        for lo, hi in row_parts(xp, k, m) if dx2 is not None else []:
            a, b = r0 + lo, r0 + hi
            xh, ws, mean_b, mean_c = xh_c[lo:hi], ws_c[lo:hi], mean_b_c[lo:hi], mean_c_c[lo:hi]
            dyc, inv_c = dy2[a:b], inv1[a:b, None]
            dots = partial(xp.matmul, ws[:, None, :], xh[:, :, None], out=mean_c.reshape(hi - lo, 1, 1))
            centre_b: list[Callable[[], Any]] = [] if simplified else [partial(xp.sum, ws, axis=1, out=mean_b),
                                                                      partial(xp.divide, mean_b, size, out=mean_b),
                                                                      ew("subtract", ws, mean_b[:, None], ws)]
            second.append(rows_task([ew("multiply", dyc, scale1, ws), ew("multiply", ws, inv_c, ws), dots,
                                     partial(xp.divide, mean_c, size, out=mean_c), *centre_b,
                                     ew("multiply", xh, mean_c[:, None], xh), ew("subtract", ws, xh, ws)]))
        chunks.append((first, second))

    def run(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        for first, second in chunks:
            parallel.run(first)
            parallel.run(second)

    return run


def _run_all(passes: list[Callable[[], Any]]) -> None:
    for step in passes:
        step()


_LN_GRAD = partial(_prepare_layer_norm_grad, simplified=False)
_RMS_GRAD = partial(_prepare_layer_norm_grad, simplified=True)


@kernel("LayerNormalizationGrad", MS, scratch=_layer_norm_grad_scratch, bind=bind_prepared(_LN_GRAD))
def layer_norm_grad(ctx: KernelContext, inputs, outputs) -> None:
    """(dY, X, scale, mean, inv_std_dev) -> dX, dscale, dbias."""
    prepared_call(_LN_GRAD, ctx, inputs, outputs)


@kernel("SimplifiedLayerNormalizationGrad", MS, scratch=_layer_norm_grad_scratch, bind=bind_prepared(_RMS_GRAD))
def simplified_layer_norm_grad(ctx: KernelContext, inputs, outputs) -> None:
    """(dY, X, scale, inv_std_dev) -> dX, dscale."""
    prepared_call(_RMS_GRAD, ctx, inputs, outputs)


# ---- InstanceNormalization / GroupNormalization: rows of X normalized, then a per-channel affine ----
def _normalize_rows(xp, x2, y2, eps: float) -> None:
    """y2[r] = (x2[r] - mean) / sqrt(var + eps) per row (biased variance, computed in float64 from
    the centred values), a few rows at a time."""

    rows, m = x2.shape
    step = max(1, _xp.block_elems(np.float64, xp) // max(1, m))
    for r0 in range(0, rows, step):
        block = x2[r0:r0 + step].astype(np.float64)
        block -= block.mean(axis=1, keepdims=True)
        var = (block * block).mean(axis=1, keepdims=True)
        block /= xp.sqrt(var + eps)
        xp.copyto(y2[r0:r0 + step], block, casting="unsafe")


def _affine(xp, y, scale, bias) -> None:
    """y[n, c, ...] = y * scale[c] + bias[c]."""
    y3 = y.reshape(y.shape[0], y.shape[1], -1)
    xp.multiply(y3, scale.reshape(-1, 1), out=y3)
    xp.add(y3, bias.reshape(-1, 1), out=y3)


@kernel("InstanceNormalization", overwrites={0: (0,)})
def instance_norm(ctx: KernelContext, inputs, outputs) -> None:
    """Y = (X - mean) / sqrt(var + epsilon) * scale[c] + B[c], statistics per image and channel."""
    x, scale, bias = inputs[:3]
    y = outputs[0]
    n, c = x.shape[0], x.shape[1]
    _normalize_rows(ctx.xp, x.reshape(n * c, -1), y.reshape(n * c, -1), float(ctx.attrs.get("epsilon", 1e-5)))
    _affine(ctx.xp, y, scale, bias)


@kernel("GroupNormalization", overwrites={0: (0,)})
def group_norm(ctx: KernelContext, inputs, outputs) -> None:
    """Statistics per image and group of C / num_groups channels; scale and bias per group (opset 18)
    or per channel (opset 21), told apart by their length."""
    xp = ctx.xp
    x, scale, bias = inputs[:3]
    y = outputs[0]
    n, c, groups = x.shape[0], x.shape[1], int(ctx.attrs["num_groups"])
    _normalize_rows(xp, x.reshape(n * groups, -1), y.reshape(n * groups, -1), float(ctx.attrs.get("epsilon", 1e-5)))
    if scale.size != c:  # per group: each group's value for its channels
        scale, bias = xp.repeat(scale, c // groups), xp.repeat(bias, c // groups)
    _affine(xp, y, scale, bias)


@kernel("LpNormalization", overwrites={0: (0,)})
def lp_normalization(ctx: KernelContext, inputs, outputs) -> None:
    """Y = X / ||X||_p along axis (p 1 or 2; 0 where the norm is 0), a few rows at a time."""

    xp, x, y = ctx.xp, inputs[0], outputs[0]
    p = int(ctx.attrs.get("p", 2))
    if p not in (1, 2):
        raise ValueError(f"{ctx.node.name}: LpNormalization p={p} is neither 1 nor 2")
    pre, dim, post = _xp.axis3(x.shape, int(ctx.attrs.get("axis", -1)))

    def block(o, v):
        norm = xp.abs(v).sum(axis=1, keepdims=True) if p == 1 else xp.sqrt((v * v).sum(axis=1, keepdims=True))
        norm[norm == 0] = 1  # a zero vector stays zero (ORT and ONNX), not 0 / 0
        xp.divide(v, norm, out=o)

    step = max(1, _xp.block_elems(x.dtype, xp) // max(1, dim * post))
    x3, y3 = x.reshape(pre, dim, post), y.reshape(pre, dim, post)
    for r0 in range(0, pre, step):
        block(y3[r0:r0 + step], x3[r0:r0 + step])


@kernel("MeanVarianceNormalization", overwrites={0: (0,)})
def mean_variance_normalization(ctx: KernelContext, inputs, outputs) -> None:
    """Y = (X - mean) / (sqrt(var) + 1e-9) over `axes` (default 0, 2, 3), ONNX's function body."""
    xp, x, y = ctx.xp, inputs[0], outputs[0]
    axes = tuple(int(a) + x.ndim if int(a) < 0 else int(a) for a in ctx.attrs.get("axes") or (0, 2, 3))
    mean = x.mean(axis=axes, keepdims=True)  # statistics-sized
    squares = xp.zeros_like(mean)  # E[X^2] summed a block at a time: no X-sized X * X
    for b in _xp.blocks(x.shape, _xp.block_elems(x.dtype, xp)):
        xb = x[b]
        at = tuple(slice(None) if a in axes else b[a] for a in range(x.ndim))
        squares[at] += (xb * xb).sum(axis=axes, keepdims=True)
    count = x.dtype.type(prod(x.shape[a] for a in axes))
    var = squares / count - mean * mean
    xp.subtract(x, mean, out=y)
    xp.divide(y, xp.sqrt(var) + x.dtype.type(1e-9), out=y)


@kernel("LRN")
def lrn(ctx: KernelContext, inputs, outputs) -> None:
    """Y = X / (bias + alpha / size * sum of X^2 over the channel window)^beta, the window
    [c - (size - 1) // 2, c + ceil((size - 1) / 2)], through a running sum over channels."""
    xp, x, y = ctx.xp, inputs[0], outputs[0]
    size = int(ctx.attrs["size"])
    alpha, beta = float(ctx.attrs.get("alpha", 1e-4)), float(ctx.attrs.get("beta", 0.75))
    bias = float(ctx.attrs.get("bias", 1.0))
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    n, c = x.shape[:2]
    top = xp.minimum(xp.arange(c) + hi + 1, c)
    bottom = xp.maximum(xp.arange(c) - lo, 0)
    x3, y3 = x.reshape(n, c, -1), y.reshape(n, c, -1)
    cols = max(1, _xp.block_elems(np.float64, xp) // (c + 1))  # the running sums: block-sized
    for i in range(n):
        for p0 in range(0, x3.shape[2], cols):
            xb = x3[i, :, p0:p0 + cols]
            sq = xb.astype(np.float64) ** 2
            run = xp.concatenate([xp.zeros((1, sq.shape[1])), xp.cumsum(sq, axis=0)])
            window = run[top] - run[bottom]
            scale = (window * (alpha / size) + bias) ** beta
            xp.copyto(y3[i, :, p0:p0 + cols], xb / scale, casting="unsafe")
