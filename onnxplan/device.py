"""Where a step runs: `cpu` (numpy) or `cuda` (CuPy on the current GPU), and how its memory is measured.

On the CPU the measured peak is the probe's RSS increase in a fresh process
(onnxplan.memprobe). On a GPU it is the most device memory held at once by live CuPy arrays,
counted by a memory hook on CuPy's pool from just before the arena is allocated
(`DevicePeak`): the arena, the state region and any temporary a kernel or cuBLAS's pool
allocation makes. Memory the pool keeps cached after an array dies is not counted (it is
reusable, and `cudaMalloc`-level totals are reported beside it).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from onnxplan.errors import UsageError

__all__ = ["DEVICES", "DevicePeak", "array_module", "cuda_available", "device_name", "synchronize"]

DEVICES = ("cpu", "cuda")


def cuda_available() -> tuple[bool, str]:
    """(True, the GPU's name) when CuPy imports and sees a CUDA device; else (False, why not)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA
        return False, f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver: cudaErrorNoDevice / InsufficientDriver
        return False, f"CuPy sees no CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return False, "CuPy sees no CUDA device"
    return True, device_name(cupy)


def device_name(xp: Any) -> str:
    """A short description of where `xp` computes."""
    if xp is np:
        return "cpu (numpy)"
    props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return f"cuda:{xp.cuda.Device().id} ({name}, CuPy {xp.__version__})"


def array_module(device: str) -> Any:
    """numpy for 'cpu', cupy for 'cuda'; a UsageError (one line, exit 2) when it can't be had."""
    device = (device or "cpu").lower()
    if device == "cpu":
        return np
    if device == "cuda":
        ok, why = cuda_available()
        if not ok:
            raise UsageError(f"--device cuda: {why}; install CuPy for your CUDA (e.g. cupy-cuda12x) "
                             f"on a machine with an NVIDIA GPU, or use --device cpu")
        import cupy

        return cupy
    raise UsageError(f"unknown --device {device!r}: expected one of {', '.join(DEVICES)}")


def synchronize(xp: Any) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if xp is not np:
        xp.cuda.Device().synchronize()


class DevicePeak:
    """Context: the most bytes held at once by CuPy arrays allocated inside it (and the
    cudaMalloc-level pool total at its end).

    A `cupy.cuda.MemoryHook` sees every pool malloc and free with the size the pool rounded
    to (512-byte units); frees of arrays allocated before the context are ignored. CuPy's
    hooks are per thread: allocations of other threads are not seen (the swap I/O worker
    copies into arena views and allocates nothing on the device)."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self.current = 0
        self.peak = 0
        self.pool_total_bytes = 0
        self._live: dict[int, int] = {}
        self._lock = threading.Lock()
        self._hook: Any = None  # a cupy MemoryHook while entered

    def __enter__(self) -> DevicePeak:
        xp = self.xp
        synchronize(xp)
        outer = self
        memory_hook: Any = xp.cuda.MemoryHook

        class _Hook(memory_hook):
            name = "onnxplan.DevicePeak"

            def malloc_postprocess(self, **kw):  # device_id, size, mem_size, mem_ptr, pmem_id
                with outer._lock:
                    outer._live[kw["mem_ptr"]] = kw["mem_size"]
                    outer.current += kw["mem_size"]
                    outer.peak = max(outer.peak, outer.current)

            def free_preprocess(self, **kw):  # device_id, mem_size, mem_ptr, pmem_id
                with outer._lock:
                    size = outer._live.pop(kw["mem_ptr"], None)
                    if size is not None:
                        outer.current -= size

        self._hook = _Hook()
        self._hook.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.xp)
        self._hook.__exit__(*exc)
        self.pool_total_bytes = int(self.xp.get_default_memory_pool().total_bytes())
