"""BLAS thread count of this process: read and set it in the OpenBLAS numpy loaded (ctypes), and
torch's intra-op pool with it (the kernels that call torch's operators, onnxplan.kernels._torch)."""

from __future__ import annotations

import ctypes
import functools

__all__ = ["THREADS_ENV", "blas_threads", "set_blas_threads"]

THREADS_ENV = "OPENBLAS_NUM_THREADS"  # what a child process reads before numpy loads OpenBLAS
_PREFIXES = ("scipy_openblas_", "openblas_")
_SUFFIXES = ("64_", "")


@functools.cache
def _openblas():
    """(get, set) functions of the OpenBLAS library mapped into this process, or None."""
    import numpy  # noqa: F401  (maps the library)

    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower()
                            and line.split()[-1].startswith("/")})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for pre in _PREFIXES:
            for suf in _SUFFIXES:
                get, set_ = f"{pre}get_num_threads{suf}", f"{pre}set_num_threads{suf}"
                if hasattr(lib, get) and hasattr(lib, set_):
                    getter, setter = getattr(lib, get), getattr(lib, set_)
                    getter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
                    return getter, setter
    return None


def blas_threads() -> int | None:
    """OpenBLAS's thread count, or None when numpy uses another BLAS."""
    fns = _openblas()
    return int(fns[0]()) if fns else None


def set_blas_threads(n: int) -> bool:
    """Set OpenBLAS's thread count (n >= 1), and torch's; False when numpy uses another BLAS."""
    if n < 1:
        raise ValueError(f"BLAS threads {n} < 1")
    from onnxplan.kernels import _torch

    _torch.set_threads(n)
    fns = _openblas()
    if fns is None:
        return False
    fns[1](int(n))
    return True
