"""BLAS's own packing buffer, outside the plan, bounded by blocks of rows (kernels.matmul.blas_matmul)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.kernels import matmul
from onnxplan.memprobe import mark_baseline, probe_peak

ROWS, INNER, COLS = 3072, 1024, 768  # GPT-2 small's MLP weight gradient: X^T (3072 x 1024) @ dY


def product_target(blocked: bool) -> dict:
    """Probe child: one transposed-left product at one BLAS thread, operands written before the
    baseline, so what it adds is BLAS's packing buffer."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    x = np.ones((INNER, ROWS), np.float32)
    dy = np.ones((INNER, COLS), np.float32)
    out = np.ones((ROWS, COLS), np.float32)
    mark_baseline()
    if blocked:
        matmul.blas_matmul(x.T, dy, out)
    else:
        np.matmul(x.T, dy, out=out)
    return {"sum": float(out[0, 0])}


@pytest.mark.parametrize("blocked", [False, True])
def test_row_blocks_bound_the_packing_buffer(blocked):
    res = probe_peak(f"{__file__}:product_target", {"blocked": blocked})
    assert res.result["sum"] == INNER
    # measured: 4.31 MiB whole, 1.81 MiB by blocks of 1,024 rows (1.25 KiB a row + 0.56 MiB)
    bound = 1.25 * 1024 * matmul.BLAS_ROW_BLOCK + (1 << 20)
    assert (res.peak_increase_bytes <= bound) == blocked, res.peak_increase_bytes


@pytest.mark.parametrize("shape", [(3000, 70, 40, True), (2049, 33, 9, False), (2, 1500, 20, 8, False)])
def test_blocks_compute_the_product(shape):
    rng = np.random.default_rng(7)
    *batch, rows, inner, cols, transposed = shape
    a = rng.standard_normal((*batch, inner, rows) if transposed else (*batch, rows, inner)).astype(np.float32)
    a = np.swapaxes(a, -1, -2) if transposed else a
    b = rng.standard_normal((inner, cols)).astype(np.float32)
    out = np.full((*batch, rows, cols), np.nan, np.float32)
    matmul.blas_matmul(a, b, out)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4 * np.sqrt(inner))
