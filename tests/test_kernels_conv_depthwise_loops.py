"""Depthwise convs by the fused loops (kernels/conv_depthwise_loops.py): Conv and ConvGrad
against ONNX Runtime and the reference evaluator, the same bits at any thread count, the rule
that picks them, and the numpy paths when the loops are off."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan import settings
from onnxplan.ir.windows import window
from onnxplan.kernels import conv_depthwise_loops, native, parallel
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

pytestmark = pytest.mark.skipif(native.depthwise_conv() is None, reason="no C compiler: the fused loops are not built")

CASES = [
    # x shape, kernel, attrs: MobileNet's 3x3 (unit and stride 2, same pads), ConvNeXt's 7x7,
    # asymmetric pads, dilated, stride 3, a row narrower than a vector, wider kernels than the
    # padded input's remainder, a 1x1 (pointwise depthwise) strided, a 2x5 kernel
    ((2, 8, 17, 19), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 8, 17, 19), (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 4, 14, 14), (7, 7), {"pads": [3, 3, 3, 3]}),
    ((3, 5, 20, 23), (3, 3), {"strides": [2, 1], "pads": [0, 2, 1, 0]}),
    ((2, 3, 21, 18), (3, 5), {"strides": [2, 3], "pads": [2, 1, 2, 2], "dilations": [2, 1]}),
    ((2, 6, 9, 7), (3, 3), {"strides": [3, 3], "pads": [1, 1, 1, 1]}),
    ((1, 2, 5, 5), (5, 5), {"pads": [4, 4, 4, 4]}),
    ((2, 4, 15, 15), (1, 1), {"strides": [2, 2]}),
    ((2, 16, 40, 33), (2, 5), {"strides": [1, 2], "pads": [0, 2, 1, 2], "dilations": [3, 1]}),
]


@pytest.fixture(autouse=True)
def _narrow_rows_too(monkeypatch):
    """The loops on every case's rows, narrow ones too (the rule sends rows under MIN_WIDTH to the
    numpy path by default: test_narrow_rows_take_the_numpy_path)."""
    monkeypatch.setattr(conv_depthwise_loops, "MIN_WIDTH", 1)


def _out_shape(x_shape, kernel, attrs):
    strides, dil = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    dims = [(x_shape[2 + a] + pads[a] + pads[a + 2] - dil[a] * (kernel[a] - 1) - 1) // strides[a] + 1
            for a in range(2)]
    return (x_shape[0], x_shape[1], *dims)


def _case(x_shape, kernel, attrs):
    c = x_shape[1]
    return (c, 1, *kernel), {**attrs, "group": c}, _out_shape(x_shape, kernel, attrs)


def _takes_the_loops(x_shape, w_shape, attrs, y_shape) -> bool:
    x, w, y = (np.zeros(s, np.float32) for s in (x_shape, w_shape, y_shape))
    win = window(attrs, x_shape[2:], y_shape[2:], w_shape[2:])
    return conv_depthwise_loops.by_loops(win, attrs["group"], x, w, y)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape,kernel,attrs", CASES)
def test_conv_matches_ort_and_the_reference(x_shape, kernel, attrs, bias):
    w_shape, attrs, y_shape = _case(x_shape, kernel, attrs)
    assert _takes_the_loops(x_shape, w_shape, attrs, y_shape)
    rng = np.random.default_rng(21)
    inputs = [randn(rng, *x_shape), randn(rng, *w_shape)] + ([randn(rng, w_shape[0])] if bias else [])
    got = run_kernel("Conv", inputs, [("float32", y_shape)], attrs)[0]
    assert_sums_close(got, ort_run("Conv", inputs, 1, attrs)[0])
    assert_sums_close(got, ref_run("Conv", inputs, 1, attrs)[0])


@pytest.mark.parametrize("x_shape,kernel,attrs", CASES)
def test_conv_grad_matches_ort(x_shape, kernel, attrs):
    """dX, dW and dB, each alone and together, against ONNX Runtime's ConvGrad."""
    w_shape, attrs, y_shape = _case(x_shape, kernel, attrs)
    rng = np.random.default_rng(22)
    inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
    assert_conv_grad_like_ort(inputs, x_shape, w_shape, attrs, ((1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 1, 1)))


def _all(inputs, attrs, x_shape, y_shape, w_shape):
    y = run_kernel("Conv", inputs[1:], [("float32", y_shape)], attrs)[0]
    dx, dw = run_kernel("ConvGrad", inputs, [("float32", x_shape), ("float32", w_shape), None], attrs, MS)[:2]
    return y, dx, dw


@pytest.mark.parametrize("x_shape,kernel,attrs", [CASES[1], CASES[2], CASES[8]])
def test_the_same_bits_at_any_thread_count(monkeypatch, x_shape, kernel, attrs):
    """Y and dX split by planes, dW by channels at 2 and 3 threads: the bits of one thread's run
    (the parts really split: counted)."""
    w_shape, attrs, y_shape = _case(x_shape, kernel, attrs)
    rng = np.random.default_rng(23)
    inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    use_threads(1)
    want = _all(inputs, attrs, x_shape, y_shape, w_shape)
    try:
        for threads in (2, 3):
            use_threads(threads)
            before = parallel.splits
            got = _all(inputs, attrs, x_shape, y_shape, w_shape)
            assert parallel.splits >= before + 3
            for g, e in zip(got, want):
                np.testing.assert_array_equal(g, e)
    finally:
        use_threads(1)


@pytest.mark.parametrize("x_shape,w_shape,group", [
    ((2, 4, 16, 16), (4, 2, 3, 3), 2),  # grouped, two channels a group
    ((2, 4, 16, 16), (8, 1, 3, 3), 4),  # a channel multiplier of 2
    ((2, 4, 16), (4, 1, 3), 4),  # 1-D
    ((2, 4, 6, 6, 6), (4, 1, 3, 3, 3), 4),  # 3-D
])
def test_the_rule_leaves_other_convs_to_the_numpy_paths(x_shape, w_shape, group):
    sp = len(x_shape) - 2
    y_shape = (x_shape[0], w_shape[0], *[x_shape[2 + a] - w_shape[2 + a] + 1 for a in range(sp)])
    x, w, y = (np.zeros(s, np.float32) for s in (x_shape, w_shape, y_shape))
    win = window({"group": group}, x_shape[2:], y_shape[2:], w_shape[2:])
    assert not conv_depthwise_loops.by_loops(win, group, x, w, y)


def test_narrow_rows_take_the_numpy_path(monkeypatch):
    monkeypatch.setattr(conv_depthwise_loops, "MIN_WIDTH", 12)
    for width, loops in ((11, False), (12, True)):
        x_shape = (2, 8, 16, width)
        w_shape, attrs, y_shape = _case(x_shape, (3, 3), {"pads": [1, 1, 1, 1]})
        assert _takes_the_loops(x_shape, w_shape, attrs, y_shape) == loops


def test_the_rule_wants_float32_contiguous_arrays():
    x_shape, kernel, attrs = CASES[0]
    w_shape, attrs, y_shape = _case(x_shape, kernel, attrs)
    win = window(attrs, x_shape[2:], y_shape[2:], w_shape[2:])
    x, w, y = (np.zeros(s, np.float32) for s in (x_shape, w_shape, y_shape))
    assert conv_depthwise_loops.by_loops(win, attrs["group"], x, w, y)
    assert not conv_depthwise_loops.by_loops(win, attrs["group"], x.astype(np.float64), w, y)
    assert not conv_depthwise_loops.by_loops(win, attrs["group"], x, w, np.zeros(y_shape[::-1], np.float32).T)


def test_native_kernels_off_takes_the_numpy_paths(monkeypatch):
    x_shape, kernel, attrs = CASES[1]
    w_shape, attrs, y_shape = _case(x_shape, kernel, attrs)
    monkeypatch.setenv("ONNXPLAN_NATIVE_KERNELS", "0")
    settings.reload()
    try:
        assert not _takes_the_loops(x_shape, w_shape, attrs, y_shape)
        rng = np.random.default_rng(24)
        inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
        numpy_paths = _all(inputs, attrs, x_shape, y_shape, w_shape)
    finally:
        monkeypatch.delenv("ONNXPLAN_NATIVE_KERNELS")
        settings.reload()
    loops = _all(inputs, attrs, x_shape, y_shape, w_shape)
    for a, b in zip(loops, numpy_paths):
        assert_sums_close(a, b)
