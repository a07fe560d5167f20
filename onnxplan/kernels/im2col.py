"""im2col / col2im: a convolution window's columns in planned scratch, cut by images (or one
image's channels) across the compute threads (kernels.parallel)."""

from __future__ import annotations

import functools
import queue
from collections.abc import Callable
from typing import Any

import numpy as np

from onnxplan import settings
from onnxplan.ir.windows import Window, extent, reads_padding
from onnxplan.kernels import native, parallel

__all__ = ["IM2COL_THEN_PASSES", "MIN_ROW", "by_rows", "col2im_add", "im2col", "im2col_slots_then", "im2col_then",
           "image_parts", "padded_source", "view", "window_views"]


def view(xp, a, shape):
    """`a` reshaped without a copy (an out= view must be the array itself)."""
    return np.reshape(a, shape, copy=False) if xp is np else a.reshape(shape)


def padded_source(win: Window, x, src) -> tuple[Any, tuple[int, ...]]:
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


def window_views(xp, a, starts, win: Window):
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
def by_rows(win: Window) -> bool:
    """A 2-D window with unit strides whose output rows are as wide as the input's (pads
    within the kernel's reach): each tap's columns are one contiguous run of a row-padded copy
    of the image (see _im2col_by_rows), with no inner loop per output row. Rows of at least
    MIN_ROW (narrower, zeroing the wrapped columns costs what it saves: vgg16's 2x2 maps)."""
    if (len(win.kernel) != 2 or win.strides != (1, 1) or win.out_dims[1] != win.in_dims[1]
            or win.out_dims[1] < MIN_ROW):
        return False
    return 0 <= win.pads_begin[1] <= (win.kernel[1] - 1) * win.dilations[1]


def _im2col_by_rows(xp, win: Window, x, col, src) -> None:
    """im2col for a by_rows window: per image and channel, X's rows padded with zero rows (and
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
    col6 = view(xp, col, (c, kh, kw, nb, win.out_dims[0], wd))  # a view even of one part's images
    xp.copyto(view(xp, col6, shape), taps)
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


def image_parts(xp, nb: int, c: int, numel: int, passes: int = 1) -> list[tuple[str, int, int]]:
    """How im2col / col2im over `nb` images of `c` channels (`numel` column elements) is cut for
    the compute threads: ("n", lo, hi) ranges of images, or of channels ("c") for one image;
    one part when the columns are small (`passes`: the work per column element, in copies)."""
    parts = parallel.parts_for(numel, xp, passes=passes)
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
    parts = image_parts(xp, x.shape[0], x.shape[1], col.size)
    if len(parts) <= 1:
        _im2col_whole(xp, win, x, col, src)
        return
    sp = len(win.kernel)
    parallel.run([functools.partial(_im2col_whole, xp, win, *_image_part(sp, part, x, col, src))
                  for part in parts])


# A chunk's columns and the work on them (its product) cut by images as one task per part: the
# part's columns, then at once its product, on the thread that made them (no thread idles
# between a chunk's im2col and its GEMM). A part carries the product's work beside the copy:
# it splits from half the columns a copy alone does (kernels.parallel.parts_for, 2 passes).
IM2COL_THEN_PASSES = 2


def im2col_then(xp, win: Window, x, col, src, then: Callable[[int, int], None]) -> bool:
    """im2col of x's images into `col`, each part of images followed on the same thread by
    then(lo, hi), the work on those images' columns (each image's own GEMM: the same calls
    as one batched product). Only by images (a chunk of several), from the columns' size
    (IM2COL_THEN_PASSES); False, with nothing done, where it does not split (the caller runs
    im2col and its product as before): one image, small columns, or ONNXPLAN_SPLIT_KERNELS=0."""
    nb = x.shape[0]
    if nb < 2 or not settings.current().split_kernels:
        return False
    parts = image_parts(xp, nb, x.shape[1], col.size, passes=IM2COL_THEN_PASSES)
    if len(parts) <= 1:
        return False
    sp = len(win.kernel)

    def task(part: tuple[str, int, int]) -> Callable[[], None]:
        def run() -> None:
            _im2col_whole(xp, win, *_image_part(sp, part, x, col, src))
            then(part[1], part[2])
        return run

    parallel.run([task(part) for part in parts])
    return True


def im2col_slots_then(xp, win: Window, x, col, src, then: Callable[[int, int], None]) -> bool:
    """Each image of x (all of them, not one chunk) into one of col's `slots` image slots (col:
    (C, *kernel, slots, *out_dims), src: the padded source's scratch for as many images, or
    None), followed on the same thread by then(i, k), the work on image i's columns in slot k
    (its own GEMM); a slot is taken again once its image's work is done. One task per image, so no
    thread waits at the end of a chunk for another's image (im2col_then's chunks): the same calls
    on the same columns, the same bits. False, with nothing done, where it does not split (one
    slot or image, one compute thread, ONNXPLAN_SPLIT_KERNELS=0)."""
    slots, n = col.shape[len(win.kernel) + 1], x.shape[0]
    if min(slots, n) < 2 or not settings.current().split_kernels:
        return False
    if len(image_parts(xp, slots, x.shape[1], col.size, passes=IM2COL_THEN_PASSES)) <= 1:
        return False  # one compute thread, or small columns: im2col_then's rule
    sp = len(win.kernel)
    free: queue.SimpleQueue[int] = queue.SimpleQueue()
    for k in range(slots):
        free.put(k)

    def task(i: int) -> Callable[[], None]:
        def run() -> None:
            k = free.get()  # at most `slots` tasks hold one: a task waits only where threads > slots
            try:
                _, col_k, src_k = _image_part(sp, ("n", k, k + 1), x[:slots], col, src)
                _im2col_whole(xp, win, x[i:i + 1], col_k, src_k)
                then(i, k)
            finally:
                free.put(k)
        return run

    parallel.run([task(i) for i in range(n)])
    return True


def _element_strides(a, dims: int) -> list[int] | None:
    """a's strides in elements along its first `dims` axes, its last two axes one contiguous
    block (of a window's rows); None where the C loops cannot walk it so."""
    e = a.itemsize
    if (a.shape[-1] > 1 and a.strides[-1] != e) or (a.shape[-2] > 1 and a.strides[-2] != a.shape[-1] * e):
        return None
    if any(st % e or st < 0 for st in a.strides[:dims]):
        return None
    return [st // e for st in a.strides[:dims]]


def _short_runs(win: Window) -> bool:
    """Whether numpy's strided copy of the window's columns moves short runs (a stride along the
    last axis, or rows narrower than MIN_ROW), where the C loop's tap table pays: least of 20,
    8 images, hf-regnet's grouped 368 x 3 x 3 maps 0.55 -> 0.12 ms, a 3 x 3 window at stride 2
    over 48 x 48 0.43 -> 0.39. Pointwise windows are one run of the map (hf-efficientnet's 1 x 1
    convs: numpy 0.03-0.27 ms, the loop 0.03-0.44), as are rows of MIN_ROW and more."""
    return win.strides[-1] > 1 or (win.out_dims[-1] < MIN_ROW and not win.pointwise)


def _native_geometry(xp, win: Window, x, col) -> np.ndarray | None:
    """The C loops' geometry (native.im2col, native.col2im_add) for x (nb, C, H, W) and its
    columns col (C, kh, kw, nb, oh, ow) of a 2-D window, float32 on the host; None where they do
    not apply (numpy's copies and adds then)."""
    if xp is not np or len(win.kernel) != 2 or x.dtype != np.float32 or col.dtype != np.float32:
        return None
    x_steps, col_steps = _element_strides(x, 2), _element_strides(col, 4)
    if x_steps is None or col_steps is None:
        return None
    return np.array([*x.shape, *win.kernel, *win.out_dims, *win.strides, *win.pads_begin, *win.dilations,
                     *x_steps, *col_steps], np.int64)


def _im2col_whole(xp, win: Window, x, col, src=None) -> None:
    """col[c, *k, n, *o] = x[n, c, o * s - p + k * d] (0 in the padding), every channel at once.

    x: (nb, C, *in_dims); col: (C, *kernel, nb, *out_dims). A window by_rows takes: one copy a
    tap (_im2col_by_rows); else a 2-D window of float32 whose runs are short (_short_runs) through
    the C loop (native.im2col) where it is compiled; else one strided copy of x's windows, from
    `src` (nb, C, *extent), scratch for x's zero-padded copy, when the window reads padding; with
    no `src` there, one strided copy per tap with the padding zeroed around it (a large dense
    conv: long inner loops, and no input-sized copy).
    """
    sp = len(win.kernel)
    if src is not None and by_rows(win) and reads_padding(win):
        _im2col_by_rows(xp, win, x, col, src)
        return
    fn = native.im2col() if _short_runs(win) else None
    geometry = _native_geometry(xp, win, x, col) if fn is not None else None
    if fn is not None and geometry is not None:
        fn(geometry.ctypes.data, x.ctypes.data, col.ctypes.data)
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
    windows = window_views(xp, *padded_source(win, x, src), win)
    xp.copyto(col, windows.transpose(1, *range(2 + sp, 2 + 2 * sp), 0, *range(2, 2 + sp)))


def col2im_add(xp, win: Window, col, dx) -> None:
    """dx[n, c, o * s - p + k * d] += col[c, *k, n, *o]: the adjoint of im2col, accumulated into
    dx; cut by images (or channels) across the compute threads as im2col is (each part adds into
    its own images in the same tap order: the same bits)."""
    parts = image_parts(xp, dx.shape[0], dx.shape[1], col.size)
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
    fn = native.col2im_add()
    geometry = _native_geometry(xp, win, dx, col) if fn is not None else None
    if fn is not None and geometry is not None:
        fn(geometry.ctypes.data, col.ctypes.data, dx.ctypes.data)
        return
    dxt = dx.swapaxes(0, 1)
    every = (slice(None), slice(None))
    for tap in win.taps():
        if tap.empty:
            continue
        dst = dxt[every + tap.in_slices]
        xp.add(dst, col[(slice(None), *tap.index)][every + tap.out_slices], out=dst)
