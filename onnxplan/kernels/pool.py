"""Pooling kernels: MaxPool (with ORT's Indices), MaxPoolGrad, AveragePool(+Grad), global pools; one strided pass per tap."""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np

from onnxplan.ir.windows import Window, window
from onnxplan.kernels import parallel, scratch
from onnxplan.kernels._xp import scatter_add
from onnxplan.kernels.registry import KernelContext, KernelFn, bind_prepared, kernel, prepared_call
from onnxplan.kernels.scratch import align

__all__ = [
    "average_pool",
    "average_pool_grad",
    "global_average_pool",
    "global_max_pool",
    "index_strides",
    "max_pool",
    "max_pool_grad",
    "pool_window",
]



def pool_window(attrs, in_shape, out_shape) -> Window:
    """The pooling window of a node mapping (N, C, *in) onto (N, C, *out)."""
    return window(attrs, in_shape[2:], out_shape[2:], attrs["kernel_shape"])


def index_strides(in_dims, storage_order: int) -> tuple[int, ...]:
    """Per spatial axis, the step of MaxPool's Indices: row-major, or column-major (storage_order 1)."""
    n = len(in_dims)
    if storage_order:
        return tuple(prod(in_dims[:a]) for a in range(n))
    return tuple(prod(in_dims[a + 1:]) for a in range(n))


def _images_per_chunk(n: int, per_image: int) -> int:
    """Images per chunk of a pooling pass: as many as fit the conv scratch target, at least one."""
    return max(1, min(n, scratch.SCRATCH_TARGET // max(per_image, 1)))


def _axis_index(ndim: int, axis: int, idx) -> tuple:
    return (slice(None),) * axis + (idx,) + (slice(None),) * (ndim - axis - 1)


def _empty_outputs(win: Window) -> list[list[int]]:
    """Per spatial axis, the outputs whose window lies wholly in the padding (ceil_mode can make them)."""
    empty = []
    for a, size in enumerate(win.out_dims):
        covered = [False] * size
        for k in range(win.kernel[a]):
            lo, hi, _ = win.span(a, k)
            for o in range(lo, hi):
                covered[o] = True
        empty.append([o for o in range(size) if not covered[o]])
    return empty


def _max_pool_scratch(node, in_specs, out_specs) -> int:
    """With Indices: a bool mask of one chunk of the output (images fitting 8 MiB, at least one)."""
    if len(out_specs) < 2 or out_specs[1] is None:
        return 0
    y = out_specs[0]
    per_image = prod(y.shape[1:])
    return align(_images_per_chunk(y.shape[0], per_image) * per_image)


def _max_pool_taps(attrs, inputs, outputs):
    """What MaxPool starts from: X, Y, the indices output (or None), the
    window, its live taps, the seeds (the taps up to the first covering every output: each output
    takes its first in-bounds one) and the dtype's lowest value."""
    x, y = inputs[0], outputs[0]
    ind = outputs[1] if len(outputs) > 1 else None
    win = pool_window(attrs, x.shape, y.shape)
    taps = list(win.live_taps())
    lowest = np.finfo(y.dtype).min if y.dtype.kind == "f" else np.iinfo(y.dtype).min
    full = [i for i, t in enumerate(taps) if t.spans == tuple((0, o) for o in win.out_dims)]
    return x, y, ind, win, taps, (taps[:full[0] + 1] if full else taps), lowest


def _max_values(xp, x, y, taps, seeds, lowest) -> KernelFn:
    """MaxPool without Indices: each output its first in-bounds tap, then the maximum of the rest."""
    every = (slice(None), slice(None))
    seed_views = [(y[every + t.out_slices], x[every + t.in_slices]) for t in reversed(seeds)]
    max_views = [(y[every + t.out_slices], x[every + t.in_slices]) for t in taps[1:]]

    def run_values(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        y[...] = lowest
        for dst, src in seed_views:
            dst[...] = src
        for dst, src in max_views:
            xp.maximum(dst, src, out=dst)

    return run_values


# Passes over a chunk's outputs per tap for MaxPool with Indices (compare, two masked copies):
# kernels.parallel's split threshold (vgg16 b16's pools: 13 ms a step on one thread).
MAX_POOL_PASSES = 3


def _prepare_max_pool(ctx: KernelContext, inputs: list, outputs: list, bound: bool) -> KernelFn:
    """Y = max over each window; Indices (ORT's layout) = flat index into X of the first maximum.

    Every output first takes its first in-bounds tap (copies, last tap first), then each later
    tap replaces it where strictly greater: ORT's scan order and tie rule, NaN included. ceil_mode
    follows ONNX Runtime 1.19 (a window wholly in the right padding is kept: the lowest value), not
    ONNX (which drops it); one that starts past the input and its padding is refused at plan time.
    The taps' views, the index deltas and the window-corner terms are made once per call, or once
    for the node (`bound`).
    """
    xp = ctx.xp
    x, y, ind, win, taps, seeds, lowest = _max_pool_taps(ctx.attrs, inputs, outputs)
    every = (slice(None), slice(None))
    if ind is None:
        return _max_values(xp, x, y, taps, seeds, lowest)
    sst = index_strides(win.in_dims, int(ctx.attrs.get("storage_order", 0)))
    deltas = [sum(k * d * s for k, d, s in zip(t.index, win.dilations, sst)) for t in taps]
    n, c = x.shape[:2]
    nd = len(win.out_dims)
    step = prod(win.in_dims)
    nb_max = _images_per_chunk(n, prod(y.shape[1:]))
    terms = [((xp.arange(win.out_dims[a], dtype=ind.dtype) * win.strides[a] - win.pads_begin[a]) * sst[a])
             .reshape((1, 1) + (1,) * a + (-1,) + (1,) * (nd - a - 1)) for a in range(nd)]
    chan = (xp.arange(c, dtype=ind.dtype) * step).reshape((1, c) + (1,) * nd)
    def piece(n0: int, nb: int, mask) -> Callable[[], None]:
        """Images n0..n0+nb start to end, through `mask` (their block of the chunk's scratch)."""
        xc, yc, ic = x[n0:n0 + nb], y[n0:n0 + nb], ind[n0:n0 + nb]
        seed = [(yc[every + t.out_slices], xc[every + t.in_slices], ic[every + t.out_slices], delta)
                for t, delta in reversed(list(zip(seeds, deltas)))]
        rest = [(xc[every + t.in_slices], yc[every + t.out_slices], mask[every + t.out_slices],
                 ic[every + t.out_slices], delta) for t, delta in list(zip(taps, deltas))[1:]]
        image = (xp.arange(nb, dtype=ind.dtype) * (c * step)).reshape((nb, 1) + (1,) * nd)
        offset, corner = (n0 * c) * step, n0 * c * step - sum(sst)
        empty = []
        for a, outs in enumerate(_empty_outputs(win)):
            for o in outs:
                sel = every + _axis_index(nd, a, o)
                empty.append((sel, ic[sel], chan.reshape((1, c) + (1,) * (nd - 1)),
                              image.reshape((nb, 1) + (1,) * (nd - 1))))

        def run() -> None:
            yc[...] = lowest
            for dst, src, idx, delta in seed:
                dst[...] = src
                idx[...] = delta
            for src, dst, m, idx, delta in rest:
                xp.greater(src, dst, out=m)
                xp.copyto(dst, src, where=m)
                xp.copyto(idx, delta, where=m)
            for term in terms:
                xp.add(ic, term, out=ic)
            xp.add(ic, chan, out=ic)
            xp.add(ic, offset, out=ic)
            xp.add(ic, image, out=ic)
            for sel, ic_sel, chan_e, image_e in empty:
                yc[sel] = lowest
                ic[sel] = corner
                xp.add(ic_sel, chan_e, out=ic_sel)
                xp.add(ic_sel, image_e, out=ic_sel)

        return run

    # chunks of images one after the other (the mask scratch holds one), each cut by images across
    # the compute threads: every output's scan is its own, the same bits at any thread count
    parts = parallel.parts_for(nb_max * prod(y.shape[1:]), xp, passes=MAX_POOL_PASSES * len(taps))
    chunks = []
    for n0 in range(0, n, nb_max):
        nb = min(nb_max, n - n0)
        mask = ctx.scratch_array(0, (nb, *y.shape[1:]), np.bool_)
        chunks.append([piece(n0 + lo, hi - lo, mask[lo:hi]) for lo, hi in parallel.bounds(nb, min(parts, nb))])

    def run_indices(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        for pieces in chunks:
            parallel.run(pieces)

    return run_indices




@kernel("MaxPool", scratch=_max_pool_scratch, bind=bind_prepared(_prepare_max_pool))
def max_pool(ctx: KernelContext, inputs, outputs) -> None:
    """(X) -> Y, Indices? (_prepare_max_pool)."""
    prepared_call(_prepare_max_pool, ctx, inputs, outputs)


def _overlapping(win: Window) -> bool:
    return any(s < d * (k - 1) + 1 for s, d, k in zip(win.strides, win.dilations, win.kernel))


@kernel("MaxPoolGrad")
def max_pool_grad(ctx: KernelContext, inputs, outputs) -> None:
    """dX = 0, then dX.flat[Indices[i]] += dY[i] (ORT's MaxPoolGrad; Indices from MaxPool)."""
    xp = ctx.xp
    dy, ind, dx = inputs[0], inputs[1], outputs[0]
    dx[...] = 0
    flat, where, values = dx.reshape(-1), ind.reshape(-1), dy.reshape(-1)
    win = pool_window(ctx.attrs, dx.shape, dy.shape) if "kernel_shape" in ctx.attrs else None
    if win is not None and not _overlapping(win) and not any(_empty_outputs(win)):
        flat[where] = values  # distinct windows: every index once
    else:
        scatter_add(xp, flat.reshape(1, -1, 1), where, values.reshape(1, -1, 1))


def _window_counts(win: Window) -> list[list[int]]:
    """Per spatial axis, how many in-bounds positions each output's window has (at least 1:
    a window wholly in the padding sums to 0, and ORT reports 0 for it)."""
    counts = []
    for a, size in enumerate(win.out_dims):
        spans = [(lo, hi) for lo, hi, _ in (win.span(a, k) for k in range(win.kernel[a])) if hi > lo]
        counts.append([max(1, sum(1 for lo, hi in spans if lo <= o < hi)) for o in range(size)])
    return counts


def _grid(xp, counts, out, reciprocal: bool) -> None:
    """out[*o] = prod_a counts[a][o_a], or its reciprocal (products of small ints are exact)."""
    out[...] = 1
    nd = len(counts)
    for a, c in enumerate(counts):
        axis = xp.asarray(np.asarray(c, dtype=out.dtype)).reshape((1,) * a + (-1,) + (1,) * (nd - a - 1))
        xp.multiply(out, axis, out=out)
    if reciprocal:
        xp.reciprocal(out, out=out)


def _mlas_path(win: Window) -> str:
    """Which MLAS pooling routine ORT runs for a float window: its summation order follows it.

    "global" (window = input, unit strides, no padding), "vector" (2-D/3-D, last stride <= 2,
    kernels <= 32, a padded row fits MLAS's 2048-float reduction buffer) or "generic".
    """
    if (win.kernel == win.in_dims and all(s == 1 for s in win.strides)
            and not any(win.pads_begin) and not any(win.pads_end)):
        return "global"
    if len(win.kernel) >= 2 and win.strides[-1] <= 2 and all(k <= 32 for k in win.kernel):
        room = 2048 - 3
        room = room - win.pads_begin[-1] if room >= win.pads_begin[-1] else 0
        room = room - win.pads_end[-1] if room >= win.pads_end[-1] else 0
        if room >= win.in_dims[-1]:
            return "vector"
    return "generic"


# Up to this many 4-wide steps, global sums reproduce MLAS's order (4*q strided passes);
# longer rows are summed pairwise by numpy instead (a few ulps off ORT, far faster).
_EXACT_GLOBAL_STEPS = 16


def global_sum_into(ctx: KernelContext, x2, out, offset: int = 0) -> None:
    """out[r] = sum of x2[r, :] in MLAS's global-pool order: four interleaved lane sums,
    combined (l0 + l2) + (l1 + l3), then the tail added one by one (rows of at most 64 + 3
    values; longer rows: numpy's pairwise sum). Scratch: four floats per row."""
    xp = ctx.xp
    rows, length = x2.shape
    q = length // 4
    if q > _EXACT_GLOBAL_STEPS:
        xp.sum(x2, axis=1, out=out)
        return
    if q == 0:
        out[...] = 0
    else:
        lanes = ctx.scratch_array(offset, (4, rows), x2.dtype)
        for j in range(4):
            lane = lanes[j]  # one object for in and out (CuPy copies an overlapping input)
            xp.copyto(lane, x2[:, j])
            for k in range(1, q):
                xp.add(lane, x2[:, 4 * k + j], out=lane)
        xp.add(lanes[0], lanes[2], out=out)
        lane = lanes[1]
        xp.add(lane, lanes[3], out=lane)
        xp.add(out, lanes[1], out=out)
    for i in range(4 * q, length):
        xp.add(out, x2[:, i], out=out)


def _global_scratch(rows: int, itemsize: int) -> int:
    return align(rows * 4 * itemsize)


def _average_pool_scratch(node, in_specs, out_specs) -> int:
    """The divisor grid (one value per output position of an image); for MLAS's vector path,
    partial column sums of a chunk of images (fitting 8 MiB, at least one); for its global
    path, four lane sums per channel."""
    x, y = in_specs[0], out_specs[0]
    win = pool_window(node.attrs, x.shape, y.shape)
    path = _mlas_path(win)
    if path == "global":
        return _global_scratch(x.shape[0] * x.shape[1], x.itemsize)
    grid = align(prod(y.shape[2:]) * y.itemsize)
    if path == "generic" or win.kernel[-1] == 1:
        return grid
    per_image = prod(y.shape[1:]) * y.itemsize
    return grid + align(_images_per_chunk(y.shape[0], per_image) * per_image)


@kernel("AveragePool", scratch=_average_pool_scratch)
def average_pool(ctx: KernelContext, inputs, outputs) -> None:
    """Y = (sum of each window's in-bounds values) / count, summed in the order of the MLAS routine
    ORT picks (see _mlas_path): generic scans the window row-major; vector sums each column of
    the window (all axes but the last) first, then the columns left to right.

    count is the kernel size with count_include_pad, else the in-bounds positions. With ceil_mode
    this follows ONNX Runtime 1.19, not ONNX (whose reference and PyTorch count only the positions
    inside the padded input, and drop a window that starts in the right padding): the step runs
    ORT's AveragePoolGrad and is verified against ORT (tests/conformance.py ORT_FOLLOWED). A window
    that starts past the input and its padding is refused at plan time.
    """
    xp = ctx.xp
    x, y = inputs[0], outputs[0]
    win = pool_window(ctx.attrs, x.shape, y.shape)
    path = _mlas_path(win)
    n, c = x.shape[:2]
    if path == "global":
        y2 = y.reshape(n * c)
        global_sum_into(ctx, x.reshape(n * c, -1), y2)
        xp.divide(y2, y.dtype.type(prod(win.in_dims)), out=y2)
        return
    columns: dict[int, list] = {}
    for tap in win.live_taps():
        columns.setdefault(tap.index[-1] if path == "vector" else 0, []).append(tap)
    grid_bytes = align(prod(win.out_dims) * y.itemsize)
    every = (slice(None), slice(None))
    nb_max = _images_per_chunk(n, prod(y.shape[1:]) * y.itemsize)
    for n0 in range(0, n, nb_max):
        nb = min(nb_max, n - n0)
        xc, yc = x[n0:n0 + nb], y[n0:n0 + nb]
        yc[...] = 0
        for j in sorted(columns):
            acc = yc if j == 0 else ctx.scratch_array(grid_bytes, yc.shape, y.dtype)
            if j > 0:
                acc[...] = 0
            for tap in columns[j]:
                dst = acc[every + tap.out_slices]
                xp.add(dst, xc[every + tap.in_slices], out=dst)
            if j > 0:
                xp.add(yc, acc, out=yc)
    divisor = ctx.scratch_array(0, win.out_dims, y.dtype)
    if ctx.attrs.get("count_include_pad", 0):
        divisor[...] = prod(win.kernel)
    else:
        _grid(xp, _window_counts(win), divisor, False)
    xp.divide(y, divisor, out=y)


def _average_pool_grad_scratch(node, in_specs, out_specs) -> int:
    """dY / count for a chunk of images (fitting 8 MiB, at least one) plus the reciprocal grid."""
    dy = in_specs[0]
    per_image = prod(dy.shape[1:]) * dy.itemsize
    grid = align(prod(dy.shape[2:]) * dy.itemsize)
    return grid + align(_images_per_chunk(dy.shape[0], per_image) * per_image)


@kernel("AveragePoolGrad", scratch=_average_pool_grad_scratch)
def average_pool_grad(ctx: KernelContext, inputs, outputs) -> None:
    """dX[window] += dY * (1 / count), windows visited in output order (ORT's AveragePoolGrad)."""
    xp = ctx.xp
    dy, dx = inputs[0], outputs[0]
    win = pool_window(ctx.attrs, dx.shape, dy.shape)
    include_pad = bool(ctx.attrs.get("count_include_pad", 0))
    if include_pad:
        counts = [[k] * o for k, o in zip(win.kernel, win.out_dims)]
    else:
        counts = _window_counts(win)
    grid_bytes = align(prod(win.out_dims) * dy.itemsize)
    scale = ctx.scratch_array(0, win.out_dims, dy.dtype)
    _grid(xp, counts, scale, True)
    dx[...] = 0
    n = dy.shape[0]
    nb_max = _images_per_chunk(n, prod(dy.shape[1:]) * dy.itemsize)
    every = (slice(None), slice(None))
    taps = list(win.live_taps())
    for n0 in range(0, n, nb_max):
        nb = min(nb_max, n - n0)
        scaled = ctx.scratch_array(grid_bytes, (nb, *dy.shape[1:]), dy.dtype)
        xp.multiply(dy[n0:n0 + nb], scale, out=scaled)
        dxc = dx[n0:n0 + nb]
        for tap in reversed(taps):  # last tap first = earliest output first for each dX element
            dst = dxc[every + tap.in_slices]
            xp.add(dst, scaled[every + tap.out_slices], out=dst)


def _global_average_pool_scratch(node, in_specs, out_specs) -> int:
    """Four lane sums per (image, channel)."""
    x = in_specs[0]
    return _global_scratch(x.shape[0] * x.shape[1], x.itemsize)


@kernel("GlobalAveragePool", scratch=_global_average_pool_scratch)
def global_average_pool(ctx: KernelContext, inputs, outputs) -> None:
    """Y[n, c] = mean of X[n, c] over all spatial positions (MLAS's global-pool summation order)."""
    x, y = inputs[0], outputs[0]
    n, c = x.shape[:2]
    y2 = y.reshape(n * c)
    global_sum_into(ctx, x.reshape(n * c, -1), y2)
    ctx.xp.divide(y2, y.dtype.type(prod(x.shape[2:])), out=y2)


@kernel("GlobalMaxPool")
def global_max_pool(ctx: KernelContext, inputs, outputs) -> None:
    """Y[n, c] = max of X[n, c] over all spatial positions."""
    x, y = inputs[0], outputs[0]
    n, c = x.shape[:2]
    ctx.xp.max(x.reshape(n * c, -1), axis=1, out=y.reshape(n * c))


def _lp_terms(xp, v, p: int):
    """|v|^p, a block-sized temporary."""
    if p == 1:
        return xp.abs(v)
    if p == 2:
        return v * v
    return xp.abs(v) ** p


@kernel("LpPool")
def lp_pool(ctx: KernelContext, inputs, outputs) -> None:
    """Y = (sum over the window of |X|^p)^(1/p), the padding counting 0; image by image, a block of
    channels and taps at a time."""
    from onnxplan.kernels import _xp

    xp, x, y = ctx.xp, inputs[0], outputs[0]
    p = int(ctx.attrs.get("p", 2))
    win = pool_window(ctx.attrs, x.shape, y.shape)
    n, c = x.shape[:2]
    per_channel = prod(y.shape[2:])
    step = max(1, _xp.block_elems(x.dtype, xp) // max(1, per_channel))
    y[...] = 0
    for i in range(n):
        for c0 in range(0, c, step):
            yb, xb = y[i, c0:c0 + step], x[i, c0:c0 + step]
            for tap in win.live_taps():
                dst = yb[(slice(None),) + tap.out_slices]
                dst += _lp_terms(xp, xb[(slice(None),) + tap.in_slices], p)
    if p == 2:
        xp.sqrt(y, out=y)
    elif p != 1:
        xp.power(y, y.dtype.type(1.0 / p), out=y)


@kernel("GlobalLpPool")
def global_lp_pool(ctx: KernelContext, inputs, outputs) -> None:
    """Y[n, c] = (sum over the spatial axes of |X|^p)^(1/p)."""
    from onnxplan.kernels import _xp

    xp, x, y = ctx.xp, inputs[0], outputs[0]
    p = int(ctx.attrs.get("p", 2))
    rows = x.shape[0] * x.shape[1]
    x2, y2 = x.reshape(rows, -1), y.reshape(rows, 1)
    step = max(1, _xp.block_elems(x.dtype, xp) // max(1, x2.shape[1]))
    for r0 in range(0, rows, step):
        y2[r0:r0 + step] = _lp_terms(xp, x2[r0:r0 + step], p).sum(axis=1, keepdims=True)
    if p == 2:
        xp.sqrt(y, out=y)
    elif p != 1:
        xp.power(y, y.dtype.type(1.0 / p), out=y)
