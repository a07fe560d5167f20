"""Fused loops in C for the kernels whose numpy form takes many passes, compiled on first use
with the machine's C compiler and kept in the cache (one shared library per source, compiler
and CPU):

- the AdamW update (~12 ufunc passes per element where ONNX Runtime runs one loop). It performs
  ORT's float32 operations in ORT's order, each rounded as numpy's ufuncs round it: no fused
  multiply-add (-ffp-contract=off), no fast-math; -fno-math-errno only lets sqrtf vectorise (it
  changes no result). So the loop computes the numpy kernel's bits exactly
  (tests/test_kernels_native.py checks it bit for bit).
- a 2-D convolution with few output channels and its weight gradient (kernels/conv_small.py):
  a band of output rows' columns made in a cache-sized buffer and used at once, where im2col
  and a BLAS product of a few rows write and read the whole columns through memory. Its sums
  run in its own order (each output over the taps in order; each dW element over images and
  bands in order, a band's products in eight lanes, the bands' sums in double), so its bits are
  not the BLAS path's, and they do not depend on the thread count.
- SoftmaxCrossEntropyLoss and its gradient (kernels/softmax_loss.py: ~15 numpy and torch calls
  each, ~80 us a node on mlp's 64 x 10 scores, where ONNX Runtime runs one loop): the
  log-softmax (with the loss after it) and the gradient one pass each over rows r0..r1 (the
  kernel cuts rows across the compute threads; a row's arithmetic does not depend on the cut,
  so neither do the bits). The log-softmax runs in ORT's order: the max, the sum of exp(x - max)
  (a row of d == 1 in eight float lanes in order, the lanes then added pairwise; d > 1 over the
  classes in order), then (x - max) - logf(sum). exp is an eight-lane polynomial (Cephes' expf:
  Cody-Waite reduction, 2^k made in the exponent bits; within 1 ulp of exp as measured, where
  numpy's float32 exp is within 2.5; 0 below -87.34, where numpy gives subnormals). So log_prob
  and the gradient are not the numpy path's bits (numpy's or torch's exp), but agree with ONNX
  Runtime within the kernel tests' tolerances. The loss's sums (the per-sample losses, the kept
  labels' weights) run in double, in order, on one thread.
- a 2-D depthwise convolution, its dX and its dW (kernels/conv_depthwise_loops.py), plane by
  plane: each output row summed over the taps in place (a pass over the row a tap), where the
  numpy paths copy channels-last columns and sum them. Each output (and dX element) adds its
  taps' products in order; dW sums a row's products in eight float lanes, added into a double,
  rows and images in order. Not the numpy paths' bits; the same at any thread count (planes or
  channels are cut, never a sum).

- LayerNormalization, SimplifiedLayerNormalization and their gradients (kernels/norm_loops.py):
  the forward in the numpy path's operations and order (ORT's: each row's sums of x and x*x in
  order along it), so its bits; the gradient's dscale and dbias too (each column's sum in order
  over the rows), dX's two row means in eight lanes (not the numpy path's BLAS dot: other bits).
  Rows (and dscale's columns) are cut across the compute threads: the same bits at any count.
- BatchNormalization in training and its gradient (kernels/batch_norm_loops.py), channel by
  channel: the forward in three passes over a channel (its sum, the centred squares, Y), the
  gradient in two (dbias and dscale's dot, then dX), where the numpy paths take ~8 and ~12. A
  channel's sums run over each image's positions in eight float lanes, the images' totals added
  in double: not the numpy paths' bits (pairwise sums, BLAS dots), within the kernel tests'
  tolerances of ONNX Runtime; the same at any thread count (channels are cut, never a sum).
- GatherGrad's scatter-add over rows (kernels/_xp.scatter_add: an embedding's gradient): each
  index's row added in the order of the indices, as numpy's add.at adds them (its bits), where
  add.at takes ~7 ns an element (0.8 ms for a transformer's 1024 x 128 rows).

- the GEMM pool (kernels/gemm_calls.py): a product's cblas_sgemm calls (numpy's own BLAS, the
  calls numpy makes: its bits) claimed by the calling thread and the library's worker threads,
  none of which takes the interpreter lock.
- Softmax along the last axis of float32 rows (kernels/softmax_loss.py): per row the max,
  exp(x - max) by the SCE loops' vexp with their sum (eight lanes in order, added pairwise), then
  one reciprocal a row, by rows on the GEMM pool (a job of kind ROWS): not torch's bits, within
  4e-7 of float64 as torch's are; the same at any thread count (rows are cut, never a row).
- the exact GELU of float32 and its gradient (kernels/elementwise.py): erf by Abramowitz and
  Stegun's 7.1.26 (the formula torch's vectorised erf uses; within 4e-7 of erf in float32, as
  torch's), exp by the SCE loops' vexp (one per element: the gradient's normal density is erf's
  exponential), over ranges of the elements on the GEMM pool (a job of kind ROWS), where torch's
  gelu and gelu_backward ran across the Python workers: not torch's bits (its exp), within the
  same distance of float64; the same at any thread count (each element alone).
- ReLU of float32 and its gradient, ONNX Runtime's selects (a NaN and -0 kept by the forward; dX
  0 where X is NaN), on the GEMM pool from 128K elements as the GELU's: np.maximum's call and
  torch's threshold_backward bound cost 9 us on mlp's 64 x 256, where one loop's call takes ~2.
- Transpose of 32-bit elements where the permutation is a batched matrix transpose
  (kernels/transpose.py): blocks of 64 x 64, 8 x 8 tiles through registers, where numpy's and
  torch's strided copies moved 1-3 GB/s. Data moved, nothing computed: the same bits.
- im2col for 2-D windows whose columns numpy copies in short runs through a strided view
  (strided windows, maps narrower than im2col.MIN_ROW: hf-regnet's 3 x 3 maps, 2.4 ns a column
  element): a table of each tap's offsets, made once a call, gathers a channel's tap in one loop
  (row by row where the table would be large); words moved as they are (the same bits).
- col2im's accumulation for 2-D windows (kernels/im2col.py): numpy's adds tap by tap over a
  small map's short rows (resnet18's 8 x 8 and 4 x 4) paid their per-row overhead on every row;
  the loop adds each element's taps in the order numpy's adds do, one float add at a time (the
  same bits, a NaN's sign and payload aside: C may take either NaN operand of an add), a tap's
  outputs one run of the plane where strides are 1 and rows keep their width.

Where no compiler is found, the compile fails, or ONNXPLAN_NATIVE_KERNELS=0
(onnxplan.settings), `adamw()`, `small_conv()`, `sce()`, `depthwise_conv()`, `layer_norm()`,
`scatter_add_rows()`, `batch_norm()`, `gemm_calls()`, `transpose32()`, `softmax_rows()`, `activation()`,
`im2col()` and `col2im_add()` are None and the kernels take the numpy or torch paths (the Python
pool for products).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from onnxplan import settings
from onnxplan.kernels.native_source import SOURCE as _HEAD_SOURCE
from onnxplan.kernels.native_source_channels import CHANNELS_SOURCE
from onnxplan.kernels.native_source_columns import COLUMNS_SOURCE
from onnxplan.kernels.native_source_gemm import GEMM_SOURCE
from onnxplan.kernels.native_source_rows import ROWS_SOURCE
from onnxplan.kernels.native_source_transpose import TRANSPOSE_SOURCE

__all__ = ["ADAMW_CONSTANTS", "DEPTHWISE_MAX_TAPS", "SCE_REDUCTIONS", "SMALL_CONV_ACC", "SMALL_CONV_M",
           "BatchNorm", "DepthwiseConv", "GemmPoolCalls", "LayerNorm", "Sce", "SmallConv", "adamw", "batch_norm", "depthwise_conv",
           "activation", "col2im_add", "im2col", "layer_norm", "library_path", "softmax_rows", "transpose32",
           "gemm_calls", "scatter_add_rows", "sce", "small_conv"]

# The constants array the AdamW loop reads, in this order (float32 each; kernels/optimizer.py).
ADAMW_CONSTANTS = ("lr", "alpha", "beta", "eps", "wd", "correct_bias")
SMALL_CONV_M = 8  # output channels the small conv's loops hold in registers at most
SMALL_CONV_ACC = 4096  # dW elements a small_conv_dw call sums at most (its double accumulators)
DEPTHWISE_MAX_TAPS = 1024  # kernel positions the depthwise dW loop accumulates at most (DW_MAX_TAPS)
SCE_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}  # the SCE loops' reduction codes (geometry's g[5])

SOURCE = _HEAD_SOURCE + ROWS_SOURCE + CHANNELS_SOURCE + GEMM_SOURCE + TRANSPOSE_SOURCE + COLUMNS_SOURCE  # one library
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC", "-pthread")
_loaded: dict[str, ctypes.CDLL | None] = {}
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {"adamw_f32": [_I] + [_P] * 8 + [_I, ctypes.c_int],
               "small_conv_fwd": [_P, _I, _P, _P, _P, _P, _P, _I, _I, _I],
               "small_conv_dw": [_P, _I, _P, _P, _P, _P, _I, _I, _I, _I],
               "sce_loss_f32": [_P] * 7 + [_I, _I],
               "sce_grad_f32": [_P] * 7 + [_I, _I],
               "dw_conv_fwd": [_P] * 5 + [_I, _I],
               "dw_conv_dx": [_P] * 4 + [_I, _I],
               "dw_conv_dw": [_P, _I, _P, _P, _P, _I, _I],
               "ln_fwd_f32": [_P] * 8 + [_I, _I],
               "ln_grad_cols_f32": [_P] * 9 + [_I] * 5,
               "ln_grad_rows_f32": [_P] * 7 + [_I, _I],
               "scatter_add_rows_f32": [_P] * 3 + [_I, _I],
               "bn_fwd_f32": [_P] * 12 + [_I, _I],
               "bn_grad_f32": [_P] * 9 + [_I, _I],
               "gemm_calls": [_P, _P, _I, _I, _I, _P, _I],
               "gemm_hush": [],
               "transpose32": [_P, _P] + [_I] * 6,
               "softmax_rows_f32": [_P, _P] + [_I] * 3,
               "gelu_f32": [_P, _P] + [_I] * 3,
               "gelu_grad_f32": [_P, _P] + [_I] * 3,
               "relu_f32": [_P, _P] + [_I] * 3,
               "relu_grad_f32": [_P, _P] + [_I] * 3,
               "im2col_f32": [_P] * 3,
               "col2im_add_f32": [_P] * 3}
_RESTYPES = {"sce_loss_f32": _I, "sce_grad_f32": _I, "gemm_calls": ctypes.c_double}  # the others return nothing


# Every lookup of a loop (adamw(), col2im_add()...) finds the library through _compiler and
# library_path; kernels look some up at each call (col2im for each ConvGrad), so both are kept
# cheap: the PATH search, /proc/cpuinfo and the source's hash are made once (~0.3 ms a lookup
# when each was made again).


def _compiler() -> str | None:
    return os.environ.get("CC") or _which("cc", os.environ.get("PATH")) or _which("gcc", os.environ.get("PATH"))


@functools.cache
def _which(name: str, path: str | None) -> str | None:
    return shutil.which(name, path=path)


@functools.cache
def _cpu_key() -> str:
    """What -march=native compiles for: the CPU's model and flags (a cache shared by machines
    of other CPUs must not hand them this one's library)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return "".join(lines) or platform.processor() or platform.machine()


def library_path(cc: str) -> Path:
    """Where the compiled library for this source, compiler, flags and CPU is kept."""
    return _library_file(settings.current().cache_dir, cc, _cpu_key())


@functools.lru_cache(maxsize=16)
def _library_file(cache_dir: Path, cc: str, cpu: str) -> Path:
    key = "\n".join([SOURCE, cc, " ".join(_FLAGS), cpu, sys.platform])
    return cache_dir.parent / "native" / f"fused-{hashlib.sha256(key.encode()).hexdigest()[:24]}.so"


def _build(cc: str, path: Path) -> bool:
    """Compile the source into `path` (atomically: a temporary name, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src, out = Path(tmp) / "fused.c", Path(tmp) / "fused.so"
        src.write_text(SOURCE)
        done = subprocess.run([cc, *_FLAGS, "-o", str(out), str(src)], capture_output=True, timeout=120)
        if done.returncode != 0 or not out.exists():
            return False
        os.replace(out, path)
    return True


def _library() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None where it cannot be had."""
    cc = _compiler()
    if cc is None:
        return None
    path = library_path(cc)
    if str(path) in _loaded:
        return _loaded[str(path)]
    lib = None
    try:
        if path.exists() or _build(cc, path):
            lib = ctypes.CDLL(str(path))
            for name, argtypes in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = _RESTYPES.get(name)
                fn.argtypes = argtypes
    except (OSError, subprocess.SubprocessError):
        lib = None
    _loaded[str(path)] = lib
    return lib


def _enabled_library() -> ctypes.CDLL | None:
    """The library, or None where it cannot be had or ONNXPLAN_NATIVE_KERNELS=0 turns it off."""
    return _library() if settings.current().native_kernels else None


def adamw() -> Callable[..., None] | None:
    """adamw_f32(n, p, g, m, v, p_out, m_out, v_out, constants, step, mode) with addresses as ints
    (ctypes releases the interpreter lock for the call), or None: the numpy path."""
    lib = _enabled_library()
    return lib.adamw_f32 if lib is not None else None


@dataclass(frozen=True)
class SmallConv:
    """The small conv's loops (addresses as ints; ctypes releases the interpreter lock):

    fwd(geometry, m, x, w, bias or None, y, col, n0, n1, band): Y of images n0..n1;
    dw(geometry, m, x, dy, dw, col, count, k0, k1, band): dW's taps k0..k1 over `count` images.
    `geometry` is an int64 array (c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw)."""

    fwd: Callable[..., None]
    dw: Callable[..., None]


def small_conv() -> SmallConv | None:
    """The small conv's loops, or None: the BLAS path (kernels/conv_small.py)."""
    lib = _enabled_library()
    return SmallConv(lib.small_conv_fwd, lib.small_conv_dw) if lib is not None else None


@dataclass(frozen=True)
class Sce:
    """SoftmaxCrossEntropyLoss's and its gradient's loops (addresses as ints, None for NULL;
    ctypes releases the interpreter lock). `g` is an int64 array (n, c, d, start, n_all,
    reduction: SCE_REDUCTIONS), `ignore` the address of an int64 ignore_index, read at the call:

    loss(g, x or None, log_prob, labels, weight or None, ignore, loss or None, r0, r1): log_prob's
    rows r0..r1 from x (when given), then the loss from all of log_prob (when given);
    grad(g, dy, log_prob, labels, weight or None, ignore, dlogits, r0, r1): dlogits' rows r0..r1.
    Each returns -1, or the flat index in labels of a label out of [0, c) not ignored."""

    loss: Callable[..., int]
    grad: Callable[..., int]


def sce() -> Sce | None:
    """The SCE loops, or None: the numpy path (kernels/softmax_loss.py)."""
    lib = _enabled_library()
    return Sce(lib.sce_loss_f32, lib.sce_grad_f32) if lib is not None else None


@dataclass(frozen=True)
class DepthwiseConv:
    """A 2-D depthwise convolution's loops (addresses as ints, None for NULL; ctypes releases
    the interpreter lock); `g` is an int64 array (c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw):

    fwd(g, x, w, bias or None, y, p0, p1): Y's planes p0..p1 (plane: image * c + channel);
    dx(g, dy, w, dx, p0, p1): dX's planes p0..p1;
    dw(g, n, dy, x, dw, c0, c1): dW's channels c0..c1 over n images (kh * kw <= DEPTHWISE_MAX_TAPS)."""

    fwd: Callable[..., None]
    dx: Callable[..., None]
    dw: Callable[..., None]


def depthwise_conv() -> DepthwiseConv | None:
    """The depthwise conv's loops, or None: the numpy paths (kernels/conv_depthwise_loops.py)."""
    lib = _enabled_library()
    return DepthwiseConv(lib.dw_conv_fwd, lib.dw_conv_dx, lib.dw_conv_dw) if lib is not None else None


@dataclass(frozen=True)
class LayerNorm:
    """The layer norms' loops (addresses as ints, None for NULL; ctypes releases the interpreter
    lock); `g` is an int64 array (rows, m, simplified), `c` a float32 array (eps):

    fwd(g, c, x, scale, bias, y, mean, inv_std_dev, r0, r1): rows r0..r1 of Y and the statistics;
    grad_cols(g, dy, x, mean, inv, dscale, dbias, acc_s, acc_b, r0, r1, c0, c1, first): dscale
    and dbias's columns c0..c1 over rows r0..r1 (added to them unless `first`, through acc_s and
    acc_b, m floats each);
    grad_rows(g, dy, x, scale, mean, inv, dx, r0, r1): dX's rows r0..r1."""

    fwd: Callable[..., None]
    grad_cols: Callable[..., None]
    grad_rows: Callable[..., None]


def layer_norm() -> LayerNorm | None:
    """The layer norms' loops, or None: the numpy paths (kernels/norm.py)."""
    lib = _enabled_library()
    return LayerNorm(lib.ln_fwd_f32, lib.ln_grad_cols_f32, lib.ln_grad_rows_f32) if lib is not None else None


def scatter_add_rows() -> Callable[..., None] | None:
    """scatter_add_rows_f32(out, index, values, count, width) with addresses as ints (ctypes
    releases the interpreter lock): out[index[k]] += values[k], rows of `width` floats, k in
    order; or None: numpy's add.at."""
    lib = _enabled_library()
    return lib.scatter_add_rows_f32 if lib is not None else None


@dataclass(frozen=True)
class BatchNorm:
    """The training BatchNorm's loops (addresses as ints, None for NULL; ctypes releases the
    interpreter lock); `g` is an int64 array (n, c, s), `k` a float32 array (eps, momentum):

    fwd(g, k, x, scale, bias, mean_in, var_in, y, run_mean, run_var, mean, inv_std, c0, c1):
    channels c0..c1 of Y, the running statistics (NULL: not wanted) and the saved ones;
    grad(g, dy, x, scale, mean, inv_std, dx, dscale, dbias, c0, c1): channels c0..c1 of the
    gradients (NULL: not wanted)."""

    fwd: Callable[..., None]
    grad: Callable[..., None]


def batch_norm() -> BatchNorm | None:
    """The training BatchNorm's loops, or None: the numpy paths (kernels/batch_norm.py)."""
    lib = _enabled_library()
    return BatchNorm(lib.bn_fwd_f32, lib.bn_grad_f32) if lib is not None else None


@dataclass(frozen=True)
class GemmPoolCalls:
    """The GEMM pool's entry points (addresses as ints; ctypes releases the interpreter lock;
    kernels/gemm_calls.py): run(fn, calls, count, workers, spin_ns, out, kind) -> seconds taken;
    hush(): the workers spinning for a next job sleep now."""

    run: Callable[..., float]
    hush: Callable[[], None]


def gemm_calls() -> GemmPoolCalls | None:
    """The GEMM pool's entry points, or None: the Python pool."""
    lib = _enabled_library()
    return GemmPoolCalls(lib.gemm_calls, lib.gemm_hush) if lib is not None else None


def transpose32() -> Callable[..., None] | None:
    """transpose32(x, y, rows, cols, b0, b1, c0, c1) with addresses as ints (ctypes releases the
    interpreter lock): y[b] = x[b]^T for batches b0..b1, x's columns c0..c1, of contiguous 32-bit
    [rows x cols] matrices (kernels/transpose.py); or None: numpy's or torch's copy."""
    lib = _enabled_library()
    return lib.transpose32 if lib is not None else None


def activation(name: str, grad: bool = False) -> Callable[..., None] | None:
    """The fused loop of an activation, `name` "gelu" (the exact GELU) or "relu":
    NAME_f32(x, y, i0, i1, 0) with addresses as ints over elements i0..i1 of contiguous float32
    arrays (y may be x; kernels/elementwise.py); `grad`: NAME_grad_f32(dy, dx, i0, i1, x) its
    gradient (dx may be dy or x); or None: torch's or numpy's."""
    lib = _enabled_library()
    if lib is None:
        return None
    return getattr(lib, f"{name}_grad_f32" if grad else f"{name}_f32")


def softmax_rows() -> Callable[..., None] | None:
    """softmax_rows_f32(x, y, r0, r1, c) with addresses as ints: the softmax of rows r0..r1 of
    contiguous float32 [rows, c] arrays (y may be x; kernels/softmax_loss.py); or None: torch's or
    numpy's."""
    lib = _enabled_library()
    return lib.softmax_rows_f32 if lib is not None else None


def im2col() -> Callable[..., None] | None:
    """im2col_f32(g, x, col) with addresses as ints (ctypes releases the interpreter lock):
    col[c, ky, kx, n, oy, ox] = x[n, c, iy, ix] of a 2-D window, 0 outside the image; `g` as
    col2im_add's. Or None: numpy's strided copies."""
    lib = _enabled_library()
    return lib.im2col_f32 if lib is not None else None


def col2im_add() -> Callable[..., None] | None:
    """col2im_add_f32(g, col, dx) with addresses as ints (ctypes releases the interpreter lock):
    dx[n, c, iy, ix] += col[c, ky, kx, n, oy, ox] of a 2-D window, each element's taps in
    row-major order; `g` is an int64 array (nb, c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw,
    x_n, x_c, col_c, col_ky, col_kx, col_n: strides in elements; kernels/im2col.py). Or None:
    numpy's adds tap by tap."""
    lib = _enabled_library()
    return lib.col2im_add_f32 if lib is not None else None
