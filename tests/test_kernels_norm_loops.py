"""LayerNormalization, SimplifiedLayerNormalization and their gradients by the fused C loops
(onnxplan.kernels.native.layer_norm, kernels/norm_loops.py): the forward bit for bit as the
numpy path and ONNX Runtime, the gradient's dscale and dbias bit for bit as the numpy path and
dX within the kernel tests' tolerances of it and of ORT; the same bits at 1 and 2 threads (rows
and columns cut across them), in chunks, in place, with outputs omitted; the loops seen to run,
and what they do not take left to the numpy path."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan import settings, threads
from onnxplan.kernels import native, parallel, scratch
from tests.kernel_harness import MS, assert_sums_close, count_loop_calls, ort_run, randn, run_kernel

pytestmark = pytest.mark.skipif(native.layer_norm() is None, reason="no C compiler: the numpy path only")

F = np.float32
LN, RMS = "LayerNormalization", "SimplifiedLayerNormalization"
# (shape, axis): transformer b16's rows; rows not a multiple of the loops' eight; a row with an
# eight-lane tail; the normalized axes more than one; one row
SHAPES = [((16, 64, 128), -1), ((13, 40), -1), ((3, 5, 2011), -1), ((3, 5, 4, 6), 2), ((1, 24), 1)]


@pytest.fixture
def loops(monkeypatch):
    """Counts of the loops' calls ({"fwd": n, "grad_cols": n, "grad_rows": n}) while the test runs."""
    return count_loop_calls(monkeypatch, "layer_norm", ("fwd", "grad_cols", "grad_rows"))


def _numpy(*args, **kwargs) -> list:
    with settings.override(native_kernels=False):
        assert native.layer_norm() is None
        return run_kernel(*args, **kwargs)


def _specs(shape, axis):
    axis %= len(shape)
    stat = shape[:axis] + (1,) * (len(shape) - axis)
    return shape[axis:], [("float32", shape), ("float32", stat), ("float32", stat)]


def _forward_case(shape, axis, simplified, bias, seed):
    rng = np.random.default_rng(seed)
    norm_shape, outs = _specs(shape, axis)
    inputs = [randn(rng, *shape, scale=2.0, shift=0.3), randn(rng, *norm_shape)]
    inputs += [randn(rng, *norm_shape)] if bias and not simplified else []
    return inputs, (outs[::2] if simplified else outs), {"axis": axis, "epsilon": 1e-5}


@pytest.mark.parametrize("simplified, bias", [(False, True), (False, False), (True, False)], ids=["ln", "ln-no-bias", "rms"])
@pytest.mark.parametrize("shape, axis", SHAPES)
def test_forward_is_the_numpy_path_and_ort_bit_for_bit(shape, axis, simplified, bias, n_threads, loops):
    op = RMS if simplified else LN
    inputs, outs, attrs = _forward_case(shape, axis, simplified, bias, seed=len(shape) + shape[-1])
    got = run_kernel(op, inputs, outs, attrs)
    assert loops["fwd"] >= 1
    assert loops["fwd"] == 1 or n_threads == 2
    for g, want, ort in zip(got, _numpy(op, inputs, outs, attrs), ort_run(op, inputs, outs, attrs)):
        np.testing.assert_array_equal(g, want)
        np.testing.assert_array_equal(g, ort)


def test_forward_in_place_and_without_statistics(loops):
    inputs, outs, attrs = _forward_case((13, 40), -1, False, True, seed=7)
    want = _numpy(LN, inputs, outs, attrs)
    (y, mean, inv) = run_kernel(LN, inputs, outs, attrs, alias=(0, 0))
    for g, w in zip((y, mean, inv), want):
        np.testing.assert_array_equal(g, w)
    (y_only, *_) = run_kernel(LN, inputs, [outs[0], None, None], attrs)
    np.testing.assert_array_equal(y_only, want[0])
    assert loops["fwd"] == 2


def _grad_case(shape, axis, simplified, seed):
    rng = np.random.default_rng(seed)
    norm_shape, outs = _specs(shape, axis)
    x, scale = randn(rng, *shape, scale=2.0, shift=0.3), randn(rng, *norm_shape)
    attrs = {"axis": axis, "epsilon": 1e-5}
    if simplified:
        _, inv = ort_run(RMS, [x, scale], outs[::2], attrs)
        inputs = [randn(rng, *shape), x, scale, inv]
        grads = [("float32", shape), ("float32", norm_shape)]
    else:
        _, mean, inv = ort_run(LN, [x, scale, randn(rng, *norm_shape)], outs, attrs)
        inputs = [randn(rng, *shape), x, scale, mean, inv]
        grads = [("float32", shape), ("float32", norm_shape), ("float32", norm_shape)]
    return inputs, grads, attrs


def _assert_grad(got, numpy_path, ort):
    """dX near the numpy path's and ORT's (its row means summed in another order); dscale and
    dbias the numpy path's bits."""
    assert_sums_close(got[0], numpy_path[0])
    assert_sums_close(got[0], ort[0])
    for g, w, o in zip(got[1:], numpy_path[1:], ort[1:]):
        np.testing.assert_array_equal(g, w)
        assert_sums_close(g, o)


@pytest.mark.parametrize("simplified", [False, True], ids=["ln", "rms"])
@pytest.mark.parametrize("shape, axis", SHAPES)
def test_gradient_near_ort_and_dscale_dbias_the_numpy_bits(shape, axis, simplified, n_threads, loops):
    op = ("Simplified" if simplified else "") + "LayerNormalizationGrad"
    inputs, grads, attrs = _grad_case(shape, axis, simplified, seed=11 + shape[-1])
    got = run_kernel(op, inputs, grads, attrs, MS)
    assert loops["grad_cols"] >= 1 and loops["grad_rows"] >= 1
    _assert_grad(got, _numpy(op, inputs, grads, attrs, MS), ort_run(op, inputs, grads, attrs, MS))


def test_gradient_bits_do_not_depend_on_the_thread_count(monkeypatch):
    inputs, grads, attrs = _grad_case((16, 64, 128), -1, False, seed=3)
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    before = threads.current().threads
    try:
        runs = []
        for n in (1, 2):
            threads.use_threads(n)
            runs.append(run_kernel("LayerNormalizationGrad", inputs, grads, attrs, MS))
    finally:
        threads.use_threads(before)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_gradient_in_chunks_in_place_and_with_omitted_outputs(monkeypatch, loops):
    """A scratch target of 256 bytes: chunks of a few rows, dscale and dbias summed chunk by chunk
    through the partial sums (the numpy path's order); dX written over dY; outputs left out."""
    monkeypatch.setattr(scratch, "SCRATCH_TARGET", 256)
    op = "LayerNormalizationGrad"
    inputs, grads, attrs = _grad_case((5, 7, 16), -1, False, seed=4)
    want, ort = _numpy(op, inputs, grads, attrs, MS), ort_run(op, inputs, grads, attrs, MS)
    _assert_grad(run_kernel(op, inputs, grads, attrs, MS), want, ort)
    assert loops["grad_cols"] == 9  # 35 rows in chunks of 4
    _assert_grad(run_kernel(op, inputs, grads, attrs, MS, alias=(0, 0)), want, ort)
    for keep in ([1, 0, 0], [0, 1, 1], [0, 0, 1], [0, 1, 0]):
        outs = [g if k else None for g, k in zip(grads, keep)]
        got = run_kernel(op, inputs, outs, attrs, MS)
        for i, k in enumerate(keep):
            if k and i == 0:
                assert_sums_close(got[0], want[0])
            elif k:
                np.testing.assert_array_equal(got[i], want[i])


def test_what_the_loops_do_not_take_stays_on_numpy(loops):
    """float64 tensors: the numpy path (ORT's bits), no loop called."""
    inputs, outs, attrs = _forward_case((6, 16), -1, False, True, seed=5)
    inputs = [a.astype(np.float64) for a in inputs]
    outs = [("float64", s) for _, s in outs]
    got = run_kernel(LN, inputs, outs, attrs)
    for g, w in zip(got, _numpy(LN, inputs, outs, attrs)):
        np.testing.assert_array_equal(g, w)
    assert loops == {"fwd": 0, "grad_cols": 0, "grad_rows": 0}
