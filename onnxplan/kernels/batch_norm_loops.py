"""BatchNormalization in training (BatchNormInternal, BatchNormalization with training outputs)
and BatchNormalizationGrad by the fused loops of kernels/native.py: one call over a range of
channels where the numpy paths (kernels/batch_norm.py) run ~8 (forward) and ~12 (gradient) numpy
or torch passes over the tensor; the loops take 3 and 2 (a channel's sum, its centred squares,
then Y; dbias and dscale's dot together, then dX).

A channel's sums run over each image's positions in eight float lanes, the images' totals added
in double: not the numpy paths' bits (numpy's pairwise sums and BLAS dots), within the kernel
tests' tolerances of ONNX Runtime. Every statistic is its channel's own and channels are cut
across the compute threads, never a sum: the same bits at any thread count. The scratch
batch_norm.py declares stays declared (the same plan with or without a compiler; the loops use
none of it). Where the loops do not apply (not float32 C-contiguous host arrays, no compiler,
ONNXPLAN_NATIVE_KERNELS=0) the numpy paths run.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from onnxplan.kernels import native, parallel
from onnxplan.kernels.fused_calls import address, runner, taken
from onnxplan.kernels.registry import KernelFn

__all__ = ["FWD_PASSES", "GRAD_PASSES", "batch_norm_grad_loops", "batch_norm_training_loops"]

# The loops' passes over each element, for kernels.parallel.row_parts (a part from MIN_ELEMS /
# passes elements): the forward reads x three times (and writes y), the gradient reads dy and x
# twice each (and writes dx).
FWD_PASSES = 3
GRAD_PASSES = 4


def _channel_parts(n: int, c: int, s: int, passes: int) -> list[tuple[int, int]]:
    """Channels cut across the compute threads (one channel a part at least: a channel's
    arithmetic does not depend on the cut)."""
    return parallel.row_parts(np, c, n * s, passes=passes, min_rows=1)


def batch_norm_training_loops(x, scale, bias, mean_in, var_in, y, run_mean, run_var, mean_out, inv_out,
                              dims: tuple[int, int, int], eps: float, momentum: float) -> KernelFn | None:
    """The training BatchNorm by the loops over x as (n, c, s): Y, the running statistics where
    wanted (run_mean / run_var None: not), the saved mean and inv_std where wanted; None where the
    loops do not take it (the numpy path)."""
    fns = native.batch_norm()
    n, c, s = dims
    vectors = (scale, bias, run_mean, run_var, mean_out, inv_out)
    if fns is None or not taken(x, y, *vectors) or any(v is not None and v.size != c for v in vectors):
        return None
    if (run_mean is not None and not taken(mean_in)) or (run_var is not None and not taken(var_in)):
        return None
    g, k = np.array(dims, np.int64), np.array([eps, momentum], np.float32)
    call = partial(fns.fwd, g.ctypes.data, k.ctypes.data, x.ctypes.data, scale.ctypes.data, bias.ctypes.data,
                   address(mean_in) if run_mean is not None else None,
                   address(var_in) if run_var is not None else None, y.ctypes.data, address(run_mean),
                   address(run_var), address(mean_out), address(inv_out))
    pieces = [partial(call, lo, hi) for lo, hi in _channel_parts(n, c, s, FWD_PASSES)]
    return runner([partial(parallel.run, pieces)], (g, k, x, y, mean_in, var_in, *vectors))


def batch_norm_grad_loops(dy, x, scale, mean, inv_std, dx, dscale, dbias,
                          dims: tuple[int, int, int]) -> KernelFn | None:
    """BatchNormalizationGrad by the loops over x as (n, c, s): dX, dscale and dbias where
    wanted (None: not); None where the loops do not take it (the numpy path)."""
    fns = native.batch_norm()
    n, c, s = dims
    vectors = (scale, mean, inv_std, dscale, dbias)
    if fns is None or not taken(dy, x, dx, *vectors) or any(v is not None and v.size != c for v in vectors):
        return None
    g = np.array(dims, np.int64)
    call = partial(fns.grad, g.ctypes.data, dy.ctypes.data, x.ctypes.data, scale.ctypes.data, mean.ctypes.data,
                   inv_std.ctypes.data, address(dx), address(dscale), address(dbias))
    pieces = [partial(call, lo, hi) for lo, hi in _channel_parts(n, c, s, GRAD_PASSES)]
    return runner([partial(parallel.run, pieces)], (g, dy, x, dx, *vectors))
