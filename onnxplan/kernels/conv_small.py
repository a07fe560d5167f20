"""A 2-D convolution with few output channels (nnt-conv2d's 3 -> 3 stride-2 stem) and its weight
gradient, by the fused loops of kernels/native.py: a band of output rows' columns made in a
buffer that stays in cache and used at once, instead of im2col writing a chunk's columns
through memory and a BLAS product of a few rows reading them back (OpenBLAS runs a product of
3 rows at a few G multiply-adds/s). Measured on nnt-conv2d (X 64x3x224x224, 1 thread, 2-core
AMD EPYC): Conv 34-38 -> ~16 ms, its dW 42-47 -> ~15 ms.

The buffer is the conv's planned column scratch (conv_layout.layout's `col`, the same rule and
plan as the BLAS path): the forward pass cuts the images across the compute threads, each part
its own slice of the buffer; dW cuts the taps, each part its taps' rows. Each output is its taps'
sum in order and each dW element its images' and bands' sums in order, the band a fixed number
of rows: the same bits at any thread count (not the BLAS path's bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from onnxplan import settings
from onnxplan.ir.windows import Window
from onnxplan.kernels import native, parallel
from onnxplan.kernels.conv_layout import Layout
from onnxplan.kernels.registry import KernelContext

__all__ = ["BAND_POSITIONS", "SMALL_M", "by_small", "small_conv", "small_conv_dw"]

# Output channels up to which a strided conv takes the fused loops (native.SMALL_CONV_M at most).
# Least of 5 at 1 thread, fused / BLAS path (ms), forward and dW: 64x3x224x224 -> 3, 3x3 stride 2
# 17.4/31.5, 16.3/39.1; 16x3x224x224 -> 8, 3x3 s2 6.6/8.7, 6.8/11.1; 7x7 s2 20.6/34.4, 23.8/36.3.
# At unit strides the BLAS path's im2col is one run a tap (im2col.by_rows) and it keeps them:
# 16x16x56x56 -> 4, 3x3 s1 5.5/4.1, 5.2/4.6; 16x64x56x56 -> 4 16.6/14.0, 16.6/15.8;
# 16x3x224x224 -> 4 s1 12.6/11.6, 12.5/17.5 (benchmarks/bench_conv_small.py, reports/threads.md session 17).
SMALL_M = native.SMALL_CONV_M
# Output positions a band aims at (whole output rows, at least one): the band's columns (K x
# positions) stay in the core's cache. nnt-conv2d (K = 27, rows of 112): 2 rows 15.5 ms, 4 rows
# 17.1, 8 rows 17.4, a whole image 20.6 (forward; dW alike).
BAND_POSITIONS = 256
# The work per column element, in one-pass ufuncs, for kernels.parallel's split threshold (a
# column is written once and read by every output channel): parts from MIN_ELEMS / 2 columns.
PASSES = 2


def by_small(x, w, y, group: int, win: Window) -> bool:
    """Whether this conv takes the fused loops: 2-D, strided, one group, float32 contiguous host
    arrays, at most SMALL_M output channels, dW's taps within the loop's accumulators, and the
    loops compiled (native.small_conv)."""
    m, k = int(w.shape[0]), int(prod(w.shape[1:]))
    if (len(win.kernel) != 2 or group != 1 or max(win.strides) < 2 or m > SMALL_M
            or m * k > native.SMALL_CONV_ACC or x.dtype != np.float32):
        return False
    if not all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in (x, w, y)):
        return False
    return native.small_conv() is not None


def _parts(columns: int) -> int:
    """Parts for the compute threads (one with ONNXPLAN_SPLIT_KERNELS=0)."""
    return parallel.parts_for(columns, passes=PASSES) if settings.current().split_kernels else 1


@dataclass(frozen=True)
class _Call:
    """What both loops start from: the compiled loops, the taps (K), the output's rows and row
    width, the layout's column scratch (flat) and the window's geometry for C."""

    fns: native.SmallConv
    taps: int
    rows_out: int
    width: int
    col: np.ndarray
    geometry: np.ndarray


def _call(ctx: KernelContext, lay: Layout, win: Window, c: int, w_shape) -> _Call:
    fns = native.small_conv()
    assert fns is not None
    taps, (rows_out, width) = int(prod(w_shape[1:])), win.out_dims
    (h, wd), (kh, kw) = win.in_dims, win.kernel
    geometry = np.array([c, h, wd, kh, kw, rows_out, width, *win.strides, *win.pads_begin, *win.dilations],
                        np.int64)
    col = ctx.scratch_array(lay.col, (taps * lay.nb * lay.band * width,), np.float32)  # the columns' block
    return _Call(fns, taps, rows_out, width, col, geometry)


def _band_rows(room: int, taps: int, width: int, rows_out: int) -> int:
    """Output rows a band takes: BAND_POSITIONS' worth (at least one), as `room` column elements
    allow for `taps` rows of columns."""
    return max(1, min(rows_out, max(1, BAND_POSITIONS // width), room // (taps * width)))


def small_conv(ctx: KernelContext, lay: Layout, win: Window, x, w, b, y) -> None:
    """Y = W * X (+ B): images cut across the compute threads, each part's bands through its
    own slice of the column scratch."""
    n, m = x.shape[0], w.shape[0]
    at = _call(ctx, lay, win, x.shape[1], w.shape)
    parts = min(n, _parts(n * at.taps * at.rows_out * at.width), at.col.size // (at.taps * at.width))
    band = _band_rows(at.col.size // parts, at.taps, at.width, at.rows_out)
    slot = at.taps * band * at.width
    bias = b.ctypes.data if b is not None else None

    def part(k: int, lo: int, hi: int):
        return lambda: at.fns.fwd(at.geometry.ctypes.data, m, x.ctypes.data, w.ctypes.data, bias, y.ctypes.data,
                                  at.col[k * slot:].ctypes.data, lo, hi, band)

    parallel.run([part(k, lo, hi) for k, (lo, hi) in enumerate(parallel.bounds(n, parts))])


def small_conv_dw(ctx: KernelContext, lay: Layout, win: Window, dy, x, dw) -> None:
    """dW = sum over images and positions of dY X's columns: the taps cut across the compute
    threads (each part every image, its taps' rows of the column scratch); the band is the
    same at any thread count, so are the bits."""
    n, m = x.shape[0], dw.shape[0]
    at = _call(ctx, lay, win, x.shape[1], dw.shape)
    band = _band_rows(at.col.size, at.taps, at.width, at.rows_out)
    parts = min(at.taps, _parts(n * at.taps * at.rows_out * at.width))
    length = band * at.width

    def part(k0: int, k1: int):
        return lambda: at.fns.dw(at.geometry.ctypes.data, m, x.ctypes.data, dy.ctypes.data, dw.ctypes.data,
                                 at.col[k0 * length:].ctypes.data, n, k0, k1, band)

    parallel.run([part(k0, k1) for k0, k1 in parallel.bounds(at.taps, parts)])
