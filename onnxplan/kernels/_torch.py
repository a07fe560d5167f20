"""torch's CPU operators on zero-copy views of numpy arrays, for the kernels where an `out=`
overload writes the planned view itself with no tensor-sized temporary (gelu, gelu_backward,
threshold_backward, _softmax, _softmax_backward_data). torch is imported on first use (or by
load(), which the memory probe calls before its baseline); `torch.from_numpy` costs ~2 us a
call, so views are made per call, not cached. Convolution stays ours: torch's convolution.out
allocates its result and copies it.

Set ONNXPLAN_TORCH_KERNELS=0 (onnxplan.settings) to run the numpy kernels everywhere (the benchmark's "before")."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from onnxplan import settings, threads
from onnxplan.kernels import parallel

__all__ = ["MIN_ELEMS", "VECTOR_ALIGN", "aten", "enabled", "flat_parts", "load", "tensor", "usable"]

MIN_ELEMS = 1  # measured (one thread): torch's gelu, erf, threshold_backward, softmax win at every size
# An elementwise torch operator cut into ranges for the compute threads cuts at multiples of this
# many elements: its loop takes vectors of 2 x 16 floats (AVX-512) and the last few elements one
# at a time by the scalar form, whose bits may differ (erf, tanh); cut at a multiple of 64 from
# the array's start, every element goes through the same path as in one call.
VECTOR_ALIGN = 64
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_torch: Any = None


def load() -> Any:
    """Import torch once, its pools sized by onnxplan.threads (a read-only input view warns
    once per process: silenced, the kernels never write their inputs)."""
    global _torch
    if _torch is None:
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        import torch

        _torch = torch
        threads.torch_loaded(torch)  # its pools sized by the process's thread policy
    return _torch


def enabled() -> bool:
    """Whether torch's operators are on (onnxplan.settings: ONNXPLAN_TORCH_KERNELS)."""
    return settings.current().torch_kernels


def usable(xp, out, *ins) -> bool:
    """True when torch may compute `out` from `ins`: host numpy arrays, float32/float64, all of
    out's shape and dtype, C-contiguous, at least MIN_ELEMS elements."""
    if not enabled() or xp is not np or out.size < MIN_ELEMS or out.dtype not in _DTYPES:
        return False
    return all(isinstance(a, np.ndarray) and a.shape == out.shape and a.dtype == out.dtype
               and a.flags.c_contiguous for a in (out, *ins))


def flat_parts(xp, numel: int, passes: int) -> list[tuple[int, int]]:
    """(lo, hi) ranges of a flat array of `numel` elements for the compute threads
    (kernels.parallel.row_parts, a kernel of `passes` passes), cut at multiples of VECTOR_ALIGN."""
    blocks = -(-numel // VECTOR_ALIGN)
    return [(lo * VECTOR_ALIGN, min(hi * VECTOR_ALIGN, numel))
            for lo, hi in parallel.row_parts(xp, blocks, VECTOR_ALIGN, passes=passes)]


def tensor(a) -> Any:
    """A torch tensor sharing `a`'s memory."""
    return load().from_numpy(a)


def aten() -> Any:
    return load().ops.aten
