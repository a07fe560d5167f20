"""Strided convs with few output channels by the fused loops (kernels/conv_small.py): Conv and
ConvGrad against ONNX Runtime (and the reference evaluator), the same bits at any thread count
and any band, inside the declared scratch, and the rule that picks them."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan import settings
from onnxplan.ir.windows import window
from onnxplan.kernels import conv_small, native, parallel, scratch
from onnxplan.threads import use_threads
from tests.kernel_harness import (
    MS,
    assert_conv_grad_like_ort,
    assert_sums_close,
    ort_run,
    randn,
    ref_run,
    run_kernel,
)

pytestmark = pytest.mark.skipif(native.small_conv() is None, reason="no C compiler: the fused loops are not built")

CASES = [
    # x shape, w shape, attrs: stride 2 (nnt-conv2d's stem, small), 3, asymmetric pads, dilated,
    # 1x1 strided, outputs narrower than a vector (and rows not a multiple of 8), one and eight
    # output channels, a kernel wider than its padded input's remainder
    ((2, 3, 17, 19), (3, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((3, 2, 20, 23), (8, 2, 3, 3), {"strides": [3, 2], "pads": [0, 2, 1, 0]}),
    ((2, 3, 21, 18), (1, 3, 3, 5), {"strides": [2, 3], "pads": [2, 1, 2, 2], "dilations": [2, 1]}),
    ((2, 4, 15, 15), (5, 4, 1, 1), {"strides": [2, 2]}),
    ((2, 3, 9, 7), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 1, 40, 40), (2, 1, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((2, 3, 12, 13), (6, 3, 2, 2), {"strides": [2, 2], "pads": [0, 0, 1, 1]}),
]


def _out_shape(x_shape, w_shape, attrs):
    strides = attrs.get("strides", [1, 1])
    dil = attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    dims = [(x_shape[2 + a] + pads[a] + pads[a + 2] - dil[a] * (w_shape[2 + a] - 1) - 1) // strides[a] + 1
            for a in range(2)]
    return (x_shape[0], w_shape[0], *dims)


def _takes_the_fused_loops(x_shape, w_shape, attrs) -> bool:
    y_shape = _out_shape(x_shape, w_shape, attrs)
    x, w, y = (np.zeros(s, np.float32) for s in (x_shape, w_shape, y_shape))
    return conv_small.by_small(x, w, y, 1, window(attrs, x_shape[2:], y_shape[2:], w_shape[2:]))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_conv_matches_ort_and_the_reference(x_shape, w_shape, attrs, bias):
    assert _takes_the_fused_loops(x_shape, w_shape, attrs)
    rng = np.random.default_rng(11)
    inputs = [randn(rng, *x_shape), randn(rng, *w_shape)] + ([randn(rng, w_shape[0])] if bias else [])
    y_shape = _out_shape(x_shape, w_shape, attrs)
    got = run_kernel("Conv", inputs, [("float32", y_shape)], attrs)[0]
    assert_sums_close(got, ort_run("Conv", inputs, 1, attrs)[0])
    assert_sums_close(got, ref_run("Conv", inputs, 1, attrs)[0])


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_conv_grad_matches_ort(x_shape, w_shape, attrs):
    """dW by the fused loops; dX (when wanted) and dB as before: every output against ORT's."""
    rng = np.random.default_rng(12)
    y_shape = _out_shape(x_shape, w_shape, attrs)
    inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
    assert_conv_grad_like_ort(inputs, x_shape, w_shape, attrs, ((1, 1, 1), (0, 1, 1), (0, 1, 0)))


def _both(inputs, attrs, y_shape, w_shape):
    y = run_kernel("Conv", inputs[1:], [("float32", y_shape)], attrs)[0]
    dw = run_kernel("ConvGrad", inputs, [None, ("float32", w_shape), None], attrs, MS)[1]
    return y, dw


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES[:3] + CASES[5:6])
def test_the_same_bits_at_any_thread_count_and_scratch(monkeypatch, x_shape, w_shape, attrs):
    """Split into parts (images for Y, taps for dW) at 2 and 3 threads, or run in a smaller
    column scratch (bands of fewer rows for Y): the bits of one thread's whole run. The parts
    really split (counted)."""
    rng = np.random.default_rng(13)
    y_shape = _out_shape(x_shape, w_shape, attrs)
    inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    use_threads(1)
    want = _both(inputs, attrs, y_shape, w_shape)
    for threads in (2, 3):
        use_threads(threads)
        before = parallel.splits
        got = _both(inputs, attrs, y_shape, w_shape)
        assert parallel.splits > before
        for g, e in zip(got, want):
            np.testing.assert_array_equal(g, e)
    use_threads(1)
    monkeypatch.setattr(scratch, "SCRATCH_TARGET", 256)  # the layout's floor: one output row's columns
    got_y = _both(inputs, attrs, y_shape, w_shape)[0]
    np.testing.assert_array_equal(got_y, want[0])


def test_dw_bits_follow_the_band_not_the_threads(monkeypatch):
    """dW's sums are per band (a fixed number of rows): another band sums in another order and
    may round differently, but still agrees with ORT; so the band must not follow the thread
    count (the test above) and does follow BAND_POSITIONS."""
    rng = np.random.default_rng(14)
    x_shape, w_shape, attrs = (4, 3, 64, 64), (3, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    y_shape = _out_shape(x_shape, w_shape, attrs)
    inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
    outs = [None, ("float32", w_shape), None]
    expected = ort_run("ConvGrad", inputs, outs, attrs, MS)[0]
    for positions in (32, 256, 4096):
        monkeypatch.setattr(conv_small, "BAND_POSITIONS", positions)
        assert_sums_close(run_kernel("ConvGrad", inputs, outs, attrs, MS)[1], expected)


@pytest.mark.parametrize("x_shape,w_shape,attrs,group", [
    ((2, 3, 16, 16), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, 1),  # unit strides: BLAS's runs a tap
    ((2, 3, 16, 16), (9, 3, 3, 3), {"strides": [2, 2]}, 1),  # more than SMALL_M outputs
    ((2, 4, 16, 16), (4, 2, 3, 3), {"strides": [2, 2]}, 2),  # grouped
    ((2, 3, 16), (4, 3, 3), {"strides": [2]}, 1),  # 1-D
])
def test_the_rule_leaves_other_convs_to_the_blas_path(x_shape, w_shape, attrs, group):
    attrs = {**attrs, "group": group}
    sp = len(x_shape) - 2
    strides = attrs.get("strides", [1] * sp)
    y_shape = (x_shape[0], w_shape[0], *[(x_shape[2 + a] + sum(attrs.get("pads", [0] * 2 * sp)[a::sp])
                                           - w_shape[2 + a]) // strides[a] + 1 for a in range(sp)])
    x, w, y = (np.zeros(s, np.float32) for s in (x_shape, w_shape, y_shape))
    assert not conv_small.by_small(x, w, y, group, window(attrs, x_shape[2:], y_shape[2:], w_shape[2:]))


def test_native_kernels_off_takes_the_blas_path(monkeypatch):
    x_shape, w_shape, attrs = CASES[0]
    assert _takes_the_fused_loops(x_shape, w_shape, attrs)
    monkeypatch.setenv("ONNXPLAN_NATIVE_KERNELS", "0")
    settings.reload()
    try:
        assert not _takes_the_fused_loops(x_shape, w_shape, attrs)
        rng = np.random.default_rng(15)
        inputs = [randn(rng, *x_shape), randn(rng, *w_shape)]
        y_shape = _out_shape(x_shape, w_shape, attrs)
        assert_sums_close(run_kernel("Conv", inputs, [("float32", y_shape)], attrs)[0],
                          ort_run("Conv", inputs, 1, attrs)[0])
    finally:
        monkeypatch.delenv("ONNXPLAN_NATIVE_KERNELS")
        settings.reload()
