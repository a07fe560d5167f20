"""ONNX Runtime's ConvGrad: dB, then dW = dY_rows @ cols^T and dX = col2im(W^T @ dY_rows), each one
GEMM batched over the groups per chunk; dX as a convolution where conv_grad_dx.py plans one,
depthwise convs channels-last or tap by tap."""

from __future__ import annotations

from math import prod

import numpy as np

from onnxplan.kernels import conv_grad_dx, conv_layout
from onnxplan.kernels.conv_depthwise import depthwise_dw
from onnxplan.kernels.conv_depthwise_loops import by_loops, depthwise_loops_dw, depthwise_loops_dx
from onnxplan.kernels.conv_layout import chunk_source, conv_window, layout, one_copy
from onnxplan.kernels.conv_small import by_small, small_conv_dw
from onnxplan.kernels.conv_taps import by_taps, taps_accumulate, taps_choices, taps_dw, taps_layout
from onnxplan.kernels.im2col import col2im_add, im2col, im2col_then, view
from onnxplan.kernels.matmul import split_matmul
from onnxplan.kernels.registry import KernelContext, kernel
from onnxplan.ort import MS

__all__ = ["DW_BLOCK", "DW_BLOCK_OUTPUTS", "conv_grad", "conv_grad_scratch"]


def _direct_dw(x_shape, length: int, pointwise: bool) -> bool:
    """A pointwise dW that needs no columns: one image, or one position per image."""
    return pointwise and (x_shape[0] == 1 or length == 1)


def conv_grad_scratch(node, in_specs, out_specs) -> int:
    """The most of its passes, which run one after the other: dX as a conv (DxPlan: a grouped or
    small conv; FlipDx: a large dense one with unit strides); a depthwise dW; then Conv's columns
    and rows (see conv_scratch; X's padded copy only for dW) plus a dW-sized partial sum when dW takes more than one chunk. Only dB, a
    pointwise dX, or a pointwise dW of one image or one position per image need none."""
    dy, x, w = in_specs[0], in_specs[1], in_specs[2]
    need_dx = len(out_specs) > 0 and out_specs[0] is not None
    need_dw = len(out_specs) > 1 and out_specs[1] is not None
    win = conv_window(node.attrs, x.shape, w.shape, dy.shape)
    group = int(node.attrs.get("group", 1))
    need_dx = need_dx and not win.pointwise
    need_dw = need_dw and not _direct_dw(x.shape, prod(dy.shape[2:]), win.pointwise)
    choices = taps_choices(x.shape, w.shape, dy.shape, group) if need_dx or need_dw else {False}
    taps = taps_layout(win, x.shape, dy.shape, x.itemsize).nbytes if True in choices else 0
    if False not in choices:
        return taps
    flip = conv_grad_dx.flip_dx(x.shape, w.shape, dy.shape, win, group, x.itemsize) if need_dx else None
    plan = conv_grad_dx.dx_plan(x.shape, w.shape, dy.shape, win, group, x.itemsize) if need_dx and flip is None else None
    sizes = [0 if plan is None else plan.nbytes, 0 if flip is None else flip.nbytes]
    need_dx = need_dx and plan is None and flip is None
    if need_dw and conv_layout.depthwise(x.shape, w.shape, group):
        sizes.append(layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, True, win).nbytes)
        need_dw = False
    if need_dw or need_dx:
        sizes.append(layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, need_dw,
                            one_copy(win, x.shape, w.shape, dy.shape, group) if need_dw else None).nbytes)
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
            split_matmul(xp, *product, dw3)
        else:
            split_matmul(xp, *product, acc)
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
    win = conv_window(ctx.attrs, x.shape, w.shape, dy.shape)
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg, length = c // group, m // group, prod(dy.shape[2:])
    wt = w.reshape(group, mg, prod(w.shape[1:])).transpose(0, 2, 1)
    dy3 = dy.reshape(n, m, length)
    if db is not None:
        xp.sum(dy3, axis=(0, 2), out=db)
    if dx is not None and win.pointwise:  # dX[n, g] = W[g]^T @ dY[n, g] for every image and group
        split_matmul(xp, wt, dy.reshape(n, group, mg, length), view(xp, dx, (n, group, cg, length)))
        dx = None
    if dw is not None and _direct_dw(x.shape, length, win.pointwise):
        # dW[g] = sum over images and positions of dY[g] X[g]^T: one batched GEMM, no columns
        if length == 1:
            rows, xt = dy.reshape(n, group, mg).transpose(1, 2, 0), x.reshape(n, group, cg).transpose(1, 0, 2)
        else:
            rows, xt = dy.reshape(group, mg, length), x.reshape(group, cg, length).transpose(0, 2, 1)
        split_matmul(xp, rows, xt, view(xp, dw, (group, mg, cg)))
        dw = None
    if by_loops(win, group, x, w, dy, dx, dw):  # depthwise: fused loops
        if dx is not None:
            depthwise_loops_dx(win, dy, w, dx)
        if dw is not None:
            depthwise_loops_dw(win, dy, x, dw)
        return
    if by_taps(x.shape, w.shape, dy.shape, group):
        if dx is not None:
            taps_accumulate(ctx, win, dy, w, dx, True)
        if dw is not None:
            taps_dw(ctx, win, dy, x, dw)
        return
    # the columns' layout as the scratch rule declared it: with dW's (partial sum, padded source) when dW is wanted
    with_dw = dw is not None
    if dw is not None and dw.flags.c_contiguous and by_small(x, w, dy, group, win):  # few outputs: fused loops
        small_conv_dw(ctx, layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, True,
                                  one_copy(win, x.shape, w.shape, dy.shape, group)), win, dy, x, dw)
        dw = None
    flip = conv_grad_dx.flip_dx(x.shape, w.shape, dy.shape, win, group, x.itemsize) if dx is not None else None
    if flip is not None:
        conv_grad_dx.dx_by_flip(ctx, flip, dy, w, dx)
        dx = None
    plan = conv_grad_dx.dx_plan(x.shape, w.shape, dy.shape, win, group, x.itemsize) if dx is not None else None
    if plan is not None:
        conv_grad_dx.dx_by_plan(ctx, plan, win, dy, w, dx, group)
        dx = None
    if dw is not None and conv_layout.depthwise(x.shape, w.shape, group):
        depthwise_dw(ctx, layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, True, win),
                     win, dy, x, dw)
        dw, with_dw = None, False
    if dw is None and dx is None:
        return
    if dx is not None:
        dx[...] = 0
    lay = layout(x.shape, w.shape, dy.shape[2:], group, x.itemsize, True, with_dw,
                 one_copy(win, x.shape, w.shape, dy.shape, group) if with_dw else None)
    _by_columns(ctx, lay, win, dy, x, w, dx, dw, group)


def _by_columns(ctx: KernelContext, lay, win, dy, x, w, dx, dw, group: int) -> None:
    """dW and/or dX chunk by chunk of `lay` (the columns' layout the scratch rule declared): per
    chunk, X's columns and dY's rows, then dW (+)= rows @ cols^T and dX += col2im(W^T @ rows)."""
    xp = ctx.xp
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    mg, length = m // group, prod(dy.shape[2:])
    ckg, rest = prod(w.shape[1:]), length // dy.shape[2]
    wt = w.reshape(group, mg, ckg).transpose(0, 2, 1)
    dy3 = dy.reshape(n, m, length)
    dw3 = view(xp, dw, (group, mg, ckg)) if dw is not None else None
    for n0, nb, b0, b1 in lay.chunks():
        sub = win.band(b0, b1)
        span = nb * (b1 - b0) * rest
        col = ctx.scratch_array(lay.col, (c, *win.kernel, nb, *sub.out_dims), x.dtype)
        cols = col.reshape(group, ckg, span)
        made = False  # dW's columns made with the rows, by images across the compute threads
        if nb == 1:
            rows = view(xp, dy3[n0, :, b0 * rest:b1 * rest], (group, mg, span))
        else:
            rows = ctx.scratch_array(lay.rows, (m, span), x.dtype)
            by_image, dy_images = rows.reshape(m, nb, length), dy3[n0:n0 + nb].swapaxes(0, 1)
            made = dw3 is not None and im2col_then(
                xp, sub, x[n0:n0 + nb], col, chunk_source(ctx, lay, sub, nb, c, x.dtype),
                lambda lo, hi: np.copyto(by_image[:, lo:hi], dy_images[:, lo:hi]))
            if not made:
                xp.copyto(by_image, dy_images)
            rows = rows.reshape(group, mg, span)
        if dw3 is not None:
            if not made:
                im2col(xp, sub, x[n0:n0 + nb], col, chunk_source(ctx, lay, sub, nb, c, x.dtype))
            acc = ctx.scratch_array(lay.acc, (group, mg, ckg), x.dtype) if lay.acc >= 0 else None
            _dw_gemm(xp, rows, cols, dw3, acc, n0 == 0 and b0 == 0)
        if dx is not None:
            split_matmul(xp, wt, rows, cols)
            col2im_add(xp, sub, col, dx[n0:n0 + nb])
