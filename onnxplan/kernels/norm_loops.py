"""LayerNormalization, SimplifiedLayerNormalization and their gradients by the fused loops of
kernels/native.py: one call over a range of rows where the numpy paths (kernels/norm.py) run
~15 numpy or torch calls a chunk (a transposed copy, sums, four normalizing passes), each a pass
over the rows. transformer b16's 16 x 64 x 128 nodes: ~0.4-0.5 ms each on the numpy path.

The forward computes the numpy path's operations in its order (ORT's LayerNormImpl: each row's
sums of x and x*x in order along it), so the same bits; the gradient's dscale and dbias too (each
column summed in order over the rows, chunk by chunk as kernels/norm.py sums them); dX's row
means run in eight lanes (the numpy path takes them from a BLAS dot: other bits, within the kernel
tests' tolerances of ONNX Runtime). Rows, and the gradient's columns for dscale and dbias, are cut
across the compute threads: the same bits at any thread count. The scratch norm.py declares stays
declared (the same plan with or without a compiler); the gradient uses two of its vectors (the
partial sums of a chunk after the first). Where the loops do not apply (not float32 host arrays,
statistics not float32, no compiler, ONNXPLAN_NATIVE_KERNELS=0) the numpy paths run.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from onnxplan.kernels import native, parallel
from onnxplan.kernels.fused_calls import address, runner, taken
from onnxplan.kernels.registry import KernelFn

__all__ = ["FWD_PASSES", "GRAD_PASSES", "layer_norm_grad_loops", "layer_norm_loops"]

# The loops' passes over each element, for kernels.parallel.parts_for (a part from MIN_ELEMS /
# passes elements): the forward reads x twice and writes y once; the gradient's rows read dy and x
# twice each.
FWD_PASSES = 3
GRAD_PASSES = 4


def _geometry(rows: int, m: int, simplified: bool) -> np.ndarray:
    return np.array([rows, m, int(simplified)], np.int64)


def layer_norm_loops(x, scale, bias, y, mean_out, inv_out, rows: int, m: int, eps: float,
                     simplified: bool) -> KernelFn | None:
    """(Simplified)LayerNormalization by the loops, its rows cut across the compute threads;
    None where they do not take it (the numpy path)."""
    fns = native.layer_norm()
    if fns is None or not taken(x, scale, bias, y, mean_out, inv_out) or scale.size != m:
        return None
    if bias is not None and bias.size != m:
        return None
    g, c = _geometry(rows, m, simplified), np.array([eps], np.float32)
    call = partial(fns.fwd, g.ctypes.data, c.ctypes.data, x.ctypes.data, scale.ctypes.data,
                   None if simplified else address(bias), y.ctypes.data, None if simplified else address(mean_out),
                   address(inv_out))
    pieces = [partial(call, lo, hi) for lo, hi in parallel.row_parts(np, rows, m, passes=FWD_PASSES)]
    return runner([partial(parallel.run, pieces)], (g, c, x, scale, bias, y, mean_out, inv_out))


def layer_norm_grad_loops(dy, x, scale, mean, inv, dx, dscale, dbias, partial_s, partial_b, rows: int, m: int,
                          rows_per_chunk: int, simplified: bool) -> KernelFn | None:
    """(Simplified)LayerNormalizationGrad by the loops: per chunk of `rows_per_chunk` rows (as the
    numpy path sums dscale and dbias: chunk by chunk, a later chunk's sums through `partial_s`
    and `partial_b`, m floats each), dscale and dbias by columns, then dX by rows, each across
    the compute threads; None where they do not take it (the numpy path)."""
    fns = native.layer_norm()
    if fns is None or not taken(dy, x, scale, mean, inv, dx, dscale, dbias, partial_s, partial_b):
        return None
    if scale.size != m or inv.size != rows or (mean is not None and mean.size != rows):
        return None
    g = _geometry(rows, m, simplified)
    mean_at = None if simplified else address(mean)
    cols = partial(fns.grad_cols, g.ctypes.data, dy.ctypes.data, x.ctypes.data, mean_at, inv.ctypes.data,
                   address(dscale), address(dbias), address(partial_s), address(partial_b))
    by_rows = partial(fns.grad_rows, g.ctypes.data, dy.ctypes.data, x.ctypes.data, scale.ctypes.data, mean_at,
                      inv.ctypes.data, address(dx))
    tasks: list[Callable[[], Any]] = []
    for r0 in range(0, rows, rows_per_chunk):
        k = min(rows_per_chunk, rows - r0)
        row_ranges = parallel.row_parts(np, k, m, passes=GRAD_PASSES)
        if dscale is not None or dbias is not None:
            # two columns a part at least (the numpy path's cut: its bits do not depend on it)
            parts = max(1, min(len(row_ranges), m // 2))
            tasks.append(partial(parallel.run, [partial(cols, r0, r0 + k, lo, hi, int(r0 == 0))
                                                for lo, hi in parallel.bounds(m, parts)]))
        if dx is not None:
            tasks.append(partial(parallel.run, [partial(by_rows, r0 + lo, r0 + hi) for lo, hi in row_ranges]))
    return runner(tasks, (g, dy, x, scale, mean, inv, dx, dscale, dbias, partial_s, partial_b))
