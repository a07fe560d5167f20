"""Resize / Upsample (nearest and n-linear), a slab of the leading unresized axes at a time."""

from __future__ import annotations

from math import prod

import numpy as np

from onnxplan.kernels import _xp
from onnxplan.kernels.registry import kernel
from onnxplan.ir.shape_rules.resize import resize_params, source_coordinate, source_index

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
