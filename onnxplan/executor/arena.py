"""One aligned allocation per memory region; typed views of it at planned byte offsets."""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

import numpy as np

from onnxplan.ir.tensor import TensorSpec
from onnxplan.offsets.buffers import ALIGNMENT, align

__all__ = ["POISON_BYTE", "Arena", "region_layout"]

POISON_BYTE = 0xFF  # every byte of a dead buffer in --check-arena mode (a NaN for floats)
_MADV_DONTNEED = 4  # Linux's madvise advice: drop the pages (anonymous memory reads as zero after)


class Arena:
    """`nbytes` bytes in one allocation whose first byte is ALIGNMENT-aligned.

    The allocation is made once, here; everything else is a view of it. `xp` is the array
    module (numpy, or cupy on a GPU, whose allocations are already 256-byte aligned).
    """

    def __init__(self, nbytes: int, xp: Any = np, *, alignment: int = ALIGNMENT) -> None:
        if nbytes < 0:
            raise ValueError(f"arena size {nbytes} < 0")
        self.xp = xp
        self.nbytes = int(nbytes)
        self.alignment = alignment
        raw = xp.empty(self.nbytes + alignment, dtype=np.uint8)
        shift = (-_address(raw)) % alignment
        self._raw = raw  # keeps the allocation alive
        self.data = raw[shift:shift + self.nbytes]  # the aligned bytes

    @property
    def address(self) -> int:
        return _address(self.data)

    def bytes(self, offset: int, nbytes: int) -> Any:
        """The raw bytes [offset, offset + nbytes) as a 1-D uint8 view."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"bytes {offset}..{offset + nbytes} outside the arena [0, {self.nbytes})")
        return self.data[offset:offset + nbytes]

    def view(self, offset: int, spec: TensorSpec) -> Any:
        """A C-contiguous array of `spec`'s dtype and shape over the bytes at `offset`."""
        dtype = np.dtype(spec.dtype)
        if offset % dtype.itemsize:
            raise ValueError(f"offset {offset} is not aligned for {dtype}")
        return self.bytes(offset, spec.nbytes).view(dtype).reshape(spec.shape)

    def poison(self, offset: int = 0, nbytes: int | None = None) -> None:
        """Fill bytes with POISON_BYTE (the whole arena when no range is given)."""
        self.bytes(offset, self.nbytes - offset if nbytes is None else nbytes).fill(POISON_BYTE)

    def release_pages(self) -> int:
        """Give the arena's whole pages back to the system (madvise MADV_DONTNEED: they read as
        zero until written again), for a caller that holds the arena while nothing in it is
        live (verification, between steps: ONNX Runtime's step then runs beside the state, not
        beside our transient values too). Host memory on Linux only; returns the bytes given
        back (0 elsewhere)."""
        if self.xp is not np or not self.nbytes:
            return 0
        page = mmap.PAGESIZE
        start = -(-self.address // page) * page
        end = (self.address + self.nbytes) // page * page
        if end <= start:
            return 0
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            return 0
        ok = libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED) == 0
        return end - start if ok else 0

    def __repr__(self) -> str:
        return f"Arena({self.nbytes} B at 0x{self.address:x})"


def _address(array: Any) -> int:
    if isinstance(array, np.ndarray):
        return array.__array_interface__["data"][0]
    return int(array.data.ptr)  # cupy


def region_layout(sizes: dict[str, int], alignment: int = ALIGNMENT) -> tuple[dict[str, int], int]:
    """Offsets for named slots packed one after another, each aligned; and the total size."""
    offsets, end = {}, 0
    for name, nbytes in sizes.items():
        offsets[name] = end
        end += align(nbytes, alignment)
    return offsets, end

