"""Scratch sizing shared by the kernels: the bytes a chunked kernel aims for, and the alignment of
the blocks it places in its scratch."""

from __future__ import annotations

__all__ = ["ALIGN", "SCRATCH_TARGET", "align"]

# Scratch a kernel aims for: images are processed in chunks whose buffers fit this many
# bytes, but a chunk holds at least one image (so one image's columns is the floor). Read at
# call time (scratch.SCRATCH_TARGET): tests lower it.
SCRATCH_TARGET = 8 << 20
ALIGN = 64


def align(n: int) -> int:
    """`n` bytes rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN
