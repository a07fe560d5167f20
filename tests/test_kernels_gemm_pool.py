"""The GEMM pool (kernels/gemm_calls.py): a product's cblas_sgemm calls run by the calling thread
and the fused library's workers. Checked against the Python pool's pieces (np.matmul on each:
the same calls, so the same bits) and numpy's whole product; each check shown to fail on a
planted fault."""

from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import pytest

from onnxplan import settings
from onnxplan.kernels import gemm_calls, matmul, native, parallel

_REAL_POOL = gemm_calls.pool
pytestmark = pytest.mark.skipif(gemm_calls.pool() is None, reason="no C compiler or no ILP64 OpenBLAS in numpy")


def _operand(rng, rows: int, cols: int, batch: int, kind: int):
    """A float32 [batch x] rows x cols operand: contiguous (0), transposed (1), a column slice of
    a wider array (2)."""
    shape = (batch, rows, cols) if batch else (rows, cols)
    if kind == 0:
        return rng.standard_normal(shape, dtype=np.float32)
    if kind == 1:
        return np.swapaxes(rng.standard_normal(shape[:-2] + (cols, rows), dtype=np.float32), -1, -2)
    return rng.standard_normal(shape[:-1] + (cols + 5,), dtype=np.float32)[..., :cols]


def _both_paths(monkeypatch, a, b, out_shape):
    """out = a @ b through the GEMM pool and through the Python pool (the pool switched off)."""
    got = []
    for pool in (_REAL_POOL, lambda: None):
        monkeypatch.setattr(gemm_calls, "pool", pool)
        out = np.full(out_shape, np.nan, np.float32)
        matmul.Product(np, a, b, out)()
        got.append(out)
    return got


def _random_products(seed: int, count: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        m, k, n = (int(x) for x in rng.integers(1, 200, 3))
        batch = int(rng.integers(2, 5)) if rng.integers(0, 2) else 0
        a = _operand(rng, m, k, batch if rng.integers(0, 2) else 0, int(rng.integers(0, 3)))
        b = _operand(rng, k, n, batch if rng.integers(0, 2) else 0, int(rng.integers(0, 3)))
        yield a, b, np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (m, n)


def test_the_pool_computes_the_python_pools_bits(split, monkeypatch):
    """Random shapes, batches, transposed and strided operands, cut by batches, columns and
    rows: the pool's result is bitwise the Python pool's (np.matmul on each piece) and numpy's
    whole product within float32 rounding; most products go through the pool."""
    ran = []
    real_run = gemm_calls.GemmPool.run

    def counted(self, table, workers, **kw):
        ran.append(len(table))
        return real_run(self, table, workers, **kw)

    monkeypatch.setattr(gemm_calls.GemmPool, "run", counted)
    for a, b, shape in _random_products(0, 120):
        pooled, python = _both_paths(monkeypatch, a, b, shape)
        np.testing.assert_array_equal(pooled, python)
        np.testing.assert_allclose(pooled, np.matmul(a, b), rtol=1e-4, atol=1e-4)
    assert len(ran) > 100 and max(ran) > 2


def test_four_dimensional_products_take_the_pool(split, monkeypatch):
    """Attention's products: 4-D operands that are transposed views of (batch, sequence, heads,
    width) tensors, K transposed, and a leading or inner batch axis broadcast: bitwise the
    Python pool's, within rounding of numpy's whole product, and through the pool."""
    rng = np.random.default_rng(7)
    ran = []
    real_run = gemm_calls.GemmPool.run
    monkeypatch.setattr(gemm_calls.GemmPool, "run", lambda self, table, workers, **kw: ran.append(len(table))
                        or real_run(self, table, workers, **kw))
    q = rng.standard_normal((6, 40, 4, 24), dtype=np.float32).transpose(0, 2, 1, 3)  # (6, 4, 40, 24)
    k = rng.standard_normal((6, 40, 4, 24), dtype=np.float32).transpose(0, 2, 3, 1)  # (6, 4, 24, 40)
    p = rng.standard_normal((6, 4, 40, 40), dtype=np.float32)
    cases = [(q, k), (p, q), (p.swapaxes(-1, -2), q), (q, k[:1]), (q[:, :1], k), (q[0], k)]
    for a, b in cases:
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        pooled, python = _both_paths(monkeypatch, a, b, shape)
        np.testing.assert_array_equal(pooled, python)
        np.testing.assert_allclose(pooled, np.matmul(a, b), rtol=1e-4, atol=1e-4)
    assert len(ran) == len(cases) and min(ran) >= 24


def test_a_call_left_out_or_misplaced_is_seen(split, monkeypatch):
    """The comparison above fails on a planted fault: the last call dropped (its block stays
    NaN), or the first call's output shifted one row down (its first row stays NaN)."""
    rng = np.random.default_rng(1)
    a, b = _operand(rng, 90, 40, 0, 0), _operand(rng, 40, 300, 0, 1)
    real = gemm_calls.product_calls
    for fault in ("drop", "shift"):
        def planted(*args, fault=fault):
            calls = real(*args)
            if fault == "drop":
                return calls[:-1]
            calls = calls.copy()
            calls[0, 10] += calls[0, 11] * 4  # the first call writes one row lower (inside out)
            return calls

        monkeypatch.setattr(gemm_calls, "product_calls", planted)
        pooled, python = _both_paths(monkeypatch, a, b, (90, 300))
        assert not np.array_equal(pooled, python)
        monkeypatch.setattr(gemm_calls, "product_calls", real)


def test_products_numpy_computes_otherwise_keep_the_python_pool(split):
    """A @ A.T (numpy: syrk), an overlapping output, a vector piece: no pool calls."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((80, 30), dtype=np.float32)
    out = np.empty((80, 80), np.float32)
    assert gemm_calls.product_calls(a, a.T, out, "rows", [(0, 40), (40, 80)], 1024) is None
    buf = rng.standard_normal((60, 60), dtype=np.float32)
    assert gemm_calls.product_calls(buf[:, :30], buf[:30, :30], buf[:, 30:], "rows", [(0, 30), (30, 60)], 1024) is None
    x, y = rng.standard_normal((3, 30), dtype=np.float32), rng.standard_normal((30, 50), dtype=np.float32)
    assert gemm_calls.product_calls(x, y, np.empty((3, 50), np.float32), "rows", [(0, 1), (1, 2), (2, 3)],
                                    1024) is None
    assert gemm_calls.product_calls(x, y, np.empty((3, 50), np.float32), "columns", [(0, 25), (25, 50)],
                                    1024) is not None


def test_row_blocks_are_blas_matmuls_blocks(split, monkeypatch):
    """Pieces of more rows than BLAS_ROW_BLOCK are called by blocks as blas_matmul cuts them."""
    monkeypatch.setattr(matmul, "BLAS_ROW_BLOCK", 16)
    rng = np.random.default_rng(3)
    a, b = _operand(rng, 100, 24, 0, 0), _operand(rng, 24, 20, 0, 2)
    calls = gemm_calls.product_calls(a, b, np.empty((100, 20), np.float32), "rows", [(0, 50), (50, 100)], 16)
    assert [int(c[3]) for c in calls] == [12, 13, 12, 13, 12, 13, 12, 13]
    pooled, python = _both_paths(monkeypatch, a, b, (100, 20))
    np.testing.assert_array_equal(pooled, python)


def test_no_worker_started_the_caller_runs_every_call(split):
    """workers = 0 (splits losing, kernels.parallel's score): every call on the caller."""
    rng = np.random.default_rng(4)
    a, b = _operand(rng, 64, 50, 0, 0), _operand(rng, 50, 70, 0, 0)
    out = np.full((64, 70), np.nan, np.float32)
    calls = gemm_calls.product_calls(a, b, out, "rows", [(0, 20), (20, 40), (40, 64)], 1024)
    took, own, ran, count = gemm_calls.pool().run(calls, 0)
    assert ran == count == 3 and own > 0 and took >= own
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_two_callers_at_once_both_finish_right(split):
    """A second thread's job while the pool is busy runs on that thread: both products right."""
    rng = np.random.default_rng(5)
    pairs = [(rng.standard_normal((200, 150), dtype=np.float32), rng.standard_normal((150, 180), dtype=np.float32))
             for _ in range(2)]
    outs = [np.full((200, 180), np.nan, np.float32) for _ in range(2)]
    errors = []

    def work(i):
        try:
            for _ in range(50):
                outs[i].fill(np.nan)
                matmul.Product(np, *pairs[i], outs[i])()
                np.testing.assert_allclose(outs[i], pairs[i][0] @ pairs[i][1], rtol=1e-4, atol=1e-4)
        except AssertionError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors


def _child_product(queue) -> None:
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((120, 90), dtype=np.float32), rng.standard_normal((90, 140), dtype=np.float32)
    out = np.full((120, 140), np.nan, np.float32)
    matmul.Product(np, a, b, out)()
    queue.put(bool(np.allclose(out, a @ b, rtol=1e-4, atol=1e-4)))


@pytest.mark.skipif(os.name != "posix", reason="fork")
def test_a_forked_child_computes_without_the_parents_workers(split):
    """The workers are not in a forked child: its products still finish (the pool starts anew)."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((120, 90), dtype=np.float32), rng.standard_normal((90, 140), dtype=np.float32)
    matmul.Product(np, a, b, np.empty((120, 140), np.float32))()  # the parent's workers started
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_product, args=(queue,))
    child.start()
    assert queue.get(timeout=60) is True
    child.join(timeout=60)
    assert child.exitcode == 0


def test_native_kernels_off_means_no_pool(monkeypatch):
    monkeypatch.setenv("ONNXPLAN_NATIVE_KERNELS", "0")
    settings.reload()
    try:
        assert native.gemm_calls() is None and gemm_calls.pool() is None
    finally:
        monkeypatch.delenv("ONNXPLAN_NATIVE_KERNELS")
        settings.reload()
    assert gemm_calls.pool() is not None


@pytest.mark.parametrize("compute", [2, 4])
def test_a_product_pair_computes_each_products_bits(compute, monkeypatch):
    """Two products as one job (kernels.matmul.ProductPair; random shapes, batches, transposed
    and strided operands, most cut in pieces): each bitwise the product computed alone at the
    same threads, then each one's `after`; at one compute thread nothing runs and the caller is
    told so."""
    from onnxplan import threads

    before = threads.current().threads
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    products = list(_random_products(1, 40))
    jobs = 0
    try:
        for (a1, b1, s1), (a2, b2, s2) in zip(products[::2], products[1::2]):
            outs = [np.full(s, np.nan, np.float32) for s in (s1, s2)]
            after: list[int] = []
            works = [matmul.ProductWork(matmul.Product(np, a, b, out), lambda i=i: after.append(i))
                     for i, (a, b, out) in enumerate(zip((a1, a2), (b1, b2), outs))]
            pair = matmul.ProductPair(*works)
            threads.use_threads(1)
            assert pair() is False and after == [] and all(np.isnan(o).all() for o in outs)
            threads.use_threads(compute)
            if not pair():
                continue  # a product numpy computes otherwise: the executor runs the two in turn
            jobs += 1
            assert after == [0, 1]
            for w, got in zip(works, outs):
                alone = np.full(got.shape, np.nan, np.float32)
                matmul.Product(np, w.product.a, w.product.b, alone)()
                np.testing.assert_array_equal(got, alone)
    finally:
        threads.use_threads(before)
    assert jobs > 10
