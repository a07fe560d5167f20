"""Convolution kernels: Conv, ConvTranspose and ONNX Runtime's ConvGrad/ConvTransposeGrad, im2col/col2im
in planned scratch plus BLAS GEMMs."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from math import prod

from onnxplan.ir.graph import Node
from onnxplan.kernels.registry import KernelContext, kernel

__all__ = [
    "SCRATCH_TARGET",
    "Layout",
    "Tap",
    "Window",
    "col2im_add",
    "conv",
    "conv_grad",
    "conv_grad_scratch",
    "conv_scratch",
    "conv_transpose",
    "conv_transpose_grad",
    "im2col",
    "transpose_pads",
    "window",
]

MS = "com.microsoft"
# Scratch a kernel aims for: images are processed in chunks whose buffers fit this many
# bytes, but a chunk holds at least one image (so one image's columns is the floor).
SCRATCH_TARGET = 8 << 20
_ALIGN = 64


def _ints(attrs, name: str, n: int, default: int) -> tuple[int, ...]:
    value = attrs.get(name)
    return tuple(int(v) for v in value) if value else (default,) * n


def _str(attrs, name: str, default: str) -> str:
    value = attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Tap:
    """One kernel position: the outputs it reaches inside the input, and the input it reads."""

    index: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]  # per spatial axis: [lo, hi) of output positions
    in_slices: tuple[slice, ...]  # per spatial axis: the input positions read, strided

    @property
    def empty(self) -> bool:
        return any(hi <= lo for lo, hi in self.spans)

    @property
    def out_slices(self) -> tuple[slice, ...]:
        return tuple(slice(lo, hi) for lo, hi in self.spans)


@dataclass(frozen=True)
class Window:
    """A sliding window over the spatial axes: output o of axis a, tap k reads input
    o * strides[a] - pads_begin[a] + k * dilations[a]."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    in_dims: tuple[int, ...]
    out_dims: tuple[int, ...]

    def span(self, axis: int, k: int) -> tuple[int, int, int]:
        """(lo, hi, first input) of the outputs whose tap k on `axis` lands inside the input."""
        s, size, n_out = self.strides[axis], self.in_dims[axis], self.out_dims[axis]
        off = k * self.dilations[axis] - self.pads_begin[axis]
        lo = 0 if off >= 0 else (-off + s - 1) // s
        hi = min(n_out, (size - 1 - off) // s + 1) if size - 1 - off >= 0 else 0
        lo = min(lo, n_out)
        return lo, max(lo, hi), lo * s + off

    def taps(self) -> tuple[Tap, ...]:
        """Every kernel position in row-major order (the order ORT visits a window in); made
        once per window (a step calls the same layers again)."""
        return _taps_of(self, False)

    def live_taps(self) -> tuple[Tap, ...]:
        """The taps that read some input, in taps()'s order: a window far larger than its input
        (an exported adaptive pool: kernel 320 on 8 positions) has few, and only they are visited."""
        return _taps_of(self, True)

    def _taps(self, live: bool):
        axes = range(len(self.kernel))
        per_axis = [[(k, self.span(a, k)) for k in range(self.kernel[a])] for a in axes]
        if live:
            per_axis = [[(k, sp) for k, sp in ks if sp[1] > sp[0]] for ks in per_axis]
        for combo in itertools.product(*per_axis):
            spans, slices = [], []
            for a, (_k, (lo, hi, start)) in zip(axes, combo):
                spans.append((lo, hi))
                step = self.strides[a]
                slices.append(slice(start, start + max(hi - lo - 1, 0) * step + 1, step))
            yield Tap(tuple(k for k, _sp in combo), tuple(spans), tuple(slices))

    def band(self, lo: int, hi: int) -> Window:
        """The window of output rows [lo, hi) of the first spatial axis alone."""
        if (lo, hi) == (0, self.out_dims[0]):
            return self
        pads = (self.pads_begin[0] - lo * self.strides[0], *self.pads_begin[1:])
        return replace(self, pads_begin=pads, out_dims=(hi - lo, *self.out_dims[1:]))

    @property
    def pointwise(self) -> bool:
        """A 1x1 window with unit strides and no padding: the input is its own column matrix."""
        return (all(k == 1 for k in self.kernel) and all(s == 1 for s in self.strides)
                and not any(self.pads_begin) and not any(self.pads_end))


@functools.lru_cache(maxsize=4096)
def _taps_of(win: Window, live: bool) -> tuple[Tap, ...]:
    return tuple(win._taps(live))


def window(attrs, in_dims, out_dims, kernel_shape) -> Window:
    """The window of a Conv/pool node (auto_pad resolved) mapping `in_dims` onto `out_dims`."""
    n = len(in_dims)
    kernel_shape = tuple(int(k) for k in kernel_shape)
    strides = _ints(attrs, "strides", n, 1)
    dilations = _ints(attrs, "dilations", n, 1)
    auto_pad = _str(attrs, "auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (o - 1) * s + (k - 1) * d + 1 - i)
                 for i, o, k, s, d in zip(in_dims, out_dims, kernel_shape, strides, dilations)]
        begin = tuple(t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total)
        end = tuple(t - b for t, b in zip(total, begin))
    elif auto_pad == "VALID":
        begin = end = (0,) * n
    else:
        pads = _ints(attrs, "pads", 2 * n, 0)
        begin, end = pads[:n], pads[n:]
    return Window(kernel_shape, strides, dilations, tuple(begin), tuple(end),
                  tuple(int(d) for d in in_dims), tuple(int(d) for d in out_dims))


def _zero_outside(dst, spans, out_dims, lead: int) -> None:
    """Zero dst's outputs outside `spans` (the spatial axes start after `lead` axes)."""
    for a, ((lo, hi), size) in enumerate(zip(spans, out_dims)):
        head = (slice(None),) * (lead + a)
        if lo > 0:
            dst[head + (slice(0, lo),)] = 0
        if hi < size:
            dst[head + (slice(hi, None),)] = 0


def im2col(win: Window, x, col) -> None:
    """col[c, *k, n, *o] = x[n, c, o * s - p + k * d] (0 in the padding).

    x: (nb, C, *in_dims); col: (C, *kernel, nb, *out_dims). One strided copy per tap.
    """
    xt = x.swapaxes(0, 1)
    every = (slice(None), slice(None))
    for tap in win.taps():
        dst = col[(slice(None), *tap.index)]
        if tap.empty:
            dst[...] = 0
            continue
        _zero_outside(dst, tap.spans, win.out_dims, 2)
        dst[every + tap.out_slices] = xt[every + tap.in_slices]


def col2im_add(xp, win: Window, col, dx) -> None:
    """dx[n, c, o * s - p + k * d] += col[c, *k, n, *o]: the adjoint of im2col, accumulated into dx."""
    dxt = dx.swapaxes(0, 1)
    every = (slice(None), slice(None))
    for tap in win.taps():
        if tap.empty:
            continue
        dst = dxt[every + tap.in_slices]
        xp.add(dst, col[(slice(None), *tap.index)][every + tap.out_slices], out=dst)


@dataclass(frozen=True)
class Layout:
    """How a (grad) convolution walks the batch, and where its buffers sit in its scratch.

    A chunk is either `nb` > 1 whole images, or one image's band of `band` rows of the first
    output axis. Offsets are -1 for buffers the layout does not use.
    """

    n: int
    rows_out: int  # the first output axis's length
    nb: int  # images per chunk
    band: int  # output rows per chunk (rows_out unless nb == 1)
    col: int  # the columns (C/g * prod(kernel), nb * band * rest), rest = prod(out_dims[1:])
    rows: int  # output/dY rows in image-interleaved order (M/g, nb * L), only for nb > 1
    acc: int  # a (M/g, C/g * prod(kernel)) partial dW, when dW takes more than one chunk
    nbytes: int

    def chunks(self):
        """(first image, images, first row, end row) of each chunk, in order."""
        for n0 in range(0, self.n, self.nb):
            for b0 in range(0, self.rows_out, self.band):
                yield n0, min(self.nb, self.n - n0), b0, min(b0 + self.band, self.rows_out)


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _layout(x_shape, w_shape, y_dims, group: int, itemsize: int, need_cols: bool,
            need_acc: bool) -> Layout:
    """The chunking and scratch of a conv (the scratch rule and the kernel share it).

    Chunks aim at `target` bytes of columns (SCRATCH_TARGET): several whole images when one
    image's columns and rows fit, else bands of one image's output rows (at least one row).
    ConvGrad adds a dW-sized partial sum when there is more than one chunk.
    """
    target = SCRATCH_TARGET  # read at call time: the rule and the kernel agree
    n, m = x_shape[0], w_shape[0]
    ckg, mg, rows_out = prod(w_shape[1:]), m // group, y_dims[0]
    rest = prod(y_dims[1:])
    if not need_cols:
        return Layout(n, rows_out, n, rows_out, -1, -1, -1, 0)
    per_image = (ckg + mg) * rows_out * rest * itemsize
    nb = max(1, min(n, target // per_image))
    band = rows_out if nb > 1 else max(1, min(rows_out, target // (ckg * rest * itemsize)))
    col_bytes = _align(ckg * nb * band * rest * itemsize)
    rows_bytes = _align(mg * nb * rows_out * rest * itemsize) if nb > 1 else 0
    several = nb < n or band < rows_out
    acc_bytes = _align(mg * ckg * itemsize) if need_acc and several else 0
    return Layout(n, rows_out, nb, band, 0, col_bytes if rows_bytes else -1,
                  col_bytes + rows_bytes if acc_bytes else -1, col_bytes + rows_bytes + acc_bytes)


def _conv_window(node_attrs, x_shape, w_shape, y_shape) -> Window:
    return window(node_attrs, x_shape[2:], y_shape[2:], w_shape[2:])


def _depthwise(x_shape, group: int) -> bool:
    """One input channel per group (depthwise, any channel multiplier): computed tap by tap on
    the tensors themselves, with no columns."""
    return group > 1 and int(x_shape[1]) == group


DEPTHWISE_BLOCK = 1 << 18  # elements of a depthwise block's temporaries (in the planned scratch)


def _depthwise_block(y_shape, c: int) -> int:
    """Elements of one block: DEPTHWISE_BLOCK, at most the whole output, at least one output row
    of one channel (all its multiplier's outputs)."""
    per_row = (int(y_shape[1]) // c) * prod(y_shape[3:])
    return max(min(DEPTHWISE_BLOCK, prod(y_shape)), per_row)


def _depthwise_scratch(y_shape, c: int, itemsize: int, regions: int) -> int:
    return regions * _align(_depthwise_block(y_shape, c) * itemsize)


def _depthwise_chunks(budget: int, n: int, c: int, per_row: int, rows_out: int):
    """(images, channels, end row, first row) of the blocks a depthwise conv works in: each
    block's [images, channels, multiplier, rows, rest] holds at most `budget` elements."""
    per_channel = per_row * rows_out
    band = rows_out if per_channel <= budget else max(1, budget // per_row)
    step_c = max(1, min(c, budget // per_channel)) if band == rows_out else 1
    step_n = max(1, budget // (c * per_channel)) if step_c == c else 1
    for n0 in range(0, n, step_n):
        for c0 in range(0, c, step_c):
            for r0 in range(0, rows_out, band):
                yield (slice(n0, n0 + step_n), slice(c0, c0 + step_c), min(r0 + band, rows_out), r0)


def _temp(ctx: KernelContext, region: int, budget: int, shape, dtype):
    """A block-shaped temporary in scratch region `region` (each region holds `budget` elements)."""
    return ctx.scratch_array(region * _align(budget * dtype.itemsize), shape, dtype)


def _depthwise_conv(ctx: KernelContext, win: Window, x, w, y) -> None:
    """Y[n, c, j] = sum over taps t of W[c, j, t] X[n, c] at t's positions (c: the channel, j: the
    multiplier), block by block, products in the scratch; the bias is added by the caller."""
    xp = ctx.xp
    n, c, mg = x.shape[0], x.shape[1], w.shape[0] // x.shape[1]
    spatial = len(win.kernel)
    w3 = w.reshape(c, mg, -1)
    y5 = y.reshape(n, c, mg, *y.shape[2:])
    lead = (slice(None),) * 3
    ones = (1,) * spatial
    budget = _depthwise_block(y.shape, c)
    for ns, cs, r1, r0 in _depthwise_chunks(budget, n, c, mg * prod(y.shape[3:]), y.shape[2]):
        sub = win.band(r0, r1)
        yb = y5[ns, cs, :, r0:r1]
        yb[...] = 0
        xb = x[ns, cs][:, :, None]
        for t, tap in enumerate(sub.taps()):
            if tap.empty:
                continue
            dst = yb[lead + tap.out_slices]
            product = _temp(ctx, 0, budget, dst.shape, y.dtype)
            xp.multiply(w3[cs, :, t].reshape(1, -1, mg, *ones), xb[lead + tap.in_slices], out=product)
            xp.add(dst, product, out=dst)


def _depthwise_conv_grad(ctx: KernelContext, win: Window, dy, x, w, dx, dw) -> None:
    """dW[c, j, t] = sum of dY[n, c, j] X[n, c] at t's positions; dX[n, c] at t's positions +=
    sum over j of W[c, j, t] dY[n, c, j]; block by block, products in the scratch (dB is the caller's)."""
    xp = ctx.xp
    n, c, mg = x.shape[0], x.shape[1], w.shape[0] // x.shape[1]
    spatial = len(win.kernel)
    w3 = w.reshape(c, mg, -1)
    dy5 = dy.reshape(n, c, mg, *dy.shape[2:])
    lead = (slice(None),) * 3
    ones = (1,) * spatial
    summed = (0, *range(3, 3 + spatial))
    dw3 = dw.reshape(c, mg, -1) if dw is not None else None
    if dw3 is not None:
        dw3[...] = 0
    if dx is not None:
        dx[...] = 0
    budget = _depthwise_block(dy.shape, c)
    for ns, cs, r1, r0 in _depthwise_chunks(budget, n, c, mg * prod(dy.shape[3:]), dy.shape[2]):
        sub = win.band(r0, r1)
        dyb = dy5[ns, cs, :, r0:r1]
        xb = x[ns, cs][:, :, None]
        dxb = dx[ns, cs] if dx is not None else None
        for t, tap in enumerate(sub.taps()):
            if tap.empty:
                continue
            g = dyb[lead + tap.out_slices]
            product = _temp(ctx, 0, budget, g.shape, dy.dtype)
            if dw3 is not None:
                xp.multiply(g, xb[lead + tap.in_slices], out=product)
                part = dw3[cs, :, t]
                part += product.sum(axis=summed)
            if dxb is not None:
                dst = dxb[(slice(None), slice(None)) + tap.in_slices]
                xp.multiply(g, w3[cs, :, t].reshape(1, -1, mg, *ones), out=product)
                if mg == 1:
                    xp.add(dst, product[:, :, 0], out=dst)
                else:
                    total = _temp(ctx, 1, budget, dst.shape, dy.dtype)
                    xp.sum(product, axis=2, out=total)
                    xp.add(dst, total, out=dst)


def conv_scratch(node, in_specs, out_specs) -> int:
    """Columns for a chunk of about SCRATCH_TARGET bytes (whole images, or a band of one image's
    output rows, at least one row) plus, for chunks of several images, their output rows;
    none for a pointwise (1x1, stride 1, unpadded) convolution."""
    x, w, y = in_specs[0], in_specs[1], out_specs[0]
    win = _conv_window(node.attrs, x.shape, w.shape, y.shape)
    group = int(node.attrs.get("group", 1))
    if _depthwise(x.shape, group):
        return _depthwise_scratch(y.shape, x.shape[1], x.itemsize, 1)
    return _layout(x.shape, w.shape, y.shape[2:], group, x.itemsize, not win.pointwise, False).nbytes


@kernel("Conv", scratch=conv_scratch)
def conv(ctx: KernelContext, inputs, outputs) -> None:
    """Y = W * X (+ B): per chunk and group, im2col then one GEMM into Y (or into rows then Y)."""
    xp = ctx.xp
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    y = outputs[0]
    group = int(ctx.attrs.get("group", 1))
    win = _conv_window(ctx.attrs, x.shape, w.shape, y.shape)
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg, length = c // group, m // group, prod(y.shape[2:])
    ckg, rest = prod(w.shape[1:]), length // y.shape[2]
    w2 = w.reshape(group, mg, ckg)
    y3 = y.reshape(n, m, length)
    if _depthwise(x.shape, group):
        _depthwise_conv(ctx, win, x, w, y)
    elif win.pointwise:  # Y[n] = W @ X[n] for every image in one batched call
        x3 = x.reshape(n, c, length)
        for g in range(group):
            xp.matmul(w2[g], x3[:, g * cg:(g + 1) * cg], out=y3[:, g * mg:(g + 1) * mg])
    else:
        lay = _layout(x.shape, w.shape, y.shape[2:], group, x.itemsize, True, False)
        for n0, nb, b0, b1 in lay.chunks():
            sub = win.band(b0, b1)
            col = ctx.scratch_array(lay.col, (cg, *win.kernel, nb, *sub.out_dims), x.dtype)
            cols = col.reshape(ckg, nb * (b1 - b0) * rest)
            for g in range(group):
                im2col(sub, x[n0:n0 + nb, g * cg:(g + 1) * cg], col)
                dst = y3[n0:n0 + nb, g * mg:(g + 1) * mg, b0 * rest:b1 * rest]
                if nb == 1:
                    xp.matmul(w2[g], cols, out=dst[0])
                    continue
                rows = ctx.scratch_array(lay.rows, (mg, nb * length), x.dtype)
                xp.matmul(w2[g], cols, out=rows)
                xp.copyto(dst, rows.reshape(mg, nb, length).swapaxes(0, 1))
    if b is not None:
        xp.add(y3, b.reshape(m, 1), out=y3)


def conv_grad_scratch(node, in_specs, out_specs) -> int:
    """Conv's columns and rows (see conv_scratch) plus a dW-sized partial sum when dW takes more
    than one chunk; only dB (or a pointwise dX alone) needs none."""
    dy, x, w = in_specs[0], in_specs[1], in_specs[2]
    need_dx = len(out_specs) > 0 and out_specs[0] is not None
    need_dw = len(out_specs) > 1 and out_specs[1] is not None
    win = _conv_window(node.attrs, x.shape, w.shape, dy.shape)
    group = int(node.attrs.get("group", 1))
    if _depthwise(x.shape, group):
        regions = 2 if need_dx and w.shape[0] != x.shape[1] else 1  # dX sums over a multiplier
        return _depthwise_scratch(dy.shape, x.shape[1], x.itemsize, regions) if need_dx or need_dw else 0
    need_cols = need_dw or (need_dx and not win.pointwise)
    return _layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, need_cols, need_dw).nbytes


@kernel("ConvGrad", MS, scratch=conv_grad_scratch)
def conv_grad(ctx: KernelContext, inputs, outputs) -> None:
    """(dY, X, W) -> dX, dW, dB (each optional): dW = dY_rows @ cols^T, dX = col2im(W^T @ dY_rows)."""
    xp = ctx.xp
    dy, x, w = inputs[0], inputs[1], inputs[2]
    dx = outputs[0] if len(outputs) > 0 else None
    dw = outputs[1] if len(outputs) > 1 else None
    db = outputs[2] if len(outputs) > 2 else None
    group = int(ctx.attrs.get("group", 1))
    win = _conv_window(ctx.attrs, x.shape, w.shape, dy.shape)
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg, length = c // group, m // group, prod(dy.shape[2:])
    ckg, rest = prod(w.shape[1:]), length // dy.shape[2]
    w2 = w.reshape(group, mg, ckg)
    dy3 = dy.reshape(n, m, length)
    if db is not None:
        xp.sum(dy3, axis=(0, 2), out=db)
    if _depthwise(x.shape, group):
        _depthwise_conv_grad(ctx, win, dy, x, w, dx, dw)
        return
    if dx is not None and win.pointwise:  # dX[n] = W^T @ dY[n] for every image in one batched call
        dx3 = dx.reshape(n, c, length)
        for g in range(group):
            xp.matmul(w2[g].T, dy3[:, g * mg:(g + 1) * mg], out=dx3[:, g * cg:(g + 1) * cg])
        dx = None
    if dw is None and dx is None:
        return
    if dx is not None:
        dx[...] = 0
    dw2 = dw.reshape(group, mg, ckg) if dw is not None else None
    lay = _layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, dw is not None)
    for n0, nb, b0, b1 in lay.chunks():
        sub = win.band(b0, b1)
        col = ctx.scratch_array(lay.col, (cg, *win.kernel, nb, *sub.out_dims), x.dtype)
        cols = col.reshape(ckg, nb * (b1 - b0) * rest)
        first = n0 == 0 and b0 == 0
        for g in range(group):
            dy_g = dy3[n0:n0 + nb, g * mg:(g + 1) * mg, b0 * rest:b1 * rest]
            if nb == 1:
                rows = dy_g[0]
            else:
                rows = ctx.scratch_array(lay.rows, (mg, nb * length), x.dtype)
                xp.copyto(rows.reshape(mg, nb, length), dy_g.swapaxes(0, 1))
            if dw2 is not None:
                im2col(sub, x[n0:n0 + nb, g * cg:(g + 1) * cg], col)
                if first:
                    xp.matmul(rows, cols.T, out=dw2[g])
                else:
                    acc = ctx.scratch_array(lay.acc, (mg, ckg), x.dtype)
                    xp.matmul(rows, cols.T, out=acc)
                    dw_g = dw2[g]  # one object: CuPy copies an input that overlaps another out=
                    xp.add(dw_g, acc, out=dw_g)
            if dx is not None:
                xp.matmul(w2[g].T, rows, out=cols)
                col2im_add(xp, sub, col, dx[n0:n0 + nb, g * cg:(g + 1) * cg])


# ---- ConvTranspose and its gradient: the adjoint of a Conv from Y's space to X's -------------------
def transpose_pads(attrs, x_dims, kernel_shape) -> tuple[list[int], list[int]]:
    """(pads_begin, pads_end) of a ConvTranspose, as ONNX Runtime resolves them: explicit pads,
    or a total from output_shape / auto_pad SAME_* (out = in * stride) split between the ends."""
    n = len(x_dims)
    strides, dilations = _ints(attrs, "strides", n, 1), _ints(attrs, "dilations", n, 1)
    adj = _ints(attrs, "output_padding", n, 0)
    auto_pad = _str(attrs, "auto_pad", "NOTSET")
    shape = [int(v) for v in attrs.get("output_shape") or []]
    if not shape and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        if auto_pad == "VALID":
            return [0] * n, [0] * n
        pads = _ints(attrs, "pads", 2 * n, 0)
        return list(pads[:n]), list(pads[n:])
    begin, end = [], []
    for i in range(n):
        out = shape[-n:][i] if shape else x_dims[i] * strides[i]
        total = max(0, (x_dims[i] - 1) * strides[i] + adj[i] + (kernel_shape[i] - 1) * dilations[i] + 1 - out)
        head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2  # ORT 1.19's split
        begin.append(head)
        end.append(total - head)
    return begin, end


def _as_conv(node, x_dims, kernel_shape) -> Node:
    """The node as the Conv from Y's space to X's that it is the adjoint of (explicit pads)."""
    begin, end = transpose_pads(node.attrs, x_dims, kernel_shape)
    attrs = {k: v for k, v in node.attrs.items() if k in ("strides", "dilations", "group")}
    return Node(node.name, "Conv", "", node.inputs, node.outputs, {**attrs, "pads": begin + end})


def conv_transpose_scratch(node, in_specs, out_specs) -> int:
    """A ConvGrad's dX alone (dY: X, the weight W, x: Y)."""
    x, w, y = in_specs[0], in_specs[1], out_specs[0]
    conv = _as_conv(node, x.shape[2:], w.shape[2:])
    return conv_grad_scratch(conv, [x, y, w], [y])


@kernel("ConvTranspose", scratch=conv_transpose_scratch)
def conv_transpose(ctx: KernelContext, inputs, outputs) -> None:
    """Y = ConvGrad's dX of the Conv from Y's space to X's (col2im of W^T @ X), plus the bias."""
    x, w, y = inputs[0], inputs[1], outputs[0]
    b = inputs[2] if len(inputs) > 2 else None
    conv = _as_conv(ctx.node, x.shape[2:], w.shape[2:])
    sub = KernelContext(ctx.xp, conv, [], [], ctx.scratch)
    conv_grad(sub, [x, y, w], [y])  # y stands for the Conv's input: only its shape is read
    if b is not None:
        y3 = y.reshape(y.shape[0], y.shape[1], -1)
        ctx.xp.add(y3, b.reshape(-1, 1), out=y3)


def conv_transpose_grad_scratch(node, in_specs, out_specs) -> int:
    """dX is a Conv of dY; dW a ConvGrad's dW (dy: X, x: dY); one after the other."""
    dy, x, w = in_specs[0], in_specs[1], in_specs[2]
    conv = _as_conv(node, x.shape[2:], w.shape[2:])
    need_dx = len(out_specs) > 0 and out_specs[0] is not None
    need_dw = len(out_specs) > 1 and out_specs[1] is not None
    dx_bytes = conv_scratch(conv, [dy, w], [x]) if need_dx else 0
    dw_bytes = conv_grad_scratch(conv, [x, dy, w], [None, w]) if need_dw else 0
    return max(dx_bytes, dw_bytes)


@kernel("ConvTransposeGrad", MS, scratch=conv_transpose_grad_scratch)
def conv_transpose_grad(ctx: KernelContext, inputs, outputs) -> None:
    """(dY, X, W) -> dX = Conv(dY, W), dW = ConvGrad's dW with X as the gradient, dB = sum of dY."""
    xp = ctx.xp
    dy, x, w = inputs[0], inputs[1], inputs[2]
    dx = outputs[0] if len(outputs) > 0 else None
    dw = outputs[1] if len(outputs) > 1 else None
    db = outputs[2] if len(outputs) > 2 else None
    conv_node = _as_conv(ctx.node, x.shape[2:], w.shape[2:])
    sub = KernelContext(xp, conv_node, [], [], ctx.scratch)
    if dx is not None:
        conv(sub, [dy, w], [dx])
    if dw is not None:
        conv_grad(sub, [x, dy, w], [None, dw])
    if db is not None:
        xp.sum(dy.reshape(dy.shape[0], dy.shape[1], -1), axis=(0, 2), out=db)
