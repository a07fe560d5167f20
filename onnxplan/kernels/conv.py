"""Conv: per chunk of images (or row band), im2col of every channel in planned scratch, then one
BLAS GEMM batched over the groups; pointwise convs without columns; depthwise ones channels-last
(conv_depthwise.py) or tap by tap (conv_taps.py); few output channels by fused loops
(conv_small.py)."""

from __future__ import annotations

from math import prod

import numpy as np

from onnxplan.kernels import conv_layout, parallel
from onnxplan.kernels.conv_depthwise import depthwise_conv
from onnxplan.kernels.conv_depthwise_loops import by_loops, depthwise_loops
from onnxplan.kernels.conv_layout import Layout, chunk_source, conv_window, layout, one_copy
from onnxplan.kernels.conv_small import by_small, small_conv
from onnxplan.kernels.conv_taps import by_taps, taps_accumulate, taps_choices, taps_layout
from onnxplan.kernels.im2col import im2col, im2col_slots_then, view
from onnxplan.kernels.matmul import split_matmul
from onnxplan.kernels.registry import KernelContext, KernelFn, kernel, prepared_call

__all__ = ["DIRECT_LENGTH", "conv", "conv_scratch"]


def conv_scratch(node, in_specs, out_specs) -> int:
    """Columns for a chunk of about scratch.SCRATCH_TARGET bytes (whole images, or a band of one image's
    output rows, at least one row), X's zero-padded copy when the window reads padding, plus, for
    chunks of several images, their output rows; none for a pointwise (1x1, stride 1, unpadded)
    convolution."""
    x, w, y = in_specs[0], in_specs[1], out_specs[0]
    win = conv_window(node.attrs, x.shape, w.shape, y.shape)
    group = int(node.attrs.get("group", 1))
    choices = {False} if win.pointwise else taps_choices(x.shape, w.shape, y.shape, group)
    taps = taps_layout(win, x.shape, y.shape, x.itemsize).nbytes if True in choices else 0
    if False not in choices:
        return taps
    return max(taps, layout(x.shape, w.shape, y.shape[2:], group, x.itemsize, not win.pointwise, False,
                            one_copy(win, x.shape, w.shape, y.shape, group)).nbytes)


def _prepare_pointwise(ctx: KernelContext, inputs: list, outputs: list, bound: bool) -> KernelFn:
    """A pointwise conv, Y[n, g] = W[g] @ X[n, g] for every image and group in one batched GEMM, then
    the bias (by images across the compute threads: same bits), on views made once."""
    xp, x, w, y = ctx.xp, inputs[0], inputs[1], outputs[0]
    b = inputs[2] if len(inputs) > 2 else None
    group = int(ctx.attrs.get("group", 1))
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg, length = c // group, m // group, prod(y.shape[2:])
    w3, xg = w.reshape(group, mg, prod(w.shape[1:])), x.reshape(n, group, cg, length)
    yg = view(xp, y, (n, group, mg, length))
    y3 = y.reshape(n, m, length)
    b2 = b.reshape(m, 1) if b is not None else None

    def run(ctx_: KernelContext, inputs_: list, outputs_: list) -> None:
        split_matmul(xp, w3, xg, yg)
        if b2 is not None:
            parallel.ufunc(xp, "add", y3, y3, b2)

    return run


def _bind_conv(ctx: KernelContext, inputs: list, outputs: list) -> KernelFn | None:
    """A pointwise conv prepared once (_prepare_pointwise); other convs keep the plain kernel
    (their setup is memoized already)."""
    x, w, y = inputs[0], inputs[1], outputs[0]
    if ctx.xp is not np or not conv_window(ctx.attrs, x.shape, w.shape, y.shape).pointwise:
        return None
    return _prepare_pointwise(ctx, inputs, outputs, True)


# Output positions per image from which a chunk of several images takes one GEMM per image
# straight into Y (long rows: the GEMMs stay efficient, and Y is written once instead of through
# the rows in scratch; measured: resnet18's 32x32 stem -15%, its 64-channel layers -7%); across
# the compute threads one task an image through the chunk's image slots (_direct_by_slots).
DIRECT_LENGTH = 1024


def _direct_by_slots(ctx: KernelContext, lay: Layout, win, x, w3, y3, group: int) -> bool:
    """Every image's columns, then at once its GEMM into Y, one task an image on the compute
    threads, the layout's chunk of `lay.nb` images used as that many image slots taken in turn
    (im2col_slots_then): no thread waits at the end of a chunk for another's image (resnet18 b8's
    64-channel 32x32 layers at 2 threads, chunks of 2 images: 6.7-7.0 -> 5.8-6.0 ms a Conv, 15.0
    -> 12.8-13.9 a ConvGrad, whose dX is this Conv); the same calls, the same bits. False where it
    does not split (the chunks then, every image's GEMM on the calling thread)."""
    n, c, m = x.shape[0], x.shape[1], y3.shape[1]
    length, ckg = y3.shape[2], w3.shape[2]
    col = ctx.scratch_array(lay.col, (c, *win.kernel, lay.nb, *win.out_dims), x.dtype)
    per_slot = col.reshape(group, ckg, lay.nb, length).transpose(2, 0, 1, 3)
    out = view(ctx.xp, y3, (n, group, m // group, length))
    src = chunk_source(ctx, lay, win, lay.nb, c, x.dtype)
    return im2col_slots_then(ctx.xp, win, x, col, src, lambda i, k: np.matmul(w3, per_slot[k], out=out[i]))


@kernel("Conv", scratch=conv_scratch, bind=_bind_conv)
def conv(ctx: KernelContext, inputs, outputs) -> None:
    """Y = W * X (+ B): per chunk, im2col of every channel, then one GEMM batched over the groups
    into Y (or into rows, then Y; or, for long images, one per image into Y)."""
    xp = ctx.xp
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    y = outputs[0]
    group = int(ctx.attrs.get("group", 1))
    win = conv_window(ctx.attrs, x.shape, w.shape, y.shape)
    if win.pointwise:
        prepared_call(_prepare_pointwise, ctx, inputs, outputs)
        return
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    mg, length = m // group, prod(y.shape[2:])
    ckg, rest = prod(w.shape[1:]), length // y.shape[2]
    w3 = w.reshape(group, mg, ckg)
    y3 = y.reshape(n, m, length)
    if by_loops(win, group, x, w, b, y):  # depthwise: fused loops, the bias included
        depthwise_loops(win, x, w, b, y)
        return
    if by_taps(x.shape, w.shape, y.shape, group):  # the bias first, then every tap added
        taps_accumulate(ctx, win, x, w, y, False, b)
        return
    if by_small(x, w, y, group, win):  # few output channels: fused loops, the bias included
        small_conv(ctx, layout(x.shape, w.shape, y.shape[2:], group, x.itemsize, True, False,
                               one_copy(win, x.shape, w.shape, y.shape, group)), win, x, w, b, y)
        return
    if conv_layout.depthwise(x.shape, w.shape, group):
        depthwise_conv(ctx, layout(x.shape, w.shape, y.shape[2:], group, x.itemsize, True, False, win),
                       win, x, w, y)
    else:
        lay = layout(x.shape, w.shape, y.shape[2:], group, x.itemsize, True, False,
                     one_copy(win, x.shape, w.shape, y.shape, group))
        direct = lay.nb > 1 and length >= DIRECT_LENGTH
        for n0, nb, b0, b1 in (() if direct and _direct_by_slots(ctx, lay, win, x, w3, y3, group) else lay.chunks()):
            sub = win.band(b0, b1)
            span = nb * (b1 - b0) * rest
            col = ctx.scratch_array(lay.col, (c, *win.kernel, nb, *sub.out_dims), x.dtype)
            src = chunk_source(ctx, lay, sub, nb, c, x.dtype)
            cols = col.reshape(group, ckg, span)
            im2col(xp, sub, x[n0:n0 + nb], col, src)
            if direct:  # a GEMM per image into Y, its columns a strided block
                split_matmul(xp, w3, cols.reshape(group, ckg, nb, length).transpose(2, 0, 1, 3),
                             view(xp, y3[n0:n0 + nb], (nb, group, mg, length)))
                continue
            if nb == 1:
                split_matmul(xp, w3, cols, view(xp, y3[n0, :, b0 * rest:b1 * rest], (group, mg, span)))
                continue
            rows = ctx.scratch_array(lay.rows, (m, span), x.dtype)
            split_matmul(xp, w3, cols, rows.reshape(group, mg, span))
            xp.copyto(y3[n0:n0 + nb], rows.reshape(m, nb, length).swapaxes(0, 1))
    if b is not None:
        parallel.ufunc(xp, "add", y3, y3, b.reshape(m, 1))  # by images across the compute threads: same bits
