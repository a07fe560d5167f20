"""Resize / Upsample (nearest and n-linear), a slab of the leading unresized axes at a time."""

from __future__ import annotations

from math import prod

import numpy as np

from onnxplan.ir.shape_rules.resize import resize_params, source_coordinate, source_index
from onnxplan.kernels import _xp
from onnxplan.kernels.registry import kernel

__all__: list[str] = []


def _linear_taps(coord: np.ndarray, n_in: int):
    """(lower index, upper index, upper weight) per output position; coordinates clamped to the input."""
    c = np.clip(coord, 0, n_in - 1)
    lo = np.floor(c).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    return lo, hi, (c - lo).astype(np.float32)


@kernel("Resize")
@kernel("Upsample")
def resize(ctx, inputs, outputs):
    """Nearest or n-linear resize of the unresized-leading-axes slabs. align_corners follows ONNX
    Runtime 1.19 (and PyTorch): x_in = x_out * (in - 1) / (out - 1) with the integer output length,
    where ONNX's reference divides by in * scale - 1 (they differ when in * scale is not an integer;
    tests/conformance.py ORT_FOLLOWED checks it against ORT)."""
    xp, x, out = ctx.xp, inputs[0], outputs[0]

    def value(i):
        return None if i >= len(inputs) or inputs[i] is None else \
            (inputs[i].get() if hasattr(inputs[i], "get") else np.asarray(inputs[i]))

    params = resize_params(ctx.node.op_type, ctx.attrs, x.shape, value)
    axes = [a for a in range(x.ndim) if x.shape[a] != out.shape[a] or params.scales[a] != 1.0]
    lead = axes[0] if axes else x.ndim
    rows = prod(x.shape[:lead])
    xs, ys = x.reshape((rows, *x.shape[lead:])), out.reshape((rows, *out.shape[lead:]))
    plan = []
    for a in axes:
        coord = source_coordinate(params.transform, x.shape[a], out.shape[a], params.scales[a])
        if params.mode == "nearest":
            plan.append((a - lead + 1, xp.asarray(source_index(params.nearest, coord, x.shape[a], params.scales[a]))))
        else:
            lo, hi, w = _linear_taps(coord, x.shape[a])
            plan.append((a - lead + 1, (xp.asarray(lo), xp.asarray(hi), xp.asarray(w))))
    step = max(1, _xp.block_elems(np.float64, xp) // max(1, prod(out.shape[lead:])))
    for r0 in range(0, rows, step):
        block = xs[r0:r0 + step]
        for axis, how in plan:
            if params.mode == "nearest":
                block = xp.take(block, how, axis=axis)
                continue
            lo, hi, w = how
            shape = [1] * block.ndim
            shape[axis] = -1
            w = w.reshape(shape).astype(np.float64)
            low = xp.take(block, lo, axis=axis).astype(np.float64)
            block = low + (xp.take(block, hi, axis=axis) - low) * w
        xp.copyto(ys[r0:r0 + step], block, casting="unsafe")


def _axis_matrix(params, n_in: int, n_out: int, scale: float):
    """M (n_out x n_in): output position i along the axis is sum over j of M[i, j] X[j]."""
    coord = source_coordinate(params.transform, n_in, n_out, scale)
    m = np.zeros((n_out, n_in), np.float64)
    rows = np.arange(n_out)
    if params.mode == "nearest":
        m[rows, source_index(params.nearest, coord, n_in, scale)] = 1.0
        return m
    lo, hi, w = _linear_taps(coord, n_in)
    np.add.at(m, (rows, lo), 1.0 - w.astype(np.float64))
    np.add.at(m, (rows, hi), w.astype(np.float64))
    return m


@kernel("ResizeGrad", "com.microsoft")
def resize_grad(ctx, inputs, outputs):
    """(dY, X, roi, scales) -> dX: the adjoint of the resize, dY summed back through each axis's
    interpolation matrix (transposed), a slab of the leading unresized axes at a time."""
    xp, dy, x, dx = ctx.xp, inputs[0], inputs[1], outputs[0]
    scales = inputs[3] if len(inputs) > 3 and inputs[3] is not None and inputs[3].size else None

    def value(i):
        if i == 2 and scales is not None:
            return scales.get() if hasattr(scales, "get") else np.asarray(scales)
        return np.asarray(dy.shape, np.int64) if i == 3 and scales is None else None

    params = resize_params("Resize", ctx.attrs, x.shape, value)
    axes = [a for a in range(x.ndim) if x.shape[a] != dy.shape[a] or params.scales[a] != 1.0]
    lead = axes[0] if axes else x.ndim
    rows = prod(x.shape[:lead])
    gs, ds = dy.reshape((rows, *dy.shape[lead:])), dx.reshape((rows, *dx.shape[lead:]))
    mats = [(a - lead + 1, xp.asarray(_axis_matrix(params, x.shape[a], dy.shape[a], params.scales[a])))
            for a in axes]
    step = max(1, _xp.block_elems(np.float64, xp) // max(1, prod(dy.shape[lead:])))
    for r0 in range(0, rows, step):
        block = gs[r0:r0 + step].astype(np.float64)
        for axis, m in mats:  # contract the output axis with M's rows: the input axis takes its place
            block = xp.moveaxis(xp.tensordot(block, m, axes=([axis], [0])), -1, axis)
        xp.copyto(ds[r0:r0 + step], block, casting="unsafe")
