"""BatchNormalization in training and BatchNormalizationGrad by the fused C loops
(onnxplan.kernels.native.batch_norm, kernels/batch_norm_loops.py): within the kernel tests'
tolerances of ONNX Runtime and of the numpy path; the same bits at 1 and 2 threads (channels cut
across them); running statistics updated in place, in place over X, with outputs omitted; the
loops seen to run, and what they do not take left to the numpy path."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan import settings
from onnxplan.kernels import native, parallel
from tests.kernel_harness import MS, assert_sums_close, count_loop_calls, ort_run, randn, run_kernel

pytestmark = pytest.mark.skipif(native.batch_norm() is None, reason="no C compiler: the numpy path only")

F = np.float32
# images x channels x positions: resnet18 b8's layer4 at 7 x 7; one position (a BatchNorm over
# (N, C)); runs with an eight-lane tail; one image; 3-D positions
SHAPES = [(8, 64, 7, 7), (16, 5), (4, 6, 13), (1, 3, 4, 9), (2, 3, 2, 3, 4)]
BN_ATTRS = {"epsilon": 1e-5, "momentum": 0.9}


@pytest.fixture
def loops(monkeypatch):
    """Counts of the loops' calls ({"fwd": n, "grad": n}) while the test runs."""
    return count_loop_calls(monkeypatch, "batch_norm", ("fwd", "grad"))


def _numpy(*args, **kwargs) -> list:
    with settings.override(native_kernels=False):
        assert native.batch_norm() is None
        return run_kernel(*args, **kwargs)


def _inputs(shape, seed):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = randn(rng, *shape, scale=1.5, shift=0.7)
    return [x, randn(rng, c), randn(rng, c), randn(rng, c), (rng.random(c) + 0.5).astype(F)], rng


def _outs(shape, saved=True):
    c = shape[1]
    return [("float32", shape)] + [("float32", (c,))] * (4 if saved else 2)


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_ort_and_the_numpy_path(shape, n_threads, loops):
    inputs, _ = _inputs(shape, seed=sum(shape))
    outs = _outs(shape)
    mine = [a.copy() for a in inputs]
    got = run_kernel("BatchNormInternal", mine, outs, BN_ATTRS, MS,
                     outputs=[np.full(shape, np.nan, F), mine[3], mine[4], np.full(shape[1], np.nan, F),
                              np.full(shape[1], np.nan, F)])
    assert loops["fwd"] >= 1 and (loops["fwd"] == 1 or n_threads == 2)
    assert got[1] is mine[3] and got[2] is mine[4]  # the running statistics written in place
    want = _numpy("BatchNormInternal", [a.copy() for a in inputs], outs, BN_ATTRS, MS)
    for g, w, o in zip(got, want, ort_run("BatchNormInternal", inputs, outs, BN_ATTRS, MS)):
        assert_sums_close(g, o)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)
    x = inputs[0].astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    np.testing.assert_allclose(got[3], x.mean(axis=axes), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[2], 0.9 * inputs[4] + 0.1 * x.var(axis=axes), rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_gradient_matches_ort_and_the_numpy_path(shape, n_threads, loops):
    inputs, rng = _inputs(shape, seed=3 * sum(shape))
    c = shape[1]
    saved = ort_run("BatchNormInternal", inputs, _outs(shape), BN_ATTRS, MS)
    grad_in = [randn(rng, *shape), inputs[0], inputs[1], saved[3], saved[4]]
    grads = [("float32", shape), ("float32", (c,)), ("float32", (c,))]
    got = run_kernel("BatchNormalizationGrad", grad_in, grads, {"epsilon": 1e-5}, MS)
    assert loops["grad"] >= 1 and (loops["grad"] == 1 or n_threads == 2)
    want = _numpy("BatchNormalizationGrad", grad_in, grads, {"epsilon": 1e-5}, MS)
    for g, w, o in zip(got, want, ort_run("BatchNormalizationGrad", grad_in, grads, {"epsilon": 1e-5}, MS)):
        assert_sums_close(g, o)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _split_everywhere(monkeypatch):
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)


def test_the_same_bits_at_one_and_two_threads(monkeypatch, loops):
    """Channels cut across two threads (17 channels: 8 + 9) give one thread's bits."""
    from onnxplan import threads

    shape = (6, 17, 5, 7)
    inputs, rng = _inputs(shape, seed=5)
    grad_in = [randn(rng, *shape), inputs[0], inputs[1], inputs[3], inputs[4]]
    grads = [("float32", shape), ("float32", (17,)), ("float32", (17,))]
    _split_everywhere(monkeypatch)
    runs = []
    before = threads.current().threads
    try:
        for n in (1, 2):
            threads.use_threads(n)
            calls = dict(loops)
            fwd = run_kernel("BatchNormInternal", [a.copy() for a in inputs], _outs(shape), BN_ATTRS, MS)
            grad = run_kernel("BatchNormalizationGrad", grad_in, grads, {"epsilon": 1e-5}, MS)
            runs.append((fwd, grad, loops["fwd"] - calls["fwd"], loops["grad"] - calls["grad"]))
    finally:
        threads.use_threads(before)
    assert runs[0][2:] == (1, 1) and runs[1][2:] == (2, 2)  # whole at one thread, in two parts at two
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        np.testing.assert_array_equal(a, b)


def test_in_place_over_x_and_without_saved_statistics(loops):
    shape = (4, 6, 13)
    inputs, _ = _inputs(shape, seed=11)
    want = ort_run("BatchNormalization", inputs, _outs(shape, saved=False), dict(BN_ATTRS, training_mode=1))
    x = inputs[0].copy()
    got = run_kernel("BatchNormalization", [x, *inputs[1:]], _outs(shape, saved=False),
                     dict(BN_ATTRS, training_mode=1), outputs=[x, inputs[3].copy(), inputs[4].copy()])
    assert loops["fwd"] == 1 and got[0] is x
    for g, w in zip(got, want):
        assert_sums_close(g, w)
    got = run_kernel("BatchNormInternal", inputs, _outs(shape, saved=False) + [None, None], BN_ATTRS, MS)
    assert loops["fwd"] == 2
    for g, w in zip(got, want):
        assert_sums_close(g, w)


def test_omitted_gradients(loops):
    shape = (8, 64, 7, 7)
    inputs, rng = _inputs(shape, seed=13)
    grad_in = [randn(rng, *shape), inputs[0], inputs[1], inputs[3], inputs[4]]
    grads = [("float32", shape), ("float32", (64,)), ("float32", (64,))]
    full = ort_run("BatchNormalizationGrad", grad_in, grads, {"epsilon": 1e-5}, MS)
    for keep in ((1, 2), (0,), (0, 2)):
        outs = [g if i in keep else None for i, g in enumerate(grads)]
        got = run_kernel("BatchNormalizationGrad", grad_in, outs, {"epsilon": 1e-5}, MS)
        for i in keep:
            assert_sums_close(got[i], full[i])
    assert loops["grad"] == 3


def test_a_wrong_loop_is_caught(monkeypatch):
    """The comparisons above fail when the loops compute something else: dbias off by one part in
    a thousand in one channel, or dX's last position of every run left unwritten."""
    from onnxplan.kernels import batch_norm_loops

    shape = (4, 6, 13)
    inputs, rng = _inputs(shape, seed=17)
    grad_in = [randn(rng, *shape), inputs[0], inputs[1], inputs[3], inputs[4]]
    grads = [("float32", shape), ("float32", (6,)), ("float32", (6,))]
    want = ort_run("BatchNormalizationGrad", grad_in, grads, {"epsilon": 1e-5}, MS)
    real = batch_norm_loops.batch_norm_grad_loops

    def off_bias(dy, x, scale, mean, inv_std, dx, dscale, dbias, dims):
        run = real(dy, x, scale, mean, inv_std, dx, dscale, dbias, dims)

        def wrong(ctx, ins, outs):
            run(ctx, ins, outs)
            dbias[2] *= np.float32(1.001)
        return wrong

    def stale_tail(dy, x, scale, mean, inv_std, dx, dscale, dbias, dims):
        run = real(dy, x, scale, mean, inv_std, dx, dscale, dbias, dims)

        def wrong(ctx, ins, outs):
            keep = dx.reshape(-1, dims[2])[:, -1].copy()
            run(ctx, ins, outs)
            dx.reshape(-1, dims[2])[:, -1] = keep
        return wrong

    for fault, index in ((off_bias, 2), (stale_tail, 0)):
        monkeypatch.setattr(batch_norm_loops, "batch_norm_grad_loops", fault)
        got = run_kernel("BatchNormalizationGrad", grad_in, grads, {"epsilon": 1e-5}, MS,
                         outputs=[np.full(shape, np.nan, F), np.zeros(6, F), np.zeros(6, F)])
        with pytest.raises(AssertionError):
            assert_sums_close(got[index], want[index])


def test_what_the_loops_do_not_take_runs_the_numpy_path(loops):
    """float64 BatchNorm: the numpy path (the loops are float32 only)."""
    shape = (4, 3, 5)
    inputs, _ = _inputs(shape, seed=19)
    inputs = [a.astype(np.float64) for a in inputs]
    outs = [("float64", shape)] + [("float64", (3,))] * 4
    got = run_kernel("BatchNormInternal", inputs, outs, BN_ATTRS, MS)
    assert loops["fwd"] == 0
    x = inputs[0]
    np.testing.assert_allclose(got[3], x.mean(axis=(0, 2)), rtol=1e-12)
