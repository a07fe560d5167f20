"""Transpose through the blocked C loop (kernels/transpose.py): every permutation of random
shapes against numpy's transpose, bit for bit (random bit patterns, NaNs' payloads included),
whole and cut across threads; the check shown to fail on a planted fault."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from onnxplan.kernels import native, transpose
from onnxplan.kernels.transpose import matrix_transpose, native_transpose, reduced_permutation

pytestmark = pytest.mark.skipif(native.transpose32() is None, reason="no C compiler")

SHAPES = [(1, 1), (3, 5), (13, 7), (64, 64), (70, 129), (9, 1, 17), (2, 3, 4), (5, 16, 3, 24), (3, 9, 2, 10, 2)]


def _bits(rng, shape, dtype) -> np.ndarray:
    """Random 32-bit patterns (NaNs and infinities among them for float32) viewed as `dtype`."""
    return rng.integers(0, 2 ** 32, size=shape, dtype=np.uint64).astype(np.uint32).view(dtype)


def _check_all(rng, dtypes=(np.float32, np.int32, np.uint32)) -> int:
    """Every permutation of every shape: the output is x.transpose(perm)'s bits; how many went
    through the C loop."""
    native_count = 0
    for shape, dtype in itertools.product(SHAPES, dtypes):
        x = _bits(rng, shape, dtype)
        for perm in itertools.permutations(range(len(shape))):
            out = np.full(tuple(shape[p] for p in perm), 0xFFFFFFFF, np.uint32).view(dtype)
            call = native_transpose(np, x, out, perm)
            if call is None:
                continue
            call()
            native_count += 1
            np.testing.assert_array_equal(out.view(np.uint32), x.transpose(perm).view(np.uint32),
                                          err_msg=f"{shape} {perm} {dtype}")
    return native_count


def test_every_matrix_transpose_moves_the_bits():
    assert _check_all(np.random.default_rng(0)) >= 75


@pytest.mark.parametrize("on", ["gemm-pool", "python-pool"])
def test_cut_across_threads_by_matrices_and_by_columns(split, monkeypatch, on):
    """With pieces from 64 elements on 3 threads, both cuts (matrices; one matrix's columns in
    multiples of the tile) give the same bits, as calls on the GEMM pool (kind TRANSPOSE32) and
    as the Python pool's pieces."""
    from onnxplan.kernels import gemm_calls

    cuts = set()
    if on == "gemm-pool":
        if gemm_calls.pool() is None:
            pytest.skip("no GEMM pool (no ILP64 OpenBLAS)")
        monkeypatch.setattr(gemm_calls, "POOLED_MIN_ELEMS", 64)
        real_pool = gemm_calls.GemmPool.run

        def pool_run(self, table, workers, kind=gemm_calls.SGEMM, fn=None, **kw):
            assert kind == gemm_calls.TRANSPOSE32 and len(table) > 1
            cuts.add("columns" if (table[:, 4:6] == table[0, 4:6]).all() else "matrices")
            return real_pool(self, table, workers, kind, fn, **kw)

        monkeypatch.setattr(gemm_calls.GemmPool, "run", pool_run)
    else:
        monkeypatch.setattr(gemm_calls, "pool", lambda: None)
        real = transpose.parallel.run

        def run(calls, *args, **kwargs):
            cuts.add("columns" if all(c.args[4:6] == calls[0].args[4:6] for c in calls) else "matrices")
            real(calls, *args, **kwargs)

        monkeypatch.setattr(transpose.parallel, "run", run)
    assert _check_all(np.random.default_rng(1), dtypes=(np.float32,)) >= 25
    assert cuts == {"columns", "matrices"}


def test_a_missing_column_is_seen(monkeypatch):
    """The check fails when the loop leaves a matrix's last column of x (out's last row) unwritten."""
    real = native.transpose32()

    def short(px, py, rows, cols, b0, b1, c0, c1):
        real(px, py, rows, cols, b0, b1, c0, max(c0, c1 - 1))

    monkeypatch.setattr(native, "transpose32", lambda: short)
    with pytest.raises(AssertionError):
        _check_all(np.random.default_rng(2), dtypes=(np.float32,))


def test_which_permutations_are_matrix_transposes():
    assert reduced_permutation((8, 128, 4, 64), (0, 2, 3, 1)) == ((8, 128, 256), (0, 2, 1))
    assert matrix_transpose((8, 128, 4, 64), (0, 2, 3, 1)) == (8, 128, 256)
    assert matrix_transpose((8, 4, 64, 128), (0, 3, 1, 2)) == (8, 256, 128)
    assert matrix_transpose((256, 1024), (1, 0)) == (1, 256, 1024)
    assert matrix_transpose((1, 7, 1, 5), (3, 2, 1, 0)) == (1, 7, 5)  # size-1 axes dropped
    assert matrix_transpose((8, 128, 4, 64), (0, 2, 1, 3)) is None  # the last axis stays: runs, not a matrix
    assert matrix_transpose((2, 3, 4), (0, 1, 2)) is None  # a copy
    assert matrix_transpose((2, 3, 4), (2, 0, 1)) == (1, 6, 4)
    assert matrix_transpose((2, 3, 4), (1, 2, 0)) == (1, 2, 12)


def test_other_dtypes_and_layouts_are_left_to_the_copy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 10))
    assert native_transpose(np, x, np.empty((10, 6)), (1, 0)) is None  # float64
    y = rng.standard_normal((6, 10), dtype=np.float32)
    assert native_transpose(np, y[:, ::2], np.empty((5, 6), np.float32), (1, 0)) is None  # not contiguous
    assert transpose.native_transpose(np, y, np.empty((10, 6), np.float32), (1, 0)) is not None
