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

Where no compiler is found, the compile fails, or ONNXPLAN_NATIVE_KERNELS=0
(onnxplan.settings), `adamw()` and `small_conv()` are None and the kernels take the numpy paths.
"""

from __future__ import annotations

import ctypes
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

__all__ = ["ADAMW_CONSTANTS", "SMALL_CONV_ACC", "SMALL_CONV_M", "SmallConv", "adamw", "library_path", "small_conv"]

# The constants array the AdamW loop reads, in this order (float32 each; kernels/optimizer.py).
ADAMW_CONSTANTS = ("lr", "alpha", "beta", "one_minus_alpha", "one_minus_beta", "eps", "wd", "alpha_corr",
                   "beta_corr", "lr_corr", "lr_wd")
SMALL_CONV_M = 8  # output channels the small conv's loops hold in registers at most
SMALL_CONV_ACC = 4096  # dW elements a small_conv_dw call sums at most (its double accumulators)

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
/* ONNX Runtime's AdamWOptimizer (orttraining cpu adamw.cc), one element at a time; outputs may be
   the inputs themselves (each element read before it is written). c: see ADAMW_CONSTANTS. */
void adamw_f32(int64_t n, const float *p, const float *g, const float *m, const float *v,
               float *po, float *mo, float *vo, const float *c, int mode) {
    const float lr = c[0], alpha = c[1], beta = c[2], oma = c[3], omb = c[4], eps = c[5], wd = c[6],
                acorr = c[7], bcorr = c[8], lrc = c[9], lrwd = c[10];
    if (mode == 0) {  /* PyTorch form: decay first; bias corrections on m and v */
#pragma GCC ivdep
        for (int64_t i = 0; i < n; i++) {
            float w = p[i], gi = g[i];
            if (wd != 0.0f) { float t = w * lr; t = t * wd; w = w - t; }
            float mn = m[i] * alpha + gi * oma;
            float t1 = gi * omb; t1 = t1 * gi;
            float vn = v[i] * beta + t1;
            float d = sqrtf(vn / bcorr) + eps; d = d * acorr;
            float u = mn * lr; u = u / d;
            po[i] = w - u; mo[i] = mn; vo[i] = vn;
        }
    } else {  /* Hugging Face form: corrected learning rate, decay after the update */
#pragma GCC ivdep
        for (int64_t i = 0; i < n; i++) {
            float w = p[i], gi = g[i];
            float mn = m[i] * alpha + gi * oma;
            float t1 = gi * omb; t1 = t1 * gi;
            float vn = v[i] * beta + t1;
            float d = sqrtf(vn) + eps;
            float u = mn * lrc; u = u / d;
            w = w - u;
            if (wd != 0.0f) { float t = w * lrwd; w = w - t; }
            po[i] = w; mo[i] = mn; vo[i] = vn;
        }
    }
}
/* ---- a 2-D convolution with few output channels, by bands of output rows (conv_small.py) ----
   g: c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw (X (n, c, h, w) and Y (n, m, oh, ow),
   contiguous; W (m, K), K = c * kh * kw in (c, kh, kw) order). */
typedef float v8 __attribute__((vector_size(32)));

/* col[k - k0][(i - i0) * ow + j] = the tap k (c, a, b) of output (i, j), 0 in the padding, for
   output rows i0..i1 of one image. */
static void band_cols(const int64_t *g, const float *img, float *col, int64_t k0, int64_t k1,
                      int64_t i0, int64_t i1) {
    const int64_t h = g[1], w = g[2], kh = g[3], kw = g[4], ow = g[6], sh = g[7], sw = g[8],
                  ph = g[9], pw = g[10], dh = g[11], dw = g[12];
    const int64_t len = (i1 - i0) * ow;
    for (int64_t k = k0; k < k1; k++) {
        const int64_t ci = k / (kh * kw), a = (k / kw) % kh, b = k % kw;
        float *dst = col + (k - k0) * len;
        const int64_t off = b * dw - pw;
        int64_t j0 = 0, j1 = ow;  /* outputs whose input column lies inside */
        while (j0 < ow && j0 * sw + off < 0) j0++;
        while (j1 > j0 && (j1 - 1) * sw + off >= w) j1--;
        const float *plane = img + ci * h * w;
        for (int64_t i = i0; i < i1; i++, dst += ow) {
            const int64_t r = i * sh - ph + a * dh;
            if (r < 0 || r >= h) { memset(dst, 0, (size_t)ow * sizeof(float)); continue; }
            const float *src = plane + r * w + off;
            for (int64_t j = 0; j < j0; j++) dst[j] = 0.0f;
            if (sw == 1) {
                memcpy(dst + j0, src + j0, (size_t)(j1 - j0) * sizeof(float));
            } else if (sw == 2) {  /* eight outputs from sixteen inputs: one shuffle */
                int64_t j = j0;
                for (; j + 8 <= j1 && 2 * j + 16 <= w - off; j += 8) {
                    v8 lo, hi;
                    memcpy(&lo, src + 2 * j, 32);
                    memcpy(&hi, src + 2 * j + 8, 32);
#ifdef __clang__
                    v8 even = __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14);
#else
                    typedef int i8 __attribute__((vector_size(32)));
                    v8 even = __builtin_shuffle(lo, hi, (i8){0, 2, 4, 6, 8, 10, 12, 14});
#endif
                    memcpy(dst + j, &even, 32);
                }
                for (; j < j1; j++) dst[j] = src[2 * j];
            } else {
                for (int64_t j = j0; j < j1; j++) dst[j] = src[j * sw];
            }
            for (int64_t j = j1; j < ow; j++) dst[j] = 0.0f;
        }
    }
}

/* Y[n, mi] = sum over k in order of W[mi, k] col[k] (+ bias[mi]) for images n0..n1, `band`
   output rows at a time through `col` (K * band * ow floats). m <= 8. */
void small_conv_fwd(const int64_t *g, int64_t m, const float *x, const float *wt, const float *bias,
                    float *y, float *col, int64_t n0, int64_t n1, int64_t band) {
    const int64_t K = g[0] * g[3] * g[4], oh = g[5], ow = g[6], L = oh * ow, image = g[0] * g[1] * g[2];
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t i0 = 0; i0 < oh; i0 += band) {
            const int64_t i1 = i0 + band < oh ? i0 + band : oh, len = (i1 - i0) * ow;
            band_cols(g, x + n * image, col, 0, K, i0, i1);
            float *out = y + n * m * L + i0 * ow;
            int64_t p = 0;
            for (; p + 8 <= len; p += 8) {
                v8 acc[8];
                for (int64_t mi = 0; mi < m; mi++) acc[mi] = (v8){0};
                for (int64_t k = 0; k < K; k++) {
                    v8 c;
                    memcpy(&c, col + k * len + p, 32);
                    for (int64_t mi = 0; mi < m; mi++) acc[mi] += wt[mi * K + k] * c;
                }
                for (int64_t mi = 0; mi < m; mi++) {
                    if (bias) acc[mi] += bias[mi];
                    memcpy(out + mi * L + p, &acc[mi], 32);
                }
            }
            for (; p < len; p++) {
                for (int64_t mi = 0; mi < m; mi++) {
                    float a = 0.0f;
                    for (int64_t k = 0; k < K; k++) a += wt[mi * K + k] * col[k * len + p];
                    if (bias) a += bias[mi];
                    out[mi * L + p] = a;
                }
            }
        }
    }
}

/* dW[mi, k] for taps k0..k1 (dW (m, K)) = the sum over images n < count and bands of `band`
   output rows (in order) of each band's sum of dY[n, mi] col[k] (eight lanes, then the lanes
   pairwise), the bands' sums in double. `col` holds (k1 - k0) * band * ow floats. m <= 8,
   m * (k1 - k0) <= 4096. */
void small_conv_dw(const int64_t *g, int64_t m, const float *x, const float *dy, float *dwt,
                   float *col, int64_t count, int64_t k0, int64_t k1, int64_t band) {
    const int64_t K = g[0] * g[3] * g[4], oh = g[5], ow = g[6], L = oh * ow, image = g[0] * g[1] * g[2];
    const int64_t nk = k1 - k0;
    double acc[4096];
    for (int64_t i = 0; i < m * nk; i++) acc[i] = 0.0;
    for (int64_t n = 0; n < count; n++) {
        for (int64_t i0 = 0; i0 < oh; i0 += band) {
            const int64_t i1 = i0 + band < oh ? i0 + band : oh, len = (i1 - i0) * ow;
            band_cols(g, x + n * image, col, k0, k1, i0, i1);
            const float *d = dy + n * m * L + i0 * ow;
            for (int64_t k = 0; k < nk; k++) {
                const float *cr = col + k * len;
                v8 s[8];
                for (int64_t mi = 0; mi < m; mi++) s[mi] = (v8){0};
                int64_t p = 0;
                for (; p + 8 <= len; p += 8) {
                    v8 c;
                    memcpy(&c, cr + p, 32);
                    for (int64_t mi = 0; mi < m; mi++) {
                        v8 dv;
                        memcpy(&dv, d + mi * L + p, 32);
                        s[mi] += dv * c;
                    }
                }
                for (int64_t mi = 0; mi < m; mi++) {
                    float t = ((s[mi][0] + s[mi][1]) + (s[mi][2] + s[mi][3])) +
                              ((s[mi][4] + s[mi][5]) + (s[mi][6] + s[mi][7]));
                    for (int64_t q = p; q < len; q++) t += d[mi * L + q] * cr[q];
                    acc[mi * nk + k] += (double)t;
                }
            }
        }
    }
    for (int64_t mi = 0; mi < m; mi++)
        for (int64_t k = 0; k < nk; k++) dwt[mi * K + k0 + k] = (float)acc[mi * nk + k];
}
"""
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
_loaded: dict[str, ctypes.CDLL | None] = {}
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {"adamw_f32": [_I] + [_P] * 8 + [ctypes.c_int],
               "small_conv_fwd": [_P, _I, _P, _P, _P, _P, _P, _I, _I, _I],
               "small_conv_dw": [_P, _I, _P, _P, _P, _P, _I, _I, _I, _I]}


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


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
    key = "\n".join([_SOURCE, cc, " ".join(_FLAGS), _cpu_key(), sys.platform])
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return settings.current().cache_dir.parent / "native" / f"fused-{digest}.so"


def _build(cc: str, path: Path) -> bool:
    """Compile the source into `path` (atomically: a temporary name, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src, out = Path(tmp) / "fused.c", Path(tmp) / "fused.so"
        src.write_text(_SOURCE)
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
                fn.restype = None
                fn.argtypes = argtypes
    except (OSError, subprocess.SubprocessError):
        lib = None
    _loaded[str(path)] = lib
    return lib


def adamw() -> Callable[..., None] | None:
    """adamw_f32(n, p, g, m, v, p_out, m_out, v_out, constants, mode) with addresses as ints
    (ctypes releases the interpreter lock for the call), or None: the numpy path."""
    if not settings.current().native_kernels:
        return None
    lib = _library()
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
    if not settings.current().native_kernels:
        return None
    lib = _library()
    return SmallConv(lib.small_conv_fwd, lib.small_conv_dw) if lib is not None else None
