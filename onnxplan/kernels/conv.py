"""Convolution kernels: Conv, ConvTranspose and ONNX Runtime's ConvGrad/ConvTransposeGrad, im2col/col2im
in planned scratch plus BLAS GEMMs."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from onnxplan.ir.graph import Node
from onnxplan.ir.tensor import TensorSpec
from onnxplan.ir.windows import Tap, Window, extent, reads_padding, transpose_pads, window
from onnxplan.kernels import _torch, parallel
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


def _view(xp, a, shape):
    """`a` reshaped without a copy (an out= view must be the array itself)."""
    return np.reshape(a, shape, copy=False) if xp is np else a.reshape(shape)


def _source(win: Window, x, src):
    """(array, first tap's position per spatial axis) of the region of x the window spans: x
    itself, or (when it reads padding) x copied into `src` (nb, C, *extent) with zeros around it."""
    if src is None:
        return x, tuple(-p for p in win.pads_begin)
    src[...] = 0
    inner, outer = [], []
    for p, e, size in zip(win.pads_begin, extent(win), win.in_dims):
        lo, hi = max(-p, 0), min(-p + e, size)
        if hi <= lo:
            return src, (0,) * len(win.kernel)
        inner.append(slice(lo + p, hi + p))
        outer.append(slice(lo, hi))
    lead = (slice(None), slice(None))
    src[lead + tuple(inner)] = x[lead + tuple(outer)]
    return src, (0,) * len(win.kernel)


def _windows(xp, a, starts, win: Window):
    """The (n, C, *out_dims, *kernel) view of every window of `a` whose first tap is at `starts`:
    a[n, c, start + o * s + k * d] (numpy's constructor on a contiguous array: as_strided costs ~5 us)."""
    sp = len(win.kernel)
    st = a.strides
    shape = (*a.shape[:2], *win.out_dims, *win.kernel)
    strides = (*st[:2], *(st[2 + i] * win.strides[i] for i in range(sp)),
               *(st[2 + i] * win.dilations[i] for i in range(sp)))
    offset = sum(s * t for s, t in zip(starts, st[2:]))
    if xp is np and a.flags.c_contiguous:
        return np.ndarray(shape, a.dtype, a, offset, strides)
    a = a[(slice(None), slice(None)) + tuple(slice(s, None) for s in starts)]
    return xp.lib.stride_tricks.as_strided(a, shape, strides)


def _zero_outside(dst, spans, out_dims, lead: int) -> None:
    """Zero dst's outputs outside `spans` (the spatial axes start after `lead` axes)."""
    for a, ((lo, hi), size) in enumerate(zip(spans, out_dims)):
        head = (slice(None),) * (lead + a)
        if lo > 0:
            dst[head + (slice(0, lo),)] = 0
        if hi < size:
            dst[head + (slice(hi, None),)] = 0


MIN_ROW = 4


@functools.lru_cache(maxsize=4096)
def _by_rows(win: Window) -> bool:
    """A 2-D window with unit strides whose output rows are as wide as the input's (pads
    within the kernel's reach): each tap's columns are one contiguous run of a row-padded copy
    of the image (see _im2col_by_rows), with no inner loop per output row. Rows of at least
    MIN_ROW (narrower, zeroing the wrapped columns costs what it saves: vgg16's 2x2 maps)."""
    if (len(win.kernel) != 2 or win.strides != (1, 1) or win.out_dims[1] != win.in_dims[1]
            or win.out_dims[1] < MIN_ROW):
        return False
    return 0 <= win.pads_begin[1] <= (win.kernel[1] - 1) * win.dilations[1]


def _im2col_by_rows(xp, win: Window, x, col, src) -> None:
    """im2col for a _by_rows window: per image and channel, X's rows padded with zero rows (and
    (kw - 1) * dw zeros in all) flat in `src`, where tap (i, j)'s columns are the run starting at
    i * dh * W + j * dw: one strided copy for every tap, then the few columns that wrapped
    around a row edge (outside the tap's span) zeroed."""
    nb, c, h, wd = x.shape
    (kh, kw), (dh, dw) = win.kernel, win.dilations
    ph, pw = win.pads_begin
    rows = extent(win)[0]  # padded rows: input row r - ph at row r
    size = rows * wd + (kw - 1) * dw
    flat = src.reshape(-1)[:nb * c * size].reshape(nb, c, size)
    lo, hi = max(0, -ph), min(h, rows - ph)  # the input rows it holds
    head, body = pw + (lo + ph) * wd, max(hi - lo, 0) * wd
    flat[:, :, :head] = 0
    flat[:, :, head:head + body] = x.reshape(nb, c, h * wd)[:, :, lo * wd:lo * wd + body]
    flat[:, :, head + body:] = 0
    run = win.out_dims[0] * wd
    e = flat.itemsize
    shape, strides = (c, kh, kw, nb, run), (flat.strides[1], dh * wd * e, dw * e, flat.strides[0], e)
    if xp is np:
        taps = np.ndarray(shape, flat.dtype, flat, 0, strides)
    else:
        taps = xp.lib.stride_tricks.as_strided(flat, shape, strides)
    col6 = _view(xp, col, (c, kh, kw, nb, win.out_dims[0], wd))  # a view even of one part's images
    xp.copyto(_view(xp, col6, shape), taps)
    for j in range(kw):
        first, end, _start = win.span(1, j)
        if first > 0:
            col6[:, :, j, :, :, :first] = 0
        if end < wd:
            col6[:, :, j, :, :, end:] = 0


# im2col and col2im are cut across the compute threads from the sizes where a one-pass ufunc is
# (kernels.parallel.MIN_ELEMS per piece): a copy of columns is one pass over them. Measured on 2
# cores with a load average of 8 from other processes: nnt-conv2d's chunk of columns
# (1.7M elements) took 0.51 ms in one piece and 0.56 ms in two, so smaller copies stay whole.


def _image_parts(xp, nb: int, c: int, numel: int) -> list[tuple[str, int, int]]:
    """How im2col / col2im over `nb` images of `c` channels (`numel` column elements) is cut for
    the compute threads: ("n", lo, hi) ranges of images, or of channels ("c") for one image;
    one part when the columns are small."""
    parts = parallel.parts_for(numel, xp)
    axis, count = ("n", nb) if nb > 1 else ("c", c)
    parts = min(parts, count)
    return [(axis, lo, hi) for lo, hi in parallel.bounds(count, parts)]


def _image_part(sp: int, part: tuple[str, int, int], x, col, src=None):
    """(x, col, src) of one part: views of the images (or, for one image, the channels) it
    owns; x is (nb, C, ...), col (C, *kernel, nb, ...), src the padded source's scratch (nb, C,
    ...) or flat: the part's own contiguous block of it, in the same form."""
    axis, lo, hi = part
    if src is not None:
        blocks = src.reshape(x.shape[0], x.shape[1], -1)  # its memory per image and channel
        block = blocks[lo:hi] if axis == "n" else blocks[:, lo:hi]
        src = np.reshape(block, (*block.shape[:2], *src.shape[2:]) if src.ndim > 2 else (-1,), copy=False)
    if axis == "n":
        return x[lo:hi], col[(slice(None),) * (1 + sp) + (slice(lo, hi),)], src
    return x[:, lo:hi], col[lo:hi], src


def im2col(xp, win: Window, x, col, src=None) -> None:
    """_im2col_whole, cut by images (or channels) across the compute threads when the columns
    are large (kernels.parallel): every part copies its own images' columns, the same bits."""
    parts = _image_parts(xp, x.shape[0], x.shape[1], col.size)
    if len(parts) <= 1:
        _im2col_whole(xp, win, x, col, src)
        return
    sp = len(win.kernel)
    parallel.run([functools.partial(_im2col_whole, xp, win, *_image_part(sp, part, x, col, src))
                  for part in parts])


def _im2col_whole(xp, win: Window, x, col, src=None) -> None:
    """col[c, *k, n, *o] = x[n, c, o * s - p + k * d] (0 in the padding), every channel at once.

    x: (nb, C, *in_dims); col: (C, *kernel, nb, *out_dims). One strided copy of x's windows, from
    `src` (nb, C, *extent), scratch for x's zero-padded copy, when the window reads padding; with
    no `src` there, one strided copy per tap with the padding zeroed around it (a large dense
    conv: long inner loops, and no input-sized copy).
    """
    sp = len(win.kernel)
    if src is not None and _by_rows(win) and reads_padding(win):
        _im2col_by_rows(xp, win, x, col, src)
        return
    if src is None and reads_padding(win):
        xt = x.swapaxes(0, 1)
        every = (slice(None), slice(None))
        for tap in win.taps():
            dst = col[(slice(None), *tap.index)]
            if tap.empty:
                dst[...] = 0
                continue
            _zero_outside(dst, tap.spans, win.out_dims, 2)
            dst[every + tap.out_slices] = xt[every + tap.in_slices]
        return
    windows = _windows(xp, *_source(win, x, src), win)
    xp.copyto(col, windows.transpose(1, *range(2 + sp, 2 + 2 * sp), 0, *range(2, 2 + sp)))


def col2im_add(xp, win: Window, col, dx) -> None:
    """dx[n, c, o * s - p + k * d] += col[c, *k, n, *o]: the adjoint of im2col, accumulated into
    dx; cut by images (or channels) across the compute threads as im2col is (each part adds into
    its own images in the same tap order: the same bits)."""
    parts = _image_parts(xp, dx.shape[0], dx.shape[1], col.size)
    if len(parts) <= 1:
        _col2im_add_whole(xp, win, col, dx)
        return
    sp = len(win.kernel)
    tasks = []
    for part in parts:
        dx_part, col_part, _ = _image_part(sp, part, dx, col)
        tasks.append(functools.partial(_col2im_add_whole, xp, win, col_part, dx_part))
    parallel.run(tasks)


def _col2im_add_whole(xp, win: Window, col, dx) -> None:
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
    output axis; each chunk covers every group (one batched GEMM over the groups). Offsets are
    -1 for buffers the layout does not use.
    """

    n: int
    rows_out: int  # the first output axis's length
    nb: int  # images per chunk
    band: int  # output rows per chunk (rows_out unless nb == 1)
    col: int  # the columns (C * prod(kernel), nb * band * rest), rest = prod(out_dims[1:])
    rows: int  # output/dY rows in image-interleaved order (M, nb * L), only for nb > 1
    acc: int  # a (M, C/g * prod(kernel)) partial dW, when dW takes more than one chunk
    src: int  # X's zero-padded copy (nb, C, *extent) when the window reads padding
    nbytes: int

    def chunks(self):
        """(first image, images, first row, end row) of each chunk, in order."""
        for n0 in range(0, self.n, self.nb):
            for b0 in range(0, self.rows_out, self.band):
                yield n0, min(self.nb, self.n - n0), b0, min(b0 + self.band, self.rows_out)


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _layout(x_shape, w_shape, y_dims, group: int, itemsize: int, need_cols: bool,
            need_acc: bool, win: Window | None = None) -> Layout:
    """_layout_for at the current SCRATCH_TARGET (read at call time: tests lower it)."""
    return _layout_for(SCRATCH_TARGET, tuple(x_shape), tuple(w_shape), tuple(y_dims), group, itemsize,
                       need_cols, need_acc, win)


@functools.lru_cache(maxsize=4096)
def _layout_for(target: int, x_shape, w_shape, y_dims, group: int, itemsize: int, need_cols: bool,
                need_acc: bool, win: Window | None) -> Layout:
    """The chunking and scratch of a conv (the scratch rule and the kernel share it).

    Chunks aim at `target` bytes of columns, rows and padded source (SCRATCH_TARGET): several
    whole images when one image's fit, else bands of one image's output rows (at least one row).
    `win` (given when the columns are made from X) adds X's zero-padded copy when the window
    reads padding. ConvGrad adds a dW-sized partial sum when there is more than one chunk. A
    depthwise conv (see _depthwise) always has its rows (channels-last) and a (taps, C) block.
    """
    n, c, m = x_shape[0], x_shape[1], w_shape[0]
    ck, ckg, rows_out = c * prod(w_shape[2:]), prod(w_shape[1:]), y_dims[0]
    rest = prod(y_dims[1:])
    if not need_cols:
        return Layout(n, rows_out, n, rows_out, -1, -1, -1, -1, 0)
    padded = win is not None and reads_padding(win)
    spans = extent(win) if padded else (0,)
    s0, reach0 = (win.strides[0], spans[0] - (rows_out - 1) * win.strides[0]) if padded else (0, 0)
    src_rest = c * prod(spans[1:]) if padded else 0  # padded elements per extent row

    def src_elems(nb: int, band: int) -> int:
        return nb * src_rest * ((band - 1) * s0 + reach0) if padded else 0

    depthwise = _depthwise(x_shape, w_shape, group)
    per_image = ((ck + m) * rows_out * rest + src_elems(1, rows_out)) * itemsize
    nb = max(1, min(n, target // per_image))
    band = rows_out
    if nb == 1:
        per_row = (ck * rest + src_rest * s0) * itemsize
        band = max(1, min(rows_out, (target - src_rest * reach0 * itemsize) // per_row))
    col_bytes = _align(ck * nb * band * rest * itemsize)
    rows_bytes = _align(m * nb * band * rest * itemsize) if nb > 1 or depthwise else 0
    several = nb < n or band < rows_out
    acc_bytes = _align(m * ckg * itemsize) if (need_acc and several) or depthwise else 0
    src_bytes = _align(src_elems(nb, band) * itemsize)
    offset = col_bytes
    rows = offset if rows_bytes else -1
    offset += rows_bytes
    acc = offset if acc_bytes else -1
    offset += acc_bytes
    src = offset if src_bytes else -1
    return Layout(n, rows_out, nb, band, 0, rows, acc, src, offset + src_bytes)


# Per-node memos (_conv_window, _as_conv) hold at most this many entries each, the oldest evicted first.
NODE_MEMO_ENTRIES = 4096
_WINDOWS: dict[tuple, tuple[dict, Window]] = {}
_AS_CONV: dict[tuple, tuple[dict, Node]] = {}


def _node_memo(memo: dict, node_attrs: dict, key: tuple, make: Callable[[], Any]) -> Any:
    """make(), remembered in `memo` per attribute dict (by identity: a node's attributes do not
    change once it runs) and `key`; the entry holds the dict, so its id is not reused while the
    entry lives. At most NODE_MEMO_ENTRIES entries, the oldest evicted first."""
    key = (id(node_attrs), *key)
    hit = memo.get(key)
    if hit is not None and hit[0] is node_attrs:
        return hit[1]
    value = make()
    while len(memo) >= NODE_MEMO_ENTRIES:
        del memo[next(iter(memo))]
    memo[key] = (node_attrs, value)
    return value


def _conv_window(node_attrs, x_shape, w_shape, y_shape) -> Window:
    """window() of a conv node, remembered per attribute dict and shapes (a step calls the same
    nodes again, and window() costs ~6 us)."""
    return _node_memo(_WINDOWS, node_attrs, (tuple(x_shape), tuple(w_shape), tuple(y_shape)),
                      lambda: window(node_attrs, x_shape[2:], y_shape[2:], w_shape[2:]))


def _depthwise(x_shape, w_shape, group: int) -> bool:
    """One input and one output channel per group: Y[n, c] = sum over taps t of W[c, t] X[n, c] at
    t's positions, computed on channels-last columns (T, n, *out, C) by an elementwise product and
    a sum over the taps (a GEMM per channel would be a (1, T) @ (T, L) call each)."""
    return group > 1 and int(x_shape[1]) == group and int(w_shape[0]) == group


def _channels_last_cols(xp, win: Window, x, col, src) -> None:
    """col[*k, n, *o, c] = x[n, c, o * s - p + k * d] (0 in the padding): one strided copy, the
    channels innermost (an image's few positions make short inner loops in im2col's order)."""
    sp = len(win.kernel)
    windows = _windows(xp, *_source(win, x, src if reads_padding(win) else None), win)
    xp.copyto(col, windows.transpose(*range(2 + sp, 2 + 2 * sp), 0, *range(2, 2 + sp), 1))


def _last(a):
    """a (n, C, *spatial) as (n, *spatial, C): a view."""
    return a.transpose(0, *range(2, a.ndim), 1)


def _taps_last(xp, w, c: int, kernel, out, flip: bool = False):
    """W (C, 1, *kernel) copied into `out` as (taps, C), the taps flipped when `flip`."""
    wk = _last(w.reshape(1, c, *kernel))[0]
    if flip:
        wk = wk[(slice(None, None, -1),) * len(kernel)]
    xp.copyto(out.reshape(*kernel, c), wk)
    return out


def _depthwise_sum(ctx: KernelContext, lay: Layout, col, wk, out) -> None:
    """out (nb, C, L) = sum over taps of col (taps, nb, L, C) * wk (taps, C), via the rows."""
    xp = ctx.xp
    nb, length, c = col.shape[1:]
    last = ctx.scratch_array(lay.rows, (nb, length, c), col.dtype)
    xp.multiply(col, wk.reshape(-1, 1, 1, c), out=col)
    xp.sum(col, axis=0, out=last)
    xp.copyto(out, last.transpose(0, 2, 1))


def _channels_last_chunks(ctx: KernelContext, lay: Layout, win: Window, x):
    """Per chunk of `lay` (images n0.., nb of them, output rows b0..b1): its channels-last
    columns of X in scratch, as (taps, nb, positions, C)."""
    c = x.shape[1]
    for n0, nb, b0, b1 in lay.chunks():
        sub = win.band(b0, b1)
        col = ctx.scratch_array(lay.col, (*win.kernel, nb, *sub.out_dims, c), x.dtype)
        _channels_last_cols(ctx.xp, sub, x[n0:n0 + nb], col, _src(ctx, lay, sub, nb, c, x.dtype))
        yield n0, nb, b0, b1, col.reshape(prod(win.kernel), nb, -1, c)


def _depthwise_conv(ctx: KernelContext, lay: Layout, win: Window, x, w, y) -> None:
    """Y[n, c] = sum over taps of W[c, tap] * columns (channels-last), chunk by chunk."""
    xp, c, taps = ctx.xp, x.shape[1], prod(win.kernel)
    wk = _taps_last(xp, w, c, win.kernel, ctx.scratch_array(lay.acc, (taps, c), w.dtype))
    rest = prod(y.shape[3:])
    y3 = y.reshape(y.shape[0], c, -1)
    for n0, nb, b0, b1, col in _channels_last_chunks(ctx, lay, win, x):
        _depthwise_sum(ctx, lay, col, wk, y3[n0:n0 + nb, :, b0 * rest:b1 * rest])


def _depthwise_dw(ctx: KernelContext, lay: Layout, win: Window, dy, x, dw) -> None:
    """dW[c, tap] = sum over images and positions of dY[n, c] * columns (channels-last)."""
    xp, c, taps = ctx.xp, x.shape[1], prod(win.kernel)
    dwk = dw.reshape(c, taps).T
    rest = prod(dy.shape[3:])
    dy3 = dy.reshape(dy.shape[0], c, -1)
    for n0, nb, b0, b1, col in _channels_last_chunks(ctx, lay, win, x):
        last = ctx.scratch_array(lay.rows, col.shape[1:], x.dtype)
        xp.copyto(last, dy3[n0:n0 + nb, :, b0 * rest:b1 * rest].transpose(0, 2, 1))
        xp.multiply(col, last, out=col)
        acc = ctx.scratch_array(lay.acc, (taps, c), x.dtype)
        xp.sum(col, axis=(1, 2), out=acc)
        if n0 == 0 and b0 == 0:
            xp.copyto(dwk, acc)
        else:
            xp.add(dwk, acc, out=dwk)


# ---- a large depthwise conv tap by tap: one multiply-add per kernel position over whole views --------
TAPS_MIN_ELEMS = 1 << 15  # outputs (Y, dY) from which a depthwise conv runs tap by tap
TAPS_MIN_WIDTH = 8  # output rows from which the taps run on NCHW views (else on channels-last copies)


def _by_taps(x_shape, w_shape, y_shape, group: int, torch: bool | None = None) -> bool:
    """A depthwise conv with enough outputs that one call per kernel position over the whole
    batch (a multiply-add of views, no columns: torch's addcmul_, ~5-10 us a call with its views)
    beats copying T columns of the output (measured: a strided conv onto 9600 outputs is 3x slower
    tap by tap). Maps with short rows (< TAPS_MIN_WIDTH: 6x6, 3x3) take the taps on channels-last
    copies, on torch only (numpy's per-tap calls over them lose to the columns). torch: whether
    torch's kernels are on (None: as this process runs them, ONNXPLAN_TORCH_KERNELS)."""
    torch = _torch.enabled() if torch is None else torch
    return (_depthwise(x_shape, w_shape, group) and prod(y_shape) >= TAPS_MIN_ELEMS
            and (int(y_shape[-1]) >= TAPS_MIN_WIDTH or torch))


def _taps_choices(x_shape, w_shape, y_shape, group: int) -> set[bool]:
    """The values _by_taps may take when the plan runs: a plan is made in one process and may run
    in another with torch's kernels off (or on), so a scratch rule covers every path it may take."""
    return {_by_taps(x_shape, w_shape, y_shape, group, torch) for torch in (False, True)}


@dataclass(frozen=True)
class TapsLayout:
    """The tap-by-tap path's chunks of `nb` images and scratch: X's phases (a strided window:
    X[n, c, q + s * i] for each phase q < s per axis, as unit-stride blocks (phases, nb, C, *dims),
    so that every tap reads or writes unit strides; -1 for unit strides or channels-last), or, for
    maps with short rows, channels-last copies of X and Y (nb, *dims, C) (`last_x`, `last_y`; -1
    otherwise); the products of a chunk (nb, C, *out) for dW (and Conv/dX off torch), a (C,)
    partial dW sum, and W as (taps, C) (each tap's weights contiguous: channels-last loops read them
    in order)."""

    nb: int
    phases: int
    dims: tuple[int, ...]  # a phase block's spatial dims: ceil(in / s)
    last_x: int
    last_y: int
    products: int
    acc: int
    weights: int
    nbytes: int


def _taps_layout(win: Window, x_shape, y_shape, itemsize: int) -> TapsLayout:
    return _taps_layout_for(SCRATCH_TARGET, win, tuple(x_shape), tuple(y_shape), itemsize)


@functools.lru_cache(maxsize=4096)
def _taps_layout_for(target: int, win: Window, x_shape, y_shape, itemsize: int) -> TapsLayout:
    c, last = x_shape[1], y_shape[-1] < TAPS_MIN_WIDTH
    strided = any(s > 1 for s in win.strides) and not last
    dims = tuple(-(-i // s) for i, s in zip(win.in_dims, win.strides))
    phase_elems = prod(win.strides) * c * prod(dims) if strided else 0
    x_elems, y_elems = prod(x_shape[1:]), prod(y_shape[1:])
    per_image = (phase_elems + y_elems + ((x_elems + y_elems) if last else 0)) * itemsize
    nb = max(1, min(y_shape[0], target // per_image))
    last_x = _align(nb * phase_elems * itemsize)
    last_y = last_x + (_align(nb * x_elems * itemsize) if last else 0)
    products = last_y + (_align(nb * y_elems * itemsize) if last else 0)
    acc = products + _align(nb * y_elems * itemsize)
    weights = acc + _align(c * itemsize)
    return TapsLayout(nb, 0 if strided else -1, dims, last_x if last else -1, last_y if last else -1,
                      products, acc, weights, weights + _align(prod(win.kernel) * c * itemsize))


def _on_torch(xp, *arrays) -> bool:
    """True when the tap loop may run on torch views of these arrays."""
    return (_torch.enabled() and xp is np and arrays[0].dtype in (np.float32, np.float64)
            and all(isinstance(a, np.ndarray) for a in arrays))


def _covers(tap: Tap, dims) -> bool:
    """True when the tap's output positions are every position of `dims`."""
    return all(lo == 0 and hi == d for (lo, hi), d in zip(tap.spans, dims))


def _tap_weights(w, c: int, sp: int):
    """W (C, 1, *kernel) as (taps, 1, C, 1, ...): each tap's weights broadcast over an image."""
    return w.reshape(c, -1).T.reshape(-1, 1, c, *(1,) * sp)


def _phase_of(win: Window, tap: Tap) -> tuple[int, tuple[slice, ...]]:
    """(phase number, unit-stride slices in that phase's block) of the input a tap reads."""
    q, number, slices = 0, 0, []
    for sl, s, (lo, hi) in zip(tap.in_slices, win.strides, tap.spans):
        q = sl.start % s
        number = number * s + q
        slices.append(slice(sl.start // s, sl.start // s + hi - lo))
    return number, tuple(slices)


def _tap_input(win: Window, tap: Tap, phases, x):
    """The view of X a tap reads: in X itself, or (`phases` given) in its phase block."""
    if phases is None:
        return x[(slice(None), slice(None)) + tap.in_slices]
    q, slices = _phase_of(win, tap)
    return phases[q][(slice(None), slice(None)) + slices]


def _phase_slices(win: Window):
    """Per phase: (slices of X it takes, the block's slices they fill)."""
    for q in itertools.product(*(range(s) for s in win.strides)):
        lengths = [max(0, -(-(i - p) // s)) for i, p, s in zip(win.in_dims, q, win.strides)]
        yield (tuple(slice(p, None, s) for p, s in zip(q, win.strides)),
               tuple(slice(0, k) for k in lengths))


def _phases(ctx: KernelContext, lay: TapsLayout, win: Window, nb: int, c: int, dtype):
    return ctx.scratch_array(lay.phases, (prod(win.strides), nb, c, *lay.dims), dtype)


def _channels_last(ctx: KernelContext, offset: int, like, dtype, fill=None):
    """A (nb, C, *dims) torch view of a channels-last block of scratch, `fill`'s values copied in."""
    nb, c, *dims = like.shape
    block = _torch.tensor(ctx.scratch_array(offset, (nb, *dims, c), dtype))
    view = block.permute(0, len(dims) + 1, *range(1, len(dims) + 1))
    if fill is not None:
        view.copy_(fill)
    return view


def _taps_accumulate(ctx: KernelContext, win: Window, src, w, dst, adjoint: bool, init=None) -> None:
    """Conv (adjoint False): dst[n, c, o] = init[c] + sum over taps of W[c, tap] src[n, c, tap's
    input at o]; dX (adjoint True): dst[n, c, tap's input at o] += W[c, tap] src[n, c, o] for every
    tap, from zeros. On torch, one multiply-add per live tap over a chunk of images (addcmul_ on
    views of the arrays; with strides, on X's phases in scratch, so that every view has unit
    strides); off torch, a multiply into scratch and an add per tap and chunk."""
    xp, c, sp = ctx.xp, src.shape[1], len(win.kernel)
    every = (slice(None), slice(None))
    taps = win.taps()
    x, y = (dst, src) if adjoint else (src, dst)
    lay = _taps_layout(win, x.shape, y.shape, src.itemsize)
    if not _on_torch(xp, src, w, dst):
        wk = _tap_weights(w, c, sp)
        for n0 in range(0, src.shape[0], lay.nb):
            s, d = src[n0:n0 + lay.nb], dst[n0:n0 + lay.nb]
            d[...] = 0 if init is None else init.reshape(1, c, *(1,) * sp)
            for k, tap in enumerate(taps):
                if tap.empty:
                    continue
                a, b = (every + tap.out_slices, every + tap.in_slices)
                read, write = (a, b) if adjoint else (b, a)
                tmp = ctx.scratch_array(lay.products, s[read].shape, src.dtype)
                xp.multiply(s[read], wk[k], out=tmp)
                xp.add(d[write], tmp, out=d[write])
        return
    torch = _torch.load()
    wk = _torch.tensor(_taps_last(xp, w, c, win.kernel, ctx.scratch_array(lay.weights, (len(taps), c), w.dtype)))
    wk = wk.reshape(-1, 1, c, *(1,) * sp)
    # Conv's first tap may write (not add) when it covers every output
    first = next((t for t in taps if _covers(t, win.out_dims)), None) if init is None and not adjoint else None
    order = sorted(range(len(taps)), key=lambda k: taps[k] is not first)
    nb = lay.nb if lay.phases >= 0 or lay.last_x >= 0 else src.shape[0]
    t_x, t_y = _torch.tensor(x), _torch.tensor(y)
    for n0 in range(0, src.shape[0], nb):
        xs, ys = out_x, out_y = t_x[n0:n0 + nb], t_y[n0:n0 + nb]
        if lay.last_x >= 0:  # channels-last copies: the taps' inner loops run over the channels
            xs = _channels_last(ctx, lay.last_x, out_x, src.dtype, None if adjoint else out_x)
            ys = _channels_last(ctx, lay.last_y, out_y, src.dtype, out_y if adjoint else None)
        if lay.phases >= 0:
            ph = _torch.tensor(_phases(ctx, lay, win, xs.shape[0], c, src.dtype))
            for q, (taken, filled) in enumerate(_phase_slices(win)):
                if adjoint:
                    ph[q].zero_()
                else:
                    ph[q][every + filled].copy_(xs[every + taken])
        if not adjoint:
            if init is not None:
                ys.copy_(_torch.tensor(init).reshape(1, c, *(1,) * sp).expand_as(ys))
            elif first is None:
                ys.zero_()
        elif lay.phases < 0:
            xs.zero_()
        for k in order:
            tap = taps[k]
            if tap.empty:
                continue
            xv = _tap_input(win, tap, ph if lay.phases >= 0 else None, xs)
            yv = ys[every + tap.out_slices]
            if adjoint:
                xv.addcmul_(yv, wk[k])
            elif tap is first:
                torch.mul(xv, wk[k], out=yv)
            else:
                yv.addcmul_(xv, wk[k])
        if adjoint and lay.phases >= 0:
            for q, (taken, filled) in enumerate(_phase_slices(win)):
                xs[every + taken].copy_(ph[q][every + filled])
        if lay.last_x >= 0:
            (out_x if adjoint else out_y).copy_(xs if adjoint else ys)


def _taps_dw(ctx: KernelContext, win: Window, dy, x, dw) -> None:
    """dW[c, tap] = sum over images and positions of dY[n, c, o] X[n, c, tap's input at o]: per
    chunk of images and tap, the products into scratch and their sum per channel (on torch, X's
    phases in scratch when the window has strides, as in _taps_accumulate)."""
    xp, c, sp = ctx.xp, x.shape[1], len(win.kernel)
    lay = _taps_layout(win, x.shape, dy.shape, dy.itemsize)
    every = (slice(None), slice(None))
    axes = (0, *range(2, 2 + sp))
    dwk, acc = dw.reshape(c, -1), ctx.scratch_array(lay.acc, (c,), dy.dtype)
    products = ctx.scratch_array(lay.products, (lay.nb * prod(dy.shape[1:]),), dy.dtype)
    torch, dtype = _on_torch(xp, dy, x, dw), dy.dtype
    if torch:
        dy, x, dwk, acc, products = (_torch.tensor(a) for a in (dy, x, dwk, acc, products))
        mul, total = _torch.load().mul, functools.partial(_torch.load().sum, dim=axes)
    else:
        mul, total = xp.multiply, functools.partial(xp.sum, axis=axes)
    last = torch and lay.last_x >= 0
    for n0 in range(0, dy.shape[0], lay.nb):
        d_part, x_part = dy[n0:n0 + lay.nb], x[n0:n0 + lay.nb]
        phased = torch and lay.phases >= 0
        if last:  # channels-last copies, and the products channels-last
            d_part = _channels_last(ctx, lay.last_y, d_part, dtype, d_part)
            x_part = _channels_last(ctx, lay.last_x, x_part, dtype, x_part)
        if phased:
            ph = _torch.tensor(_phases(ctx, lay, win, x_part.shape[0], c, dtype))
            for q, (taken, filled) in enumerate(_phase_slices(win)):
                ph[q][every + filled].copy_(x_part[every + taken])
        for k, tap in enumerate(win.taps()):
            out = dwk[:, k]
            if tap.empty:
                if n0 == 0:
                    out[...] = 0
                continue
            b = _tap_input(win, tap, ph if phased else None, x_part)
            a = d_part[every + tap.out_slices]
            if last:
                tmp = products[:prod(a.shape)].reshape(a.shape[0], *a.shape[2:], c).permute(
                    0, sp + 1, *range(1, sp + 1))
            else:
                tmp = products[:prod(a.shape)].reshape(a.shape)
            mul(a, b, out=tmp)
            total(tmp, out=out if n0 == 0 else acc)
            if n0:
                out += acc


def _one_copy(win: Window, x_shape, w_shape, y_shape, group: int) -> Window | None:
    """`win` when the columns are one strided copy from a padded source (grouped and small convs:
    a call per tap costs more than the copy; _by_rows windows: a run per tap from a row-padded
    copy), else None (im2col copies tap by tap)."""
    return win if group > 1 or prod(y_shape) <= SMALL_DX or _by_rows(win) else None


def _src(ctx: KernelContext, lay: Layout, sub: Window, nb: int, c: int, dtype):
    """The chunk's padded-source scratch, or None when its window reads no padding."""
    if lay.src < 0 or not reads_padding(sub):
        return None
    return ctx.scratch_array(lay.src, (nb, c, *extent(sub)), dtype)


def conv_scratch(node, in_specs, out_specs) -> int:
    """Columns for a chunk of about SCRATCH_TARGET bytes (whole images, or a band of one image's
    output rows, at least one row), X's zero-padded copy when the window reads padding, plus, for
    chunks of several images, their output rows; none for a pointwise (1x1, stride 1, unpadded)
    convolution."""
    x, w, y = in_specs[0], in_specs[1], out_specs[0]
    win = _conv_window(node.attrs, x.shape, w.shape, y.shape)
    group = int(node.attrs.get("group", 1))
    choices = {False} if win.pointwise else _taps_choices(x.shape, w.shape, y.shape, group)
    taps = _taps_layout(win, x.shape, y.shape, x.itemsize).nbytes if True in choices else 0
    if False not in choices:
        return taps
    return max(taps, _layout(x.shape, w.shape, y.shape[2:], group, x.itemsize, not win.pointwise, False,
                             _one_copy(win, x.shape, w.shape, y.shape, group)).nbytes)


def _bind_conv(ctx: KernelContext, inputs, outputs):
    """A pointwise conv's one batched GEMM (and bias add) on views made once: the plain kernel's
    calls, same bits; other convs keep the plain kernel (their setup is memoized already)."""
    if ctx.xp is not np:
        return None
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    y = outputs[0]
    group = int(ctx.attrs.get("group", 1))
    if not _conv_window(ctx.attrs, x.shape, w.shape, y.shape).pointwise:
        return None
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg, length = c // group, m // group, prod(y.shape[2:])
    w3, xg = w.reshape(group, mg, prod(w.shape[1:])), x.reshape(n, group, cg, length)
    yg = _view(np, y, (n, group, mg, length))
    y3 = y.reshape(n, m, length)
    b2 = b.reshape(m, 1) if b is not None else None

    def run(ctx_, inputs_, outputs_):
        np.matmul(w3, xg, out=yg)
        if b2 is not None:
            np.add(y3, b2, out=y3)

    return run


# Output positions per image from which a chunk of several images takes one GEMM per image
# straight into Y (long rows: the GEMMs stay efficient, and Y is written once instead of through
# the rows in scratch; measured: resnet18's 32x32 stem -15%, its 64-channel layers -7%).
DIRECT_LENGTH = 1024


@kernel("Conv", scratch=conv_scratch, bind=_bind_conv)
def conv(ctx: KernelContext, inputs, outputs) -> None:
    """Y = W * X (+ B): per chunk, im2col of every channel, then one GEMM batched over the groups
    into Y (or into rows, then Y; or, for long images, one per image into Y)."""
    xp = ctx.xp
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    y = outputs[0]
    group = int(ctx.attrs.get("group", 1))
    win = _conv_window(ctx.attrs, x.shape, w.shape, y.shape)
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg, length = c // group, m // group, prod(y.shape[2:])
    ckg, rest = prod(w.shape[1:]), length // y.shape[2]
    w3 = w.reshape(group, mg, ckg)
    y3 = y.reshape(n, m, length)
    if win.pointwise:  # Y[n, g] = W[g] @ X[n, g] for every image and group in one batched call
        xp.matmul(w3, x.reshape(n, group, cg, length), out=_view(xp, y, (n, group, mg, length)))
    elif _by_taps(x.shape, w.shape, y.shape, group):  # the bias first, then every tap added
        _taps_accumulate(ctx, win, x, w, y, False, b)
        return
    elif _depthwise(x.shape, w.shape, group):
        _depthwise_conv(ctx, _layout(x.shape, w.shape, y.shape[2:], group, x.itemsize, True, False, win),
                        win, x, w, y)
    else:
        lay = _layout(x.shape, w.shape, y.shape[2:], group, x.itemsize, True, False,
                      _one_copy(win, x.shape, w.shape, y.shape, group))
        for n0, nb, b0, b1 in lay.chunks():
            sub = win.band(b0, b1)
            span = nb * (b1 - b0) * rest
            col = ctx.scratch_array(lay.col, (c, *win.kernel, nb, *sub.out_dims), x.dtype)
            im2col(xp, sub, x[n0:n0 + nb], col, _src(ctx, lay, sub, nb, c, x.dtype))
            cols = col.reshape(group, ckg, span)
            if nb == 1:
                xp.matmul(w3, cols, out=_view(xp, y3[n0, :, b0 * rest:b1 * rest], (group, mg, span)))
                continue
            if length >= DIRECT_LENGTH:  # a GEMM per image into Y, its columns a strided block
                per_image = cols.reshape(group, ckg, nb, length).transpose(2, 0, 1, 3)
                xp.matmul(w3, per_image, out=_view(xp, y3[n0:n0 + nb], (nb, group, mg, length)))
                continue
            rows = ctx.scratch_array(lay.rows, (m, span), x.dtype)
            xp.matmul(w3, cols, out=rows.reshape(group, mg, span))
            xp.copyto(y3[n0:n0 + nb], rows.reshape(m, nb, length).swapaxes(0, 1))
    if b is not None:
        parallel.ufunc(xp, "add", y3, y3, b.reshape(m, 1))  # by images across the compute threads: same bits


def _direct_dw(x_shape, length: int, pointwise: bool) -> bool:
    """A pointwise dW that needs no columns: one image, or one position per image."""
    return pointwise and (x_shape[0] == 1 or length == 1)


SMALL_DX = 1 << 15  # dY elements up to which a group-1 conv's dX is computed as a conv too


@dataclass(frozen=True)
class DxPlan:
    """dX of a conv computed as a conv: of dY dilated by the strides (zeros between its values)
    and shifted, with W flipped and transposed per group. Whole images per chunk; in the scratch
    after the conv's own layout: the dilated dY (nb, M, *dims) and the flipped weight."""

    window: Window  # over the dilated dY: unit strides, W's dilations, onto X's positions
    layout: Layout
    dims: tuple[int, ...]  # the dilated dY's spatial dims
    reach: tuple[int, ...]  # where dY's first value sits in it, per axis: (k - 1) * d
    dilated: int  # scratch offsets
    weight: int
    nbytes: int
    by_taps: bool = False  # a strided depthwise conv: see _depthwise_dx_by_taps


def _dx_plan(x_shape, w_shape, dy_shape, win: Window, group: int, itemsize: int) -> DxPlan | None:
    """The conv that computes dX, for a grouped conv or a small one with unit strides (one GEMM
    per chunk instead of a col2im add per tap; strides s would make s^d times the columns, mostly
    zeros); None otherwise or when a chunk would not hold whole images."""
    return _dx_plan_for(SCRATCH_TARGET, SMALL_DX, tuple(x_shape), tuple(w_shape), tuple(dy_shape), win,
                        group, itemsize)


@functools.lru_cache(maxsize=4096)
def _dx_plan_for(target: int, small: int, x_shape, w_shape, dy_shape, win: Window, group: int,
                 itemsize: int) -> DxPlan | None:
    n, c, m = x_shape[0], x_shape[1], w_shape[0]
    if not win.pointwise and _depthwise(x_shape, w_shape, group) and any(st > 1 for st in win.strides):
        lay = _layout(x_shape, w_shape, dy_shape[2:], group, itemsize, True, False)
        if lay.band < lay.rows_out:
            return None
        end = lay.nbytes + _align(lay.nb * c * prod(win.in_dims) * itemsize)
        return DxPlan(win, lay, win.in_dims, (), lay.nbytes, end, end, by_taps=True)
    if win.pointwise or any(st > 1 for st in win.strides) or (group == 1 and prod(dy_shape) > small):
        return None
    sp = len(win.kernel)
    reach = tuple((k - 1) * d for k, d in zip(win.kernel, win.dilations))
    dims = tuple(p + i + r for p, i, r in zip(win.pads_begin, win.in_dims, reach))
    twin = Window(win.kernel, (1,) * sp, win.dilations, tuple(-p for p in win.pads_begin), (0,) * sp,
                  dims, win.in_dims)
    lay = _layout((n, m, *dims), (c, m // group, *win.kernel), win.in_dims, group, itemsize, True, False)
    if lay.band < lay.rows_out:
        return None
    dilated = lay.nbytes
    weight = dilated + _align(lay.nb * m * prod(dims) * itemsize)
    w_bytes = 0 if _depthwise(x_shape, w_shape, group) else _align(prod(w_shape) * itemsize)
    return DxPlan(twin, lay, dims, reach, dilated, weight, weight + w_bytes)


def _depthwise_dx_by_taps(ctx: KernelContext, plan: DxPlan, win: Window, dy, w, dx) -> None:
    """A strided depthwise conv's dX: products dY[n, c] * W[c, tap] (channels-last, one call), then
    each tap's added into dX's positions in a channels-last image (scratch), copied into dX."""
    xp, lay = ctx.xp, plan.layout
    n, c, sp, taps = dy.shape[0], dy.shape[1], len(win.kernel), prod(win.kernel)
    wk = _taps_last(xp, w, c, win.kernel, ctx.scratch_array(lay.acc, (taps, c), w.dtype))
    dy3 = dy.reshape(n, c, -1)
    every = (slice(None),)
    for n0, nb, _b0, _b1 in lay.chunks():
        last = ctx.scratch_array(lay.rows, (nb, dy3.shape[2], c), dy.dtype)
        xp.copyto(last, dy3[n0:n0 + nb].transpose(0, 2, 1))
        col = ctx.scratch_array(lay.col, (taps, nb, dy3.shape[2], c), dy.dtype)
        xp.multiply(last, wk.reshape(taps, 1, 1, c), out=col)
        col = col.reshape(*win.kernel, nb, *win.out_dims, c)
        image = ctx.scratch_array(plan.dilated, (nb, *win.in_dims, c), dy.dtype)
        image[...] = 0
        for tap in win.taps():
            if tap.empty:
                continue
            dst = image[every + tap.in_slices]
            xp.add(dst, col[tap.index + every + tap.out_slices], out=dst)
        xp.copyto(dx[n0:n0 + nb], image.transpose(0, sp + 1, *range(1, sp + 1)))


def _conv_grad_dx(ctx: KernelContext, plan: DxPlan, win: Window, dy, w, dx, group: int) -> None:
    """dX[n, g] = W'[g] @ cols of the dilated dY, W'[g, ci, mo, k] = W[g, mo, ci, K - 1 - k]."""
    if plan.by_taps:
        _depthwise_dx_by_taps(ctx, plan, win, dy, w, dx)
        return
    xp = ctx.xp
    n, m, c = dy.shape[0], dy.shape[1], dx.shape[1]
    mg, cg, sp = m // group, c // group, len(win.kernel)
    lin = prod(win.in_dims)
    every = (slice(None), slice(None))
    flip = (slice(None, None, -1),) * sp
    counts = [min(o, (d - r - 1) // s + 1) for o, d, r, s in zip(dy.shape[2:], plan.dims, plan.reach, win.strides)]
    place = every + tuple(slice(r, r + (k - 1) * s + 1, s) for r, k, s in zip(plan.reach, counts, win.strides))
    taken = every + tuple(slice(0, k) for k in counts)
    lay = plan.layout
    if _depthwise(dx.shape, w.shape, group):  # channels-last columns times the flipped taps
        taps = prod(win.kernel)
        wk = _taps_last(xp, w, c, win.kernel, ctx.scratch_array(lay.acc, (taps, c), w.dtype), flip=True)
        for n0, nb, _b0, _b1 in lay.chunks():
            dilated = ctx.scratch_array(plan.dilated, (nb, m, *plan.dims), dy.dtype)
            dilated[...] = 0
            dilated[place] = dy[n0:n0 + nb][taken]
            col = ctx.scratch_array(lay.col, (*win.kernel, nb, *win.in_dims, c), dy.dtype)
            _channels_last_cols(xp, plan.window, dilated, col, None)
            _depthwise_sum(ctx, lay, col.reshape(taps, nb, lin, c), wk, dx.reshape(n, c, lin)[n0:n0 + nb])
        return
    wt = ctx.scratch_array(plan.weight, (group, cg, mg, *win.kernel), w.dtype)
    xp.copyto(wt, w.reshape(group, mg, cg, *win.kernel).swapaxes(1, 2)[every + (slice(None),) + flip])
    wt3 = wt.reshape(group, cg, mg * prod(win.kernel))
    dx3 = dx.reshape(n, c, lin)
    for n0, nb, _b0, _b1 in lay.chunks():
        dilated = ctx.scratch_array(plan.dilated, (nb, m, *plan.dims), dy.dtype)
        dilated[...] = 0
        dilated[place] = dy[n0:n0 + nb][taken]
        col = ctx.scratch_array(lay.col, (m, *win.kernel, nb, *win.in_dims), dy.dtype)
        im2col(xp, plan.window, dilated, col)
        cols = col.reshape(group, mg * prod(win.kernel), nb * lin)
        if nb == 1:
            xp.matmul(wt3, cols, out=_view(xp, dx3[n0], (group, cg, lin)))
            continue
        rows = ctx.scratch_array(lay.rows, (c, nb * lin), dy.dtype)
        xp.matmul(wt3, cols, out=rows.reshape(group, cg, nb * lin))
        xp.copyto(dx3[n0:n0 + nb], rows.reshape(c, nb, lin).swapaxes(0, 1))


@dataclass(frozen=True)
class FlipDx:
    """dX of a dense conv with unit strides, as the Conv of dY with W flipped and transposed:
    dX[n, c, i] = sum over m and taps k of dY[n, m, i + p - k * d] W[m, c, k], i.e. a Conv node
    over dY (pads reach - p, W's dilations) with the weight W'[c, m, K - 1 - k] = W[m, c, k].
    One im2col copy of dY and one GEMM with the long inner dimension M * taps per chunk, where
    col2im would run a GEMM over M alone and a scatter-add per tap. The Conv's own scratch comes
    first, then W' at `weight`."""

    node: Node  # the Conv (made once per window: its attrs key the Conv's memoized window)
    weight: int
    nbytes: int


@functools.lru_cache(maxsize=4096)
def _flip_node(win: Window) -> Node | None:
    pads_begin = [(k - 1) * d - p for k, d, p in zip(win.kernel, win.dilations, win.pads_begin)]
    pads_end = [(k - 1) * d - p for k, d, p in zip(win.kernel, win.dilations, win.pads_end)]
    if min(pads_begin + pads_end) < 0:  # a pad wider than the kernel's reach: col2im serves
        return None
    return Node("conv_grad_dx", "Conv", "", ("dy", "w"), ("dx",),
                {"pads": pads_begin + pads_end, "dilations": list(win.dilations)})


def _flip_dx(x_shape, w_shape, dy_shape, win: Window, group: int, itemsize: int) -> FlipDx | None:
    """The FlipDx of a dense conv with unit strides whose dX _dx_plan leaves to col2im (dY over
    SMALL_DX elements), when its scratch (the Conv's plus W') is no more than the col2im pass of
    a ConvGrad computing dX and dW would declare; else None (tiny maps, W' large against the
    columns, keep col2im). Decided from the shapes alone, never from which outputs the node
    computes: a ConvGrad split into a dX and a dW node (passes.split_grad) must compute the same
    bits as the fused one, so a dX-only node takes the fused node's path (and its scratch)."""
    if (group != 1 or win.pointwise or any(st > 1 for st in win.strides)
            or prod(dy_shape) <= SMALL_DX):
        return None
    return _flip_dx_for(SCRATCH_TARGET, tuple(x_shape), tuple(w_shape), tuple(dy_shape), win, itemsize, True)


@functools.lru_cache(maxsize=4096)
def _flip_dx_for(target: int, x_shape, w_shape, dy_shape, win: Window, itemsize: int,
                 need_dw: bool) -> FlipDx | None:
    node = _flip_node(win)
    if node is None:
        return None
    dtype = f"float{8 * itemsize}"  # the Conv's scratch depends on the item size alone
    w_flipped = (w_shape[1], w_shape[0], *w_shape[2:])
    weight = _align(conv_scratch(node, [TensorSpec(dtype, dy_shape), TensorSpec(dtype, w_flipped)],
                                 [TensorSpec(dtype, x_shape)]))
    flip = FlipDx(node, weight, weight + _align(prod(w_shape) * itemsize))
    col2im = _layout(x_shape, w_shape, dy_shape[2:], 1, itemsize, True, need_dw,
                     _one_copy(win, x_shape, w_shape, dy_shape, 1) if need_dw else None)
    return flip if flip.nbytes <= col2im.nbytes else None


def _flip_conv_grad_dx(ctx: KernelContext, flip: FlipDx, dy, w, dx) -> None:
    """dX = Conv(dY, W') (see FlipDx), W' copied into the scratch after the Conv's."""
    sp = w.ndim - 2
    wf = ctx.scratch_array(flip.weight, (w.shape[1], w.shape[0], *w.shape[2:]), w.dtype)
    ctx.xp.copyto(wf, w.swapaxes(0, 1)[(slice(None), slice(None)) + (slice(None, None, -1),) * sp])
    conv(KernelContext(ctx.xp, flip.node, [], [], ctx.scratch), [dy, wf], [dx])


def conv_grad_scratch(node, in_specs, out_specs) -> int:
    """The most of its passes, which run one after the other: dX as a conv (DxPlan: a grouped or
    small conv; FlipDx: a large dense one with unit strides); a depthwise dW; then Conv's columns
    and rows (see conv_scratch; X's padded copy only for dW) plus a dW-sized partial sum when dW takes more than one chunk. Only dB, a
    pointwise dX, or a pointwise dW of one image or one position per image need none."""
    dy, x, w = in_specs[0], in_specs[1], in_specs[2]
    need_dx = len(out_specs) > 0 and out_specs[0] is not None
    need_dw = len(out_specs) > 1 and out_specs[1] is not None
    win = _conv_window(node.attrs, x.shape, w.shape, dy.shape)
    group = int(node.attrs.get("group", 1))
    need_dx = need_dx and not win.pointwise
    need_dw = need_dw and not _direct_dw(x.shape, prod(dy.shape[2:]), win.pointwise)
    choices = _taps_choices(x.shape, w.shape, dy.shape, group) if need_dx or need_dw else {False}
    taps = _taps_layout(win, x.shape, dy.shape, x.itemsize).nbytes if True in choices else 0
    if False not in choices:
        return taps
    flip = _flip_dx(x.shape, w.shape, dy.shape, win, group, x.itemsize) if need_dx else None
    plan = _dx_plan(x.shape, w.shape, dy.shape, win, group, x.itemsize) if need_dx and flip is None else None
    sizes = [0 if plan is None else plan.nbytes, 0 if flip is None else flip.nbytes]
    need_dx = need_dx and plan is None and flip is None
    if need_dw and _depthwise(x.shape, w.shape, group):
        sizes.append(_layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, True, win).nbytes)
        need_dw = False
    if need_dw or need_dx:
        sizes.append(_layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, need_dw,
                             _one_copy(win, x.shape, w.shape, dy.shape, group) if need_dw else None).nbytes)
    return max(taps, *sizes)


# dW's GEMM with few outputs over a long reduction (a 3-channel stem: 3 x 27 outputs over a
# chunk's 62720 positions) runs in blocks of DW_BLOCK positions, each block's product added into
# dW through the chunk's partial-sum scratch: numpy's OpenBLAS takes the whole reduction in 1.05
# ms, blocks of 4096 in 0.19 ms (8192: 0.17, 16384: 1.03; the least of 20 calls, at 1 and at 2
# BLAS threads alike: OpenBLAS runs that shape on one).
DW_BLOCK = 4096  # positions per block
DW_BLOCK_OUTPUTS = 4096  # dW elements per group up to which dW is summed in blocks


def _dw_blocks(outputs: int, span: int, has_acc: bool) -> list[tuple[int, int]]:
    """The (lo, hi) ranges of positions dW's GEMM sums over, one per call: blocks of DW_BLOCK
    for few outputs over a long reduction (with partial-sum scratch to add them through)."""
    if not has_acc or outputs > DW_BLOCK_OUTPUTS or span <= DW_BLOCK:
        return [(0, span)]
    return [(lo, min(lo + DW_BLOCK, span)) for lo in range(0, span, DW_BLOCK)]


def _dw_gemm(xp, rows, cols, dw3, acc, first: bool) -> None:
    """dW = (first chunk) or += (later ones) rows @ cols^T over the groups: rows (groups, M/g,
    span), cols (groups, C/g * taps, span); `acc` the partial-sum scratch (None: none declared)."""
    blocks = _dw_blocks(rows.shape[1] * cols.shape[1], rows.shape[2], acc is not None)
    for k, (lo, hi) in enumerate(blocks):
        product = (rows[:, :, lo:hi], cols[:, :, lo:hi].transpose(0, 2, 1))
        if first and k == 0:
            xp.matmul(*product, out=dw3)
        else:
            xp.matmul(*product, out=acc)
            xp.add(dw3, acc, out=dw3)


@kernel("ConvGrad", MS, scratch=conv_grad_scratch)
def conv_grad(ctx: KernelContext, inputs, outputs) -> None:
    """(dY, X, W) -> dX, dW, dB (each optional): dW = dY_rows @ cols^T, dX = col2im(W^T @ dY_rows),
    each one GEMM batched over the groups per chunk."""
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
    w3 = w.reshape(group, mg, ckg)
    wt = w3.transpose(0, 2, 1)
    dy3 = dy.reshape(n, m, length)
    if db is not None:
        xp.sum(dy3, axis=(0, 2), out=db)
    if dx is not None and win.pointwise:  # dX[n, g] = W[g]^T @ dY[n, g] for every image and group
        xp.matmul(wt, dy.reshape(n, group, mg, length), out=_view(xp, dx, (n, group, cg, length)))
        dx = None
    if dw is not None and _direct_dw(x.shape, length, win.pointwise):
        # dW[g] = sum over images and positions of dY[g] X[g]^T: one batched GEMM, no columns
        if length == 1:
            rows, xt = dy.reshape(n, group, mg).transpose(1, 2, 0), x.reshape(n, group, cg).transpose(1, 0, 2)
        else:
            rows, xt = dy.reshape(group, mg, length), x.reshape(group, cg, length).transpose(0, 2, 1)
        xp.matmul(rows, xt, out=_view(xp, dw, (group, mg, cg)))
        dw = None
    if _by_taps(x.shape, w.shape, dy.shape, group):
        if dx is not None:
            _taps_accumulate(ctx, win, dy, w, dx, True)
        if dw is not None:
            _taps_dw(ctx, win, dy, x, dw)
        return
    flip = _flip_dx(x.shape, w.shape, dy.shape, win, group, x.itemsize) if dx is not None else None
    if flip is not None:
        _flip_conv_grad_dx(ctx, flip, dy, w, dx)
        dx = None
    plan = _dx_plan(x.shape, w.shape, dy.shape, win, group, x.itemsize) if dx is not None else None
    if plan is not None:
        _conv_grad_dx(ctx, plan, win, dy, w, dx, group)
        dx = None
    if dw is not None and _depthwise(x.shape, w.shape, group):
        _depthwise_dw(ctx, _layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, True, win),
                      win, dy, x, dw)
        dw = None
    if dw is None and dx is None:
        return
    if dx is not None:
        dx[...] = 0
    dw3 = _view(xp, dw, (group, mg, ckg)) if dw is not None else None
    lay = _layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, dw is not None,
                  _one_copy(win, x.shape, w.shape, dy.shape, group) if dw is not None else None)
    for n0, nb, b0, b1 in lay.chunks():
        sub = win.band(b0, b1)
        span = nb * (b1 - b0) * rest
        col = ctx.scratch_array(lay.col, (c, *win.kernel, nb, *sub.out_dims), x.dtype)
        cols = col.reshape(group, ckg, span)
        if nb == 1:
            rows = _view(xp, dy3[n0, :, b0 * rest:b1 * rest], (group, mg, span))
        else:
            rows = ctx.scratch_array(lay.rows, (m, span), x.dtype)
            xp.copyto(rows.reshape(m, nb, length), dy3[n0:n0 + nb].swapaxes(0, 1))
            rows = rows.reshape(group, mg, span)
        if dw3 is not None:
            im2col(xp, sub, x[n0:n0 + nb], col, _src(ctx, lay, sub, nb, c, x.dtype))
            acc = ctx.scratch_array(lay.acc, (group, mg, ckg), x.dtype) if lay.acc >= 0 else None
            _dw_gemm(xp, rows, cols, dw3, acc, n0 == 0 and b0 == 0)
        if dx is not None:
            xp.matmul(wt, rows, out=cols)
            col2im_add(xp, sub, col, dx[n0:n0 + nb])


# ---- ConvTranspose and its gradient: the adjoint of a Conv from Y's space to X's -------------------
def _as_conv(node, x_dims, kernel_shape) -> Node:
    """The node as the Conv from Y's space to X's that it is the adjoint of (explicit pads); the
    same Node for the same node and shapes, so the Conv's own memos (_conv_window) hit on every
    later call instead of taking one entry per call."""

    def make() -> Node:
        begin, end = transpose_pads(node.attrs, x_dims, kernel_shape)
        attrs = {k: v for k, v in node.attrs.items() if k in ("strides", "dilations", "group")}
        return Node(node.name, "Conv", "", node.inputs, node.outputs, {**attrs, "pads": begin + end})

    return _node_memo(_AS_CONV, node.attrs, (node.name, tuple(node.inputs), tuple(node.outputs),
                                             tuple(x_dims), tuple(kernel_shape)), make)


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
