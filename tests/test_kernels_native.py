"""The fused C loops (onnxplan.kernels.native): the numpy kernels' bits exactly, or the numpy
path where they cannot be had."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan import settings, threads
from onnxplan.ir.graph import Node
from onnxplan.kernels import native, optimizer, parallel
from tests.kernel_harness import call_kernel

pytestmark = pytest.mark.skipif(native.adamw() is None, reason="no C compiler: the numpy path only")


def _adamw_update(numel: int, mode: int, wd: float, step: int, in_place: bool, *, fused: bool,
                  correct_bias: int = 1) -> list[np.ndarray]:
    """One AdamWUpdate node through the kernel harness (its declared scratch), fused or numpy."""
    rng = np.random.default_rng(numel + mode)
    p = rng.standard_normal(numel).astype(np.float32)
    g = (rng.standard_normal(numel) * rng.choice([1e-7, 1e-3, 1.0, 1e3], numel)).astype(np.float32)
    g[:7] = 0
    m = (rng.standard_normal(numel) * 0.1).astype(np.float32)
    v = (np.abs(rng.standard_normal(numel)) * 0.1).astype(np.float32)
    v[:3] = 0  # sqrt(0) + eps
    lr, st = np.array([1e-3], np.float32), np.array([step], np.int64)
    node = Node("u", "AdamWUpdate", "onnxplan", ["lr", "s", "p", "g", "m", "v"], ["p1", "m1", "v1"],
                {"weight_decay": wd, "adam_mode": mode, "epsilon": 1e-8, "correct_bias": correct_bias})
    ins = [lr, st, p, g, m, v]
    outs = [p, m, v] if in_place else [np.full_like(p, np.nan) for _ in range(3)]
    with settings.override(native_kernels=fused):
        assert (native.adamw() is not None) == fused
        call_kernel(node, ins, outs)
    return [o.copy() for o in outs]


@pytest.mark.parametrize("numel", [1, 13, 4099, optimizer.CHUNK + 77])
@pytest.mark.parametrize("mode,wd", [(0, 0.0), (0, 0.01), (1, 0.0), (1, 0.01)])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "separate-outputs"])
def test_the_fused_adamw_is_bitwise_the_numpy_one(numel, mode, wd, in_place):
    fused = _adamw_update(numel, mode, wd, 3, in_place, fused=True)
    plain = _adamw_update(numel, mode, wd, 3, in_place, fused=False)
    for a, b in zip(fused, plain):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("step", [1, 2, 5000])
@pytest.mark.parametrize("correct_bias", [1, 0])
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("path", ["bound", "plain"])
def test_the_fused_loops_bias_corrections_are_the_numpy_paths(monkeypatch, step, correct_bias, mode, path):
    """The loop makes the step's bias corrections itself (pow in double, cast to float, as ORT):
    the numpy path's bits at the first step, a later one and far on, bound or plain."""
    import tests.kernel_harness as harness

    monkeypatch.setattr(harness, "KERNEL_PATH", path)
    fused = _adamw_update(4099, mode, 0.01, step, False, fused=True, correct_bias=correct_bias)
    plain = _adamw_update(4099, mode, 0.01, step, False, fused=False, correct_bias=correct_bias)
    for a, b in zip(fused, plain):
        np.testing.assert_array_equal(a, b)


def test_a_large_parameter_runs_in_ranges_on_the_gemm_pool(monkeypatch):
    """From 2 x POOLED_MIN_ELEMS elements at 2 threads, a parameter's update is one GEMM-pool job
    of two ranges (claimed without the interpreter lock): the same bits as one range."""
    from onnxplan.kernels import gemm_calls

    if gemm_calls.pool() is None:
        pytest.skip("no GEMM pool (no ILP64 OpenBLAS)")
    numel = 2 * gemm_calls.POOLED_MIN_ELEMS + 5
    jobs: list[tuple[int, int]] = []
    pool_run = gemm_calls.GemmPool.run

    def counting(self, table, workers, kind=gemm_calls.SGEMM, fn=None, **kw):
        jobs.append((kind, len(table)))
        return pool_run(self, table, workers, kind, fn, **kw)

    before = threads.current().threads
    try:
        threads.use_threads(1)
        one = _adamw_update(numel, 0, 0.01, 4, False, fused=True)
        assert jobs == []
        threads.use_threads(2)
        monkeypatch.setattr(gemm_calls.GemmPool, "run", counting)
        two = _adamw_update(numel, 0, 0.01, 4, False, fused=True)
    finally:
        threads.use_threads(before)
    assert jobs == [(gemm_calls.ADAMW, 2)]
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_the_fused_adamw_split_across_threads_is_the_whole(monkeypatch):
    """Three parts of one parameter on three threads: the same bits as one part."""
    monkeypatch.setattr(parallel, "MIN_ELEMS", 1 << 12)
    before = threads.current().threads
    try:
        threads.use_threads(1)
        one = _adamw_update(50_001, 1, 0.01, 2, True, fused=True)
        threads.use_threads(3)
        assert len(optimizer._fused_parts([np.zeros(50_001, np.float32)] * 7, np)) == 3
        three = _adamw_update(50_001, 1, 0.01, 2, True, fused=True)
    finally:
        threads.use_threads(before)
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)


def test_not_float32_or_not_contiguous_takes_the_numpy_path():
    f32 = np.zeros(10, np.float32)
    assert optimizer._fused_parts([f32] * 7, np) is not None
    assert optimizer._fused_parts([np.zeros(10, np.float64)] * 7, np) is None
    assert optimizer._fused_parts([np.zeros(20, np.float32)[::2]] + [f32] * 6, np) is None


def test_no_compiler_means_the_numpy_path(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_compiler", lambda: None)
    assert native.adamw() is None
    monkeypatch.setattr(native, "_compiler", lambda: str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(native, "library_path", lambda cc: tmp_path / "lib.so")
    assert native.adamw() is None  # the compile fails: numpy, no error


def test_the_library_is_kept_per_cpu_and_flags(monkeypatch):
    cc = native._compiler()
    assert cc is not None
    here = native.library_path(cc)
    monkeypatch.setattr(native, "_cpu_key", lambda: "another cpu")
    assert native.library_path(cc) != here


def test_a_loops_lookup_reads_and_hashes_nothing_again(monkeypatch):
    """Kernels look their loops up at each call (col2im for every ConvGrad): after the first
    lookup, no PATH search, no read of /proc/cpuinfo, no hash of the source (each was ~0.1 ms)."""
    assert native.adamw() is not None
    calls = []
    monkeypatch.setattr(native.hashlib, "sha256", lambda *a: calls.append("hash"))
    monkeypatch.setattr(native.shutil, "which", lambda *a, **k: calls.append("which"))
    monkeypatch.setattr("builtins.open", lambda *a, **k: calls.append("open"))
    for _ in range(3):
        assert native.adamw() is not None and native.col2im_add() is not None and native.im2col() is not None
    assert calls == []
