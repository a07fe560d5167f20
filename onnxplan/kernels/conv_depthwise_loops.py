"""A 2-D depthwise convolution (one input and one output channel per group: MobileNet's,
EfficientNet's and ConvNeXt's 3x3 to 7x7 convs) and its gradients by the fused loops of
kernels/native.py, plane by plane (one image's channel): each output row is summed over the
taps in place, one pass over the row a tap, where the numpy paths copy channels-last columns
and sum them (conv_depthwise.py) or run a whole-tensor pass per tap (conv_taps.py).

The work is cut across the compute threads by planes (Y, dX) or by channels (dW: a channel's
sum over its images in order), so the bits do not depend on the thread count (they are not the
numpy paths' bits: each output is its taps' products added in order, dW's row products in eight
float lanes summed in double). The scratch the conv's layout declares stays declared (the same
plan with or without a compiler) and is not used here. Where the loops do not apply (not 2-D,
not float32 host arrays, a channel multiplier, no compiler, ONNXPLAN_NATIVE_KERNELS=0) the
numpy paths run.
"""

from __future__ import annotations

from functools import partial
from math import prod

import numpy as np

from onnxplan import settings
from onnxplan.ir.windows import Window
from onnxplan.kernels import conv_layout, native, parallel

__all__ = ["MIN_WIDTH", "by_loops", "depthwise_loops", "depthwise_loops_dw", "depthwise_loops_dx"]

# Input rows at least this wide take the loops (a row's pass per tap is short below it, where the
# numpy path's channels-last columns run along hundreds of channels). hf-mobilenet-v2@bench's
# depthwise convs, 1 thread, loops / numpy path (ms, median of 5; Conv, ConvGrad): 50x50 1.61 /
# 1.75, 3.40 / 4.37; 49x49 s2 2.76 / 4.40, 7.49 / 11.09; 26x26 2.19 / 2.68, 4.97 / 5.66; 14x14
# 1.72 / 1.85, 3.34 / 3.62; 13x13 s2 1.33 / 1.04, 2.00 / 2.30; 8x8 2.08 / 1.16, 4.24 / 2.77;
# 5x5 1.71 / 0.79, 3.03 / 2.09. ConvNeXt's 7x7 taps on 14x14 to 56x56: 0.7-0.8x at 1 and 2 threads.
MIN_WIDTH = 12


def by_loops(win: Window, group: int, x, w, *others) -> bool:
    """Whether a depthwise conv takes the fused loops: 2-D, one channel per group, input rows of
    MIN_WIDTH or more, at most
    native.DEPTHWISE_MAX_TAPS kernel positions, every array (x, w and `others` that are not None)
    a float32 C-contiguous host array, and the loops compiled."""
    if len(win.kernel) != 2 or win.in_dims[1] < MIN_WIDTH or not conv_layout.depthwise(x.shape, w.shape, group):
        return False
    if prod(win.kernel) > native.DEPTHWISE_MAX_TAPS:
        return False
    arrays = [a for a in (x, w, *others) if a is not None]
    if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous for a in arrays):
        return False
    return native.depthwise_conv() is not None


def _geometry(win: Window, channels: int) -> np.ndarray:
    """The loops' `g`: (c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw)."""
    return np.array([channels, *win.in_dims, *win.kernel, *win.out_dims, *win.strides, *win.pads_begin,
                     *win.dilations], np.int64)


def _ranges(count: int, outputs: int, taps: int) -> list[tuple[int, int]]:
    """`count` planes (or channels) cut for the compute threads: a kernel of `taps` passes per
    output (kernels.parallel.parts_for); one range where ONNXPLAN_SPLIT_KERNELS=0."""
    parts = parallel.parts_for(outputs, passes=taps) if settings.current().split_kernels else 1
    return parallel.bounds(count, max(1, min(parts, count)))


def _run(call, ranges: list[tuple[int, int]]) -> None:
    parallel.run([partial(call, lo, hi) for lo, hi in ranges])


def _address(a) -> int | None:
    return None if a is None else int(a.ctypes.data)


def depthwise_loops(win: Window, x, w, b, y) -> None:
    """Y (+ B) of a depthwise conv, its planes cut across the compute threads."""
    fns, g = native.depthwise_conv(), _geometry(win, int(x.shape[1]))
    assert fns is not None  # by_loops said so
    call = partial(fns.fwd, g.ctypes.data, x.ctypes.data, w.ctypes.data, _address(b), y.ctypes.data)
    _run(call, _ranges(int(x.shape[0] * x.shape[1]), y.size, prod(win.kernel)))


def depthwise_loops_dx(win: Window, dy, w, dx) -> None:
    """dX of a depthwise conv, its planes cut across the compute threads."""
    fns, g = native.depthwise_conv(), _geometry(win, int(dx.shape[1]))
    assert fns is not None
    call = partial(fns.dx, g.ctypes.data, dy.ctypes.data, w.ctypes.data, dx.ctypes.data)
    _run(call, _ranges(int(dx.shape[0] * dx.shape[1]), dy.size, prod(win.kernel)))


def depthwise_loops_dw(win: Window, dy, x, dw) -> None:
    """dW of a depthwise conv, its channels cut across the compute threads."""
    fns, g = native.depthwise_conv(), _geometry(win, int(x.shape[1]))
    assert fns is not None
    call = partial(fns.dw, g.ctypes.data, int(x.shape[0]), dy.ctypes.data, x.ctypes.data, dw.ctypes.data)
    _run(call, _ranges(int(x.shape[1]), dy.size, prod(win.kernel)))
