"""ConvGrad's dX computed as a convolution: of dY dilated by the strides with W flipped (DxPlan:
grouped and small convs, strided depthwise ones tap by tap), or of dY itself with W flipped and
transposed (FlipDx: large dense convs with unit strides); col2im serves the rest (conv_grad.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from math import prod

from onnxplan.ir.graph import Node
from onnxplan.ir.tensor import TensorSpec
from onnxplan.ir.windows import Window
from onnxplan.kernels import conv_layout, scratch
from onnxplan.kernels.conv import conv, conv_scratch
from onnxplan.kernels.conv_depthwise import channels_last_cols, depthwise_sum, taps_last
from onnxplan.kernels.conv_layout import Layout, layout, one_copy
from onnxplan.kernels.im2col import im2col, view
from onnxplan.kernels.matmul import split_matmul
from onnxplan.kernels.registry import KernelContext
from onnxplan.kernels.scratch import align

__all__ = ["DxPlan", "FlipDx", "dx_by_flip", "dx_by_plan", "dx_plan", "flip_dx"]



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


def dx_plan(x_shape, w_shape, dy_shape, win: Window, group: int, itemsize: int) -> DxPlan | None:
    """The conv that computes dX, for a grouped conv or a small one with unit strides (one GEMM
    per chunk instead of a col2im add per tap; strides s would make s^d times the columns, mostly
    zeros); None otherwise or when a chunk would not hold whole images."""
    return _dx_plan_for(scratch.SCRATCH_TARGET, conv_layout.SMALL_DX, tuple(x_shape), tuple(w_shape), tuple(dy_shape), win,
                        group, itemsize)


@functools.lru_cache(maxsize=4096)
def _dx_plan_for(target: int, small: int, x_shape, w_shape, dy_shape, win: Window, group: int,
                 itemsize: int) -> DxPlan | None:
    n, c, m = x_shape[0], x_shape[1], w_shape[0]
    if not win.pointwise and conv_layout.depthwise(x_shape, w_shape, group) and any(st > 1 for st in win.strides):
        lay = layout(x_shape, w_shape, dy_shape[2:], group, itemsize, True, False)
        if lay.band < lay.rows_out:
            return None
        end = lay.nbytes + align(lay.nb * c * prod(win.in_dims) * itemsize)
        return DxPlan(win, lay, win.in_dims, (), lay.nbytes, end, end, by_taps=True)
    if win.pointwise or any(st > 1 for st in win.strides) or (group == 1 and prod(dy_shape) > small):
        return None
    sp = len(win.kernel)
    reach = tuple((k - 1) * d for k, d in zip(win.kernel, win.dilations))
    dims = tuple(p + i + r for p, i, r in zip(win.pads_begin, win.in_dims, reach))
    twin = Window(win.kernel, (1,) * sp, win.dilations, tuple(-p for p in win.pads_begin), (0,) * sp,
                  dims, win.in_dims)
    lay = layout((n, m, *dims), (c, m // group, *win.kernel), win.in_dims, group, itemsize, True, False)
    if lay.band < lay.rows_out:
        return None
    dilated = lay.nbytes
    weight = dilated + align(lay.nb * m * prod(dims) * itemsize)
    w_bytes = 0 if conv_layout.depthwise(x_shape, w_shape, group) else align(prod(w_shape) * itemsize)
    return DxPlan(twin, lay, dims, reach, dilated, weight, weight + w_bytes)


def _depthwise_dx_by_taps(ctx: KernelContext, plan: DxPlan, win: Window, dy, w, dx) -> None:
    """A strided depthwise conv's dX: products dY[n, c] * W[c, tap] (channels-last, one call), then
    each tap's added into dX's positions in a channels-last image (scratch), copied into dX."""
    xp, lay = ctx.xp, plan.layout
    n, c, sp, taps = dy.shape[0], dy.shape[1], len(win.kernel), prod(win.kernel)
    wk = taps_last(xp, w, c, win.kernel, ctx.scratch_array(lay.acc, (taps, c), w.dtype))
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


def dx_by_plan(ctx: KernelContext, plan: DxPlan, win: Window, dy, w, dx, group: int) -> None:
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
    if conv_layout.depthwise(dx.shape, w.shape, group):  # channels-last columns times the flipped taps
        taps = prod(win.kernel)
        wk = taps_last(xp, w, c, win.kernel, ctx.scratch_array(lay.acc, (taps, c), w.dtype), flip=True)
        for n0, nb, _b0, _b1 in lay.chunks():
            dilated = ctx.scratch_array(plan.dilated, (nb, m, *plan.dims), dy.dtype)
            dilated[...] = 0
            dilated[place] = dy[n0:n0 + nb][taken]
            col = ctx.scratch_array(lay.col, (*win.kernel, nb, *win.in_dims, c), dy.dtype)
            channels_last_cols(xp, plan.window, dilated, col, None)
            depthwise_sum(ctx, lay, col.reshape(taps, nb, lin, c), wk, dx.reshape(n, c, lin)[n0:n0 + nb])
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
            split_matmul(xp, wt3, cols, view(xp, dx3[n0], (group, cg, lin)))
            continue
        rows = ctx.scratch_array(lay.rows, (c, nb * lin), dy.dtype)
        split_matmul(xp, wt3, cols, rows.reshape(group, cg, nb * lin))
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
    return Node("conv_grad_dx", "Conv", "", ["dy", "w"], ["dx"],
                {"pads": pads_begin + pads_end, "dilations": list(win.dilations)})


def flip_dx(x_shape, w_shape, dy_shape, win: Window, group: int, itemsize: int) -> FlipDx | None:
    """The FlipDx of a dense conv with unit strides whose dX dx_plan leaves to col2im (dY over
    conv_layout.SMALL_DX elements), when its scratch (the Conv's plus W') is no more than the col2im pass of
    a ConvGrad computing dX and dW would declare; else None (tiny maps, W' large against the
    columns, keep col2im). Decided from the shapes alone, never from which outputs the node
    computes: a ConvGrad split into a dX and a dW node (passes.split_grad) must compute the same
    bits as the fused one, so a dX-only node takes the fused node's path (and its scratch)."""
    if (group != 1 or win.pointwise or any(st > 1 for st in win.strides)
            or prod(dy_shape) <= conv_layout.SMALL_DX):
        return None
    return _flip_dx_for(scratch.SCRATCH_TARGET, tuple(x_shape), tuple(w_shape), tuple(dy_shape), win, itemsize, True)


@functools.lru_cache(maxsize=4096)
def _flip_dx_for(target: int, x_shape, w_shape, dy_shape, win: Window, itemsize: int,
                 need_dw: bool) -> FlipDx | None:
    node = _flip_node(win)
    if node is None:
        return None
    dtype = f"float{8 * itemsize}"  # the Conv's scratch depends on the item size alone
    w_flipped = (w_shape[1], w_shape[0], *w_shape[2:])
    weight = align(conv_scratch(node, [TensorSpec(dtype, dy_shape), TensorSpec(dtype, w_flipped)],
                                [TensorSpec(dtype, x_shape)]))
    flip = FlipDx(node, weight, weight + align(prod(w_shape) * itemsize))
    col2im = layout(x_shape, w_shape, dy_shape[2:], 1, itemsize, True, need_dw,
                    one_copy(win, x_shape, w_shape, dy_shape, 1) if need_dw else None)
    return flip if flip.nbytes <= col2im.nbytes else None


def dx_by_flip(ctx: KernelContext, flip: FlipDx, dy, w, dx) -> None:
    """dX = Conv(dY, W') (see FlipDx), W' copied into the scratch after the Conv's."""
    sp = w.ndim - 2
    wf = ctx.scratch_array(flip.weight, (w.shape[1], w.shape[0], *w.shape[2:]), w.dtype)
    ctx.xp.copyto(wf, w.swapaxes(0, 1)[(slice(None), slice(None)) + (slice(None, None, -1),) * sp])
    conv(KernelContext(ctx.xp, flip.node, [], [], ctx.scratch), [dy, wf], [dx])
