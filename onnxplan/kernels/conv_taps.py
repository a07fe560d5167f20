"""A large depthwise convolution tap by tap: one multiply-add per kernel position over whole
views of the batch (torch's addcmul_ on numpy's memory, or numpy's multiply and add), no columns."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from math import prod

import numpy as np

from onnxplan.ir.windows import Tap, Window
from onnxplan.kernels import _torch, conv_layout, scratch
from onnxplan.kernels.conv_depthwise import taps_last
from onnxplan.kernels.registry import KernelContext
from onnxplan.kernels.scratch import align

__all__ = ["TAPS_MIN_ELEMS", "TAPS_MIN_WIDTH", "TapsLayout", "by_taps", "taps_accumulate", "taps_choices",
           "taps_dw", "taps_layout"]

TAPS_MIN_ELEMS = 1 << 15  # outputs (Y, dY) from which a depthwise conv runs tap by tap
TAPS_MIN_WIDTH = 8  # output rows from which the taps run on NCHW views (else on channels-last copies)


def by_taps(x_shape, w_shape, y_shape, group: int, torch: bool | None = None) -> bool:
    """A depthwise conv with enough outputs that one call per kernel position over the whole
    batch (a multiply-add of views, no columns: torch's addcmul_, ~5-10 us a call with its views)
    beats copying T columns of the output (measured: a strided conv onto 9600 outputs is 3x slower
    tap by tap). Maps with short rows (< TAPS_MIN_WIDTH: 6x6, 3x3) take the taps on channels-last
    copies, on torch only (numpy's per-tap calls over them lose to the columns). torch: whether
    torch's kernels are on (None: as this process runs them, ONNXPLAN_TORCH_KERNELS)."""
    torch = _torch.enabled() if torch is None else torch
    return (conv_layout.depthwise(x_shape, w_shape, group) and prod(y_shape) >= TAPS_MIN_ELEMS
            and (int(y_shape[-1]) >= TAPS_MIN_WIDTH or torch))


def taps_choices(x_shape, w_shape, y_shape, group: int) -> set[bool]:
    """The values by_taps may take when the plan runs: a plan is made in one process and may run
    in another with torch's kernels off (or on), so a scratch rule covers every path it may take."""
    return {by_taps(x_shape, w_shape, y_shape, group, torch) for torch in (False, True)}


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


def taps_layout(win: Window, x_shape, y_shape, itemsize: int) -> TapsLayout:
    return _taps_layout_for(scratch.SCRATCH_TARGET, win, tuple(x_shape), tuple(y_shape), itemsize)


@functools.lru_cache(maxsize=4096)
def _taps_layout_for(target: int, win: Window, x_shape, y_shape, itemsize: int) -> TapsLayout:
    c, last = x_shape[1], y_shape[-1] < TAPS_MIN_WIDTH
    strided = any(s > 1 for s in win.strides) and not last
    dims = tuple(-(-i // s) for i, s in zip(win.in_dims, win.strides))
    phase_elems = prod(win.strides) * c * prod(dims) if strided else 0
    x_elems, y_elems = prod(x_shape[1:]), prod(y_shape[1:])
    per_image = (phase_elems + y_elems + ((x_elems + y_elems) if last else 0)) * itemsize
    nb = max(1, min(y_shape[0], target // per_image))
    last_x = align(nb * phase_elems * itemsize)
    last_y = last_x + (align(nb * x_elems * itemsize) if last else 0)
    products = last_y + (align(nb * y_elems * itemsize) if last else 0)
    acc = products + align(nb * y_elems * itemsize)
    weights = acc + align(c * itemsize)
    return TapsLayout(nb, 0 if strided else -1, dims, last_x if last else -1, last_y if last else -1,
                      products, acc, weights, weights + align(prod(win.kernel) * c * itemsize))


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


def taps_accumulate(ctx: KernelContext, win: Window, src, w, dst, adjoint: bool, init=None) -> None:
    """Conv (adjoint False): dst[n, c, o] = init[c] + sum over taps of W[c, tap] src[n, c, tap's
    input at o]; dX (adjoint True): dst[n, c, tap's input at o] += W[c, tap] src[n, c, o] for every
    tap, from zeros. On torch, one multiply-add per live tap over a chunk of images (addcmul_ on
    views of the arrays; with strides, on X's phases in scratch, so that every view has unit
    strides); off torch, a multiply into scratch and an add per tap and chunk."""
    xp, c, sp = ctx.xp, src.shape[1], len(win.kernel)
    every = (slice(None), slice(None))
    taps = win.taps()
    x, y = (dst, src) if adjoint else (src, dst)
    lay = taps_layout(win, x.shape, y.shape, src.itemsize)
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
    wk = _torch.tensor(taps_last(xp, w, c, win.kernel, ctx.scratch_array(lay.weights, (len(taps), c), w.dtype)))
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


def taps_dw(ctx: KernelContext, win: Window, dy, x, dw) -> None:
    """dW[c, tap] = sum over images and positions of dY[n, c, o] X[n, c, tap's input at o]: per
    chunk of images and tap, the products into scratch and their sum per channel (on torch, X's
    phases in scratch when the window has strides, as in taps_accumulate)."""
    xp, c, sp = ctx.xp, x.shape[1], len(win.kernel)
    lay = taps_layout(win, x.shape, dy.shape, dy.itemsize)
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
