"""What the kernels that call the fused C loops (kernels/native.py) share: which arrays the
loops take, an array's address for a call (None: NULL), and the kernel that runs the loops'
bound calls while holding the arrays whose addresses they carry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from onnxplan.kernels.registry import KernelContext, KernelFn

__all__ = ["address", "runner", "taken"]


def taken(*arrays) -> bool:
    """Every array given (None: absent) a float32 C-contiguous host array."""
    return all(isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous
               for a in arrays if a is not None)


def address(a) -> int | None:
    return None if a is None else int(a.ctypes.data)


def runner(tasks: list[Callable[[], Any]], keep: tuple) -> KernelFn:
    """The kernel: `tasks` in turn, each a parallel run of its pieces; `keep` holds the arrays
    whose addresses the pieces carry (alive while the kernel is)."""

    def run(ctx_: KernelContext, inputs_: list, outputs_: list, _keep=keep) -> None:
        for task in tasks:
            task()

    return run
