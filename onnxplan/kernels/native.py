"""Fused loops in C for the kernels whose numpy form takes many passes (the AdamW update: ~12
ufunc passes per element where ONNX Runtime runs one loop), compiled on first use with the
machine's C compiler and kept in the cache (one shared library per source, compiler and CPU).

The C loop performs ONNX Runtime's float32 operations in ORT's order, each rounded as numpy's
ufuncs round it: no fused multiply-add (-ffp-contract=off), no fast-math; -fno-math-errno only
lets sqrtf vectorise (it changes no result). So the loop computes the numpy kernel's bits
exactly (tests/test_kernels_native.py checks it against the numpy path, bit for bit). Where no
compiler is found, the compile fails, or ONNXPLAN_NATIVE_KERNELS=0 (onnxplan.settings), `adamw()`
is None and the kernels take the numpy path: same bits, slower.
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
from pathlib import Path

from onnxplan import settings

__all__ = ["ADAMW_CONSTANTS", "adamw", "library_path"]

# The constants array the AdamW loop reads, in this order (float32 each; kernels/optimizer.py).
ADAMW_CONSTANTS = ("lr", "alpha", "beta", "one_minus_alpha", "one_minus_beta", "eps", "wd", "alpha_corr",
                   "beta_corr", "lr_corr", "lr_wd")

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
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
"""
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
_loaded: dict[str, ctypes.CDLL | None] = {}


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
            fn = lib.adamw_f32
            fn.restype = None
            fn.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 8 + [ctypes.c_int]
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
