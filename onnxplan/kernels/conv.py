"""Conv: per chunk of images (or row band), im2col of every channel in planned scratch, then one
BLAS GEMM batched over the groups; pointwise convs without columns; depthwise ones channels-last
(conv_depthwise.py) or tap by tap (conv_taps.py); few output channels by fused loops
(conv_small.py)."""

from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np

from onnxplan import settings
from onnxplan.kernels import conv_layout, parallel
from onnxplan.kernels.conv_depthwise import depthwise_conv
from onnxplan.kernels.conv_depthwise_loops import by_loops, depthwise_loops
from onnxplan.kernels.conv_layout import Layout, chunk_source, conv_window, layout, one_copy
from onnxplan.kernels.conv_small import by_small, small_conv
from onnxplan.kernels.conv_taps import by_taps, taps_accumulate, taps_choices, taps_layout
from onnxplan.kernels.im2col import IM2COL_THEN_PASSES, im2col, im2col_then, image_parts, view
from onnxplan.kernels.matmul import split_matmul
from onnxplan.kernels.registry import KernelContext, KernelFn, kernel, prepared_call

__all__ = ["DIRECT_LENGTH", "balanced", "conv", "conv_scratch"]


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
# the rows in scratch; measured: resnet18's 32x32 stem -15%, its 64-channel layers -7%).
DIRECT_LENGTH = 1024


def balanced(lay: Layout, parts: int) -> Layout:
    """`lay` with as many images a chunk (at most its own) as keeps `parts` threads evenly busy
    where each chunk's images are shared out among them (im2col_then): the largest count whose
    chunks' longest shares add up to the least (nnt-conv2d's 64 images in chunks of 5, cut 2 + 3,
    take 38 image-times at 2 threads; in chunks of 4, 32). Fewer images a chunk fit its scratch;
    each image's columns and GEMM are its own either way: the same bits."""
    if parts < 2 or lay.nb <= parts or lay.band != lay.rows_out:
        return lay

    def path(nb: int) -> int:
        full, last = divmod(lay.n, nb)
        return full * -(-nb // parts) + -(-last // parts)

    best = min(range(lay.nb, parts - 1, -1), key=path)  # the first least: the largest count
    return lay if best == lay.nb else replace(lay, nb=best)


def _even_chunks(xp, lay: Layout, per_image: int) -> Layout:
    """balanced() for the parts im2col_then cuts a chunk into (`per_image` column elements an
    image), where the smaller chunks still cut into as many parts (else the planned chunks)."""
    def parts(nb: int) -> int:
        return len(image_parts(xp, nb, 1, per_image * nb, passes=IM2COL_THEN_PASSES))

    even = balanced(lay, parts(lay.nb))
    return even if parts(even.nb) == parts(lay.nb) else lay


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
        if lay.nb > 1 and length >= DIRECT_LENGTH and settings.current().split_kernels:
            lay = _even_chunks(xp, lay, c * prod(win.kernel) * length)
        for n0, nb, b0, b1 in lay.chunks():
            sub = win.band(b0, b1)
            span = nb * (b1 - b0) * rest
            col = ctx.scratch_array(lay.col, (c, *win.kernel, nb, *sub.out_dims), x.dtype)
            src = chunk_source(ctx, lay, sub, nb, c, x.dtype)
            cols = col.reshape(group, ckg, span)
            if nb > 1 and length >= DIRECT_LENGTH:  # a GEMM per image into Y, its columns a strided block
                per_image = cols.reshape(group, ckg, nb, length).transpose(2, 0, 1, 3)
                out = view(xp, y3[n0:n0 + nb], (nb, group, mg, length))
                if not im2col_then(xp, sub, x[n0:n0 + nb], col, src,
                                   lambda lo, hi: np.matmul(w3, per_image[lo:hi], out=out[lo:hi])):
                    im2col(xp, sub, x[n0:n0 + nb], col, src)
                    split_matmul(xp, w3, per_image, out)
                continue
            im2col(xp, sub, x[n0:n0 + nb], col, src)
            if nb == 1:
                split_matmul(xp, w3, cols, view(xp, y3[n0, :, b0 * rest:b1 * rest], (group, mg, span)))
                continue
            rows = ctx.scratch_array(lay.rows, (m, span), x.dtype)
            split_matmul(xp, w3, cols, rows.reshape(group, mg, span))
            xp.copyto(y3[n0:n0 + nb], rows.reshape(m, nb, length).swapaxes(0, 1))
    if b is not None:
        parallel.ufunc(xp, "add", y3, y3, b.reshape(m, 1))  # by images across the compute threads: same bits
