"""Transpose as blocked matrix transposes (kernels/native_source_transpose.py) where the
permutation is one: after dropping axes of size 1 and merging axes that stay neighbours, the
output is, for each of a batch of contiguous matrices of the input, its transpose. A weight's
transpose ([1, 0]) and attention's heads split off the sequence ([0, 2, 3, 1] of (batch,
sequence, heads, width): per sequence a (sequence x heads * width) matrix transposed) are; a
permutation that keeps the last axis last (contiguous runs) is not, and keeps torch's or
numpy's copy. Measured (hf-bert@bench, one thread): its 64 weight transposes moved 1.1-1.4
GB/s through torch's copy, the head transposes 2.1 GB/s."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from onnxplan.kernels import gemm_calls, native, parallel

__all__ = ["TILE", "matrix_transpose", "native_transpose", "reduced_permutation"]

TILE = 8  # the C loop's register tile: a thread's columns start at multiples of it


def reduced_permutation(shape: Sequence[int], perm: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, perm) of the same transpose with the axes of size 1 dropped and every run of
    input axes that stays together, in order, in the output merged into one axis."""
    kept = [a for a in perm if shape[a] != 1]
    groups: list[list[int]] = []
    for a in kept:
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])  # the groups in input order
    sizes = tuple(math.prod(shape[a] for a in groups[g]) for g in order)
    return sizes, tuple(order.index(g) for g in range(len(groups)))


def matrix_transpose(shape: Sequence[int], perm: Sequence[int]) -> tuple[int, int, int] | None:
    """(batch, rows, cols) when x.transpose(perm) is, for each of `batch` contiguous [rows x
    cols] matrices of x (C order), the matrix transposed; None otherwise (a copy, or a
    permutation of another kind)."""
    sizes, p = reduced_permutation(shape, perm)
    k = len(p)
    if k < 2 or p != (*range(k - 2), k - 1, k - 2):
        return None
    return math.prod(sizes[:-2]), sizes[-2], sizes[-1]


def native_transpose(xp, x, out, perm: Sequence[int]) -> Callable[[], None] | None:
    """The step's call writing x.transpose(perm) into `out` through the C loop, its work cut
    across the compute threads (by matrices, else by x's columns: each part writes its own rows
    of out) on the GEMM pool from gemm_calls.POOLED_MIN_ELEMS elements a part (else on the
    Python pool from kernels.parallel's MIN_ELEMS); None where it does not apply (not host numpy, not 32-bit elements of one dtype,
    not C-contiguous, not a matrix transpose, no compiled library)."""
    fn = native.transpose32()
    if fn is None or xp is not np or x.dtype != out.dtype or x.itemsize != 4 or x.size == 0 \
            or not (x.flags.c_contiguous and out.flags.c_contiguous):
        return None
    shape = matrix_transpose(x.shape, perm)
    if shape is None:
        return None
    batch, rows, cols = shape
    px, py = x.ctypes.data, out.ctypes.data
    gemm, pooled = gemm_calls.pooled_parts(x.size)
    parts = pooled if gemm is not None else parallel.parts_for(x.size, xp)
    if parts <= 1:
        return functools.partial(fn, px, py, rows, cols, 0, batch, 0, cols)
    if batch >= parts:
        pieces = [(b0, b1, 0, cols) for b0, b1 in parallel.bounds(batch, parts)]
    else:
        tiles = -(-cols // TILE)
        pieces = [(0, batch, t0 * TILE, min(t1 * TILE, cols)) for t0, t1 in parallel.bounds(tiles, min(parts, tiles))]
    if len(pieces) == 1:  # a matrix of fewer columns than two tiles
        return functools.partial(fn, px, py, rows, cols, *pieces[0])
    if gemm is not None:
        return gemm_calls.PooledCalls(gemm, gemm_calls.TRANSPOSE32, fn, [(px, py, rows, cols, *p) for p in pieces])
    calls = [functools.partial(fn, px, py, rows, cols, *piece) for piece in pieces]
    return lambda: parallel.run(calls)
