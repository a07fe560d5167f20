"""Depthwise convolution (one input and one output channel per group) on channels-last columns:
an elementwise product and a sum over the taps instead of a (1, taps) GEMM per channel."""

from __future__ import annotations

from math import prod

from onnxplan.ir.windows import Window, reads_padding
from onnxplan.kernels.conv_layout import Layout, chunk_source
from onnxplan.kernels.im2col import padded_source, window_views
from onnxplan.kernels.registry import KernelContext

__all__ = ["channels_last_cols", "depthwise_conv", "depthwise_dw", "depthwise_sum", "taps_last"]


def channels_last_cols(xp, win: Window, x, col, src) -> None:
    """col[*k, n, *o, c] = x[n, c, o * s - p + k * d] (0 in the padding): one strided copy, the
    channels innermost (an image's few positions make short inner loops in im2col's order)."""
    sp = len(win.kernel)
    windows = window_views(xp, *padded_source(win, x, src if reads_padding(win) else None), win)
    xp.copyto(col, windows.transpose(*range(2 + sp, 2 + 2 * sp), 0, *range(2, 2 + sp), 1))


def _last(a):
    """a (n, C, *spatial) as (n, *spatial, C): a view."""
    return a.transpose(0, *range(2, a.ndim), 1)


def taps_last(xp, w, c: int, kernel, out, flip: bool = False):
    """W (C, 1, *kernel) copied into `out` as (taps, C), the taps flipped when `flip`."""
    wk = _last(w.reshape(1, c, *kernel))[0]
    if flip:
        wk = wk[(slice(None, None, -1),) * len(kernel)]
    xp.copyto(out.reshape(*kernel, c), wk)
    return out


def depthwise_sum(ctx: KernelContext, lay: Layout, col, wk, out) -> None:
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
        channels_last_cols(ctx.xp, sub, x[n0:n0 + nb], col, chunk_source(ctx, lay, sub, nb, c, x.dtype))
        yield n0, nb, b0, b1, col.reshape(prod(win.kernel), nb, -1, c)


def depthwise_conv(ctx: KernelContext, lay: Layout, win: Window, x, w, y) -> None:
    """Y[n, c] = sum over taps of W[c, tap] * columns (channels-last), chunk by chunk."""
    xp, c, taps = ctx.xp, x.shape[1], prod(win.kernel)
    wk = taps_last(xp, w, c, win.kernel, ctx.scratch_array(lay.acc, (taps, c), w.dtype))
    rest = prod(y.shape[3:])
    y3 = y.reshape(y.shape[0], c, -1)
    for n0, nb, b0, b1, col in _channels_last_chunks(ctx, lay, win, x):
        depthwise_sum(ctx, lay, col, wk, y3[n0:n0 + nb, :, b0 * rest:b1 * rest])


def depthwise_dw(ctx: KernelContext, lay: Layout, win: Window, dy, x, dw) -> None:
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
