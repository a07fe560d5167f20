"""Convolution and pooling kernels against the ONNX reference evaluator and ONNX Runtime."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from onnxplan import settings
from onnxplan.ir import windows
from onnxplan.kernels import conv as conv_module
from onnxplan.kernels import conv_grad, conv_grad_dx, conv_layout, conv_taps, im2col, scratch
from onnxplan.kernels.pool import _empty_outputs, pool_window
from tests.kernel_harness import (
    MS,
    arena_run,
    assert_sums_close,
    ort_run,
    peak_bytes,
    randn,
    ref_run,
    run_kernel,
)


@pytest.fixture
def small_chunks(monkeypatch):
    """A tiny scratch target, so small tensors take the multi-chunk (and row-band) paths."""
    monkeypatch.setattr(scratch, "SCRATCH_TARGET", 2048)


CONV_CASES = [
    # x shape, w shape, attrs
    ((2, 3, 9, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 9, 8), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 9, 9), (5, 3, 1, 1), {"strides": [2, 2]}),
    ((2, 4, 7, 7), (6, 4, 1, 1), {}),  # pointwise: no im2col
    ((2, 2, 9, 10), (3, 2, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 0, 2]}),
    ((3, 4, 8, 8), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((2, 3, 11), (4, 3, 3), {"strides": [2], "pads": [1, 2]}),
    ((1, 2, 5, 6, 4), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 1]}),
    ((2, 3, 9, 8), (4, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((2, 3, 9, 8), (4, 3, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 1]}),
    ((2, 3, 9, 8), (4, 3, 3, 2), {"auto_pad": "VALID"}),
    # depthwise (group == C_in), with a channel multiplier, dilations, asymmetric pads, strides
    ((2, 6, 9, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    ((2, 4, 9, 8), (8, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [0, 1, 2, 1]}),
    ((2, 4, 10, 9), (4, 1, 5, 3), {"group": 4, "dilations": [2, 3], "pads": [4, 3, 1, 2]}),
    ((2, 6, 7, 7), (6, 2, 3, 3), {"group": 3, "strides": [2, 1], "pads": [1, 0, 1, 2]}),
    ((2, 6, 7, 7), (6, 1, 1, 1), {"group": 6}),  # depthwise pointwise
]


def _conv_out_shape(x_shape, w_shape, attrs, with_bias=False):
    rng = np.random.default_rng(0)
    inputs = [randn(rng, *x_shape), randn(rng, *w_shape)]
    return ref_run("Conv", inputs, [("float32", None)], attrs)[0].shape


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES)
def test_conv_matches_reference_and_ort(x_shape, w_shape, attrs, bias):
    rng = np.random.default_rng(1)
    inputs = [randn(rng, *x_shape), randn(rng, *w_shape)] + ([randn(rng, w_shape[0])] if bias else [])
    (expected,) = ref_run("Conv", inputs, [("float32", None)], attrs)
    (got,) = run_kernel("Conv", inputs, [("float32", expected.shape)], attrs)
    assert_sums_close(got, expected)
    (runtime,) = ort_run("Conv", inputs, [("float32", expected.shape)], attrs)
    assert_sums_close(got, runtime)


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES[:6])
def test_conv_in_chunks_and_row_bands(small_chunks, x_shape, w_shape, attrs):
    rng = np.random.default_rng(2)
    inputs = [randn(rng, *x_shape), randn(rng, *w_shape), randn(rng, w_shape[0])]
    (expected,) = ort_run("Conv", inputs, [("float32", None)], attrs)
    (got,) = run_kernel("Conv", inputs, [("float32", expected.shape)], attrs)
    assert_sums_close(got, expected)


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES[:6])
def test_conv_gemm_per_image_into_y(monkeypatch, x_shape, w_shape, attrs):
    """Chunks of several images with long rows take one GEMM per image straight into Y."""
    monkeypatch.setattr(conv_module, "DIRECT_LENGTH", 1)
    rng = np.random.default_rng(14)
    inputs = [randn(rng, *x_shape), randn(rng, *w_shape), randn(rng, w_shape[0])]
    (expected,) = ort_run("Conv", inputs, [("float32", None)], attrs)
    (got,) = run_kernel("Conv", inputs, [("float32", expected.shape)], attrs)
    assert_sums_close(got, expected)


def test_chunking_takes_several_images_or_bands_of_one():
    many = conv_layout.layout((64, 64, 4, 4), (64, 64, 3, 3), (4, 4), 1, 4, True, True)
    assert many.nb > 1 and many.band == 4 and many.rows >= 0
    banded = conv_layout.layout((8, 64, 224, 224), (64, 64, 3, 3), (224, 224), 1, 4, True, True)
    assert banded.nb == 1 and 1 <= banded.band < 224 and banded.rows == -1 and banded.acc > 0
    assert banded.nbytes <= scratch.SCRATCH_TARGET + 64 * 576 * 4 + 128


def _conv_grad_outputs(x_shape, w_shape, y_shape, which):
    specs = [("float32", x_shape), ("float32", w_shape), ("float32", (w_shape[0],))]
    return [s if w else None for s, w in zip(specs, which)]


def _conv_grad_matches_ort(inputs, attrs) -> None:
    """ConvGrad(dY, X, W) -> dX, dW, dB: ours against ORT's, every output."""
    dy, x, w = inputs
    outs = _conv_grad_outputs(x.shape, w.shape, dy.shape, (1, 1, 1))
    for g, e in zip(run_kernel("ConvGrad", inputs, outs, attrs, MS), ort_run("ConvGrad", inputs, outs, attrs, MS)):
        assert_sums_close(g, e)


@pytest.mark.parametrize("which", [(1, 1, 1), (1, 1, 0), (0, 1, 1), (0, 1, 0), (1, 0, 0)])
@pytest.mark.parametrize("x_shape,w_shape,attrs", [c for c in CONV_CASES if "auto_pad" not in c[2]])
def test_conv_grad_matches_ort(x_shape, w_shape, attrs, which):
    rng = np.random.default_rng(3)
    y_shape = _conv_out_shape(x_shape, w_shape, attrs)
    inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
    outs = _conv_grad_outputs(x_shape, w_shape, y_shape, which)
    expected = ort_run("ConvGrad", inputs, outs, attrs, MS)
    got = [g for g in run_kernel("ConvGrad", inputs, outs, attrs, MS) if g is not None]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_sums_close(g, e)


@pytest.mark.parametrize("x_shape,w_shape,attrs", CONV_CASES[:6])
def test_conv_grad_in_chunks_and_row_bands(small_chunks, x_shape, w_shape, attrs):
    rng = np.random.default_rng(4)
    y_shape = _conv_out_shape(x_shape, w_shape, attrs)
    inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
    outs = _conv_grad_outputs(x_shape, w_shape, y_shape, (1, 1, 1))
    expected = ort_run("ConvGrad", inputs, outs, attrs, MS)
    for g, e in zip(run_kernel("ConvGrad", inputs, outs, attrs, MS), expected):
        assert_sums_close(g, e)


@pytest.mark.parametrize("block", [conv_grad.DW_BLOCK, 64])
def test_stem_conv_grad_dw_in_blocks_matches_ort(monkeypatch, block):
    """A 3-channel stem's dW (3 x 27 outputs over a long reduction) is summed in blocks of
    positions through the partial-sum scratch (chunks of 2 images: 4608 positions): it agrees
    with ORT."""
    monkeypatch.setattr(conv_grad, "DW_BLOCK", block)
    monkeypatch.setattr(scratch, "SCRATCH_TARGET", 1 << 20)
    rng = np.random.default_rng(6)
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    x_shape, w_shape = (4, 3, 96, 96), (3, 3, 3, 3)
    y_shape = _conv_out_shape(x_shape, w_shape, attrs)
    lay = conv_layout.layout(x_shape, w_shape, y_shape[2:], 1, 4, True, True, None)
    span = lay.nb * (lay.band * y_shape[3])
    assert lay.acc >= 0 and len(conv_grad._dw_blocks(81, span, True)) > 1, (lay, span)
    _conv_grad_matches_ort([randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)], attrs)


FLIP_CASES = [  # dense, unit strides: dX as Conv(dY, W flipped); pads asymmetric, dilated, 1-D/3-D
    # (more input than output channels: the flipped conv's columns are then the smaller scratch)
    ((2, 6, 9, 8), (2, 6, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 6, 9, 10), (3, 6, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 0, 2]}),
    ((3, 8, 7, 6), (3, 8, 2, 3), {"pads": [0, 2, 1, 0]}),
    ((2, 6, 11), (2, 6, 3), {"pads": [1, 2]}),
    ((1, 6, 5, 6, 4), (2, 6, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 1]}),
    ((2, 8, 6, 6), (2, 8, 1, 3), {"pads": [0, 1, 0, 1]}),  # 1x3
]


@pytest.mark.parametrize("chunks", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", FLIP_CASES)
def test_conv_grad_dx_as_flipped_conv(monkeypatch, x_shape, w_shape, attrs, chunks):
    """A large dense conv with unit strides takes dX as a Conv of dY (FlipDx): against ORT, in
    whole images and in chunks and row bands of a tiny scratch target."""
    monkeypatch.setattr(conv_layout, "SMALL_DX", 0)
    if chunks:  # 1 KiB: one image per chunk, most in bands of rows
        monkeypatch.setattr(scratch, "SCRATCH_TARGET", 1024)
    rng = np.random.default_rng(12)
    y_shape = _conv_out_shape(x_shape, w_shape, attrs)
    win = conv_layout.conv_window(attrs, x_shape, w_shape, y_shape)
    assert conv_grad_dx.flip_dx(x_shape, w_shape, y_shape, win, 1, 4) is not None
    inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
    for which in [(1, 1, 1), (1, 0, 0)]:
        outs = _conv_grad_outputs(x_shape, w_shape, y_shape, which)
        expected = ort_run("ConvGrad", inputs, outs, attrs, MS)
        got = [g for g in run_kernel("ConvGrad", inputs, outs, attrs, MS) if g is not None]
        for g, e in zip(got, expected):
            assert_sums_close(g, e)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((64, 128, 8, 8), (256, 128, 3, 3), {"pads": [1, 1, 1, 1]}),  # vgg16's: FlipDx for dX with dW or alone
    ((64, 64, 32, 32), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # FlipDx
    ((4, 16, 32, 32), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # dense strided: col2im
    ((8, 32, 24, 24), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]}),  # depthwise, tap by tap
    ((2, 8, 9, 8), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # small: the dX-as-conv plan
])
def test_conv_grad_outputs_do_not_depend_on_which_are_computed(x_shape, w_shape, attrs):
    """dX and dW of a ConvGrad computing both equal, bit for bit, those of a dX-only and a
    dW-only node (what passes.split_grad makes of it): a split plan replays the fused one
    exactly. Fails if a path is chosen by the set of outputs (FlipDx once was: dX-only nodes
    took col2im, and vgg16's split swap plans stopped matching the plain run)."""
    rng = np.random.default_rng(5)
    y_shape = _conv_out_shape(x_shape, w_shape, attrs)
    inputs = [randn(rng, *y_shape), randn(rng, *x_shape), randn(rng, *w_shape)]
    fused = run_kernel("ConvGrad", inputs, _conv_grad_outputs(x_shape, w_shape, y_shape, (1, 1, 0)), attrs, MS)
    dx_only = run_kernel("ConvGrad", inputs, _conv_grad_outputs(x_shape, w_shape, y_shape, (1, 0, 0)), attrs, MS)
    dw_only = run_kernel("ConvGrad", inputs, _conv_grad_outputs(x_shape, w_shape, y_shape, (0, 1, 0)), attrs, MS)
    np.testing.assert_array_equal(dx_only[0], fused[0])
    np.testing.assert_array_equal(next(g for g in dw_only if g is not None), fused[1])


def test_flipped_conv_dx_declines_pads_beyond_the_kernel():
    """A pad wider than the kernel's reach would give the flipped conv a negative pad: col2im."""
    win = windows.window({"pads": [3, 0, 0, 0]}, (5, 5), (9, 3), (3, 3))
    assert conv_grad_dx.flip_dx((1, 2, 5, 5), (2, 2, 3, 3), (1, 2, 9, 3), win, 1, 4) is None


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((2, 3, 120, 90), (6, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1], "strides": [1, 2]}),  # row bands
    ((5, 7, 6, 5), (7, 1, 3, 3), {"group": 7, "pads": [1, 0, 1, 2]}),  # several images per chunk
    ((5, 7, 6, 5), (7, 1, 3, 3), {"group": 7, "strides": [2, 2], "pads": [1, 0, 1, 2]}),
])
def test_depthwise_in_chunks(small_chunks, x_shape, w_shape, attrs):
    rng = np.random.default_rng(8)
    x, w = randn(rng, *x_shape), randn(rng, *w_shape)
    (y,) = ort_run("Conv", [x, w], [("float32", None)], attrs)
    assert_sums_close(run_kernel("Conv", [x, w], [y], attrs)[0], y)
    _conv_grad_matches_ort([randn(rng, *y.shape), x, w], attrs)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((2, 32, 24, 24), (32, 1, 7, 7), {"group": 32, "pads": [3, 3, 3, 3]}),  # convnext: the first tap writes
    ((2, 32, 49, 49), (32, 1, 3, 3), {"group": 32, "strides": [2, 2]}),  # mobilenet's padded-before stride 2
    ((4, 32, 60, 38), (32, 1, 5, 5), {"group": 32, "strides": [2, 3], "dilations": [1, 2],
                                      "pads": [2, 1, 2, 2]}),  # phases of unequal lengths
    ((8, 672, 6, 6), (672, 1, 5, 5), {"group": 672, "pads": [2, 2, 2, 2]}),  # short rows: channels-last
    ((8, 576, 7, 7), (576, 1, 3, 3), {"group": 576, "strides": [2, 2], "pads": [1, 0, 1, 1]}),
])
@pytest.mark.parametrize("torch_on", [True, False])
def test_depthwise_by_taps_at_size(monkeypatch, x_shape, w_shape, attrs, torch_on):
    """Depthwise convs large enough for the tap-by-tap path (default thresholds): Conv with and
    without a bias, and ConvGrad's dX, dW, dB, against ORT; on torch views (or channels-last copies
    for short rows) and in numpy."""
    settings.use(replace(settings.current(), torch_kernels=torch_on))
    rng = np.random.default_rng(11)
    x, w, b = randn(rng, *x_shape), randn(rng, *w_shape), randn(rng, w_shape[0])
    (y,) = ort_run("Conv", [x, w, b], [("float32", None)], attrs)
    short = y.shape[-1] < conv_taps.TAPS_MIN_WIDTH  # channels-last taps: torch only
    assert conv_taps.by_taps(x.shape, w.shape, y.shape, attrs["group"]) == (torch_on or not short)
    assert_sums_close(run_kernel("Conv", [x, w, b], [y], attrs)[0], y)
    (y0,) = ort_run("Conv", [x, w], [("float32", None)], attrs)
    assert_sums_close(run_kernel("Conv", [x, w], [y0], attrs)[0], y0)
    _conv_grad_matches_ort([randn(rng, *y.shape), x, w], attrs)


def _random_conv(seed: int):
    """A random conv: 1-3 spatial axes, group 1, 2 or depthwise (with or without a channel
    multiplier), kernel 1-4, strides 1-3, dilations 1-2, explicit pads or any auto_pad."""
    rng = np.random.default_rng(seed)
    sp = int(rng.choice([1, 2, 2, 2, 3]))
    kind = rng.choice(["dense", "grouped", "depthwise", "multiplier"])
    group = {"dense": 1, "grouped": 2}.get(kind, int(rng.integers(2, 9)))
    cg = int(rng.integers(1, 4)) if kind in ("dense", "grouped") else 1
    mg = int(rng.integers(1, 4)) if kind in ("dense", "grouped") else (2 if kind == "multiplier" else 1)
    kernel = [int(rng.integers(1, 5 if sp < 3 else 3)) for _ in range(sp)]
    dilations = [int(rng.integers(1, 3)) for _ in range(sp)]
    attrs = {"group": group, "kernel_shape": kernel, "strides": [int(rng.integers(1, 4)) for _ in range(sp)],
             "dilations": dilations}
    auto_pad = rng.choice(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    if auto_pad == "NOTSET":
        attrs["pads"] = [int(rng.integers(0, k)) if k > 1 else 0 for k in kernel] * 2
        attrs["pads"][sp:] = [int(rng.integers(0, k)) if k > 1 else 0 for k in kernel]
    else:
        attrs["auto_pad"] = str(auto_pad)
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    spatial = [int(rng.integers(r, r + (6 if sp < 3 else 3))) for r in reach]
    x_shape = (int(rng.integers(1, 4)), group * cg, *spatial)
    w_shape = (group * mg, cg, *kernel)
    return x_shape, w_shape, attrs


def _generic_path(monkeypatch):
    """The batched-GEMM path alone (im2col, one GEMM per chunk, col2im): no channels-last
    depthwise kernels and no dX computed as a conv."""
    monkeypatch.setattr(conv_layout, "depthwise", lambda *a: False)
    monkeypatch.setattr(conv_grad_dx, "dx_plan", lambda *a: None)
    monkeypatch.setattr(conv_grad_dx, "flip_dx", lambda *a: None)
    conv_layout.layout_for.cache_clear()


@pytest.mark.parametrize("mode", ["whole", "chunks", "taps", "by_taps", "by_taps_chunks", "by_taps_numpy",
                                  "by_taps_last", "by_taps_last_chunks"])
@pytest.mark.parametrize("seed", range(24))
def test_random_convs_match_ort_and_the_generic_path(monkeypatch, seed, mode):
    """Random shapes and attributes: Conv against the reference evaluator, ConvGrad (explicit
    pads) against ORT, every output; then both against the generic GEMM path. Modes: whole images,
    chunks of a 2 KiB scratch target, a dense conv's large-conv path (im2col tap by tap, dX as
    the conv of dY with the flipped kernel for unit strides, else col2im), and a depthwise conv's
    tap-by-tap path at every size (torch views; with dW in chunks of images; numpy, in chunks; on
    channels-last copies, whole and in chunks)."""
    if mode in ("chunks", "by_taps_chunks", "by_taps_numpy", "by_taps_last_chunks"):
        monkeypatch.setattr(scratch, "SCRATCH_TARGET", 2048)
    if mode == "taps":
        monkeypatch.setattr(conv_layout, "SMALL_DX", 0)
    if mode.startswith("by_taps"):
        monkeypatch.setattr(conv_taps, "TAPS_MIN_ELEMS", 0)
        monkeypatch.setattr(conv_taps, "TAPS_MIN_WIDTH", 1 << 30 if "last" in mode else 0)
    if mode == "by_taps_numpy":
        settings.use(replace(settings.current(), torch_kernels=False))
    x_shape, w_shape, attrs = _random_conv(seed)
    rng = np.random.default_rng(1000 + seed)
    x, w, b = randn(rng, *x_shape), randn(rng, *w_shape), randn(rng, w_shape[0])
    (expected,) = ref_run("Conv", [x, w, b], [("float32", None)], attrs)
    (got,) = run_kernel("Conv", [x, w, b], [("float32", expected.shape)], attrs)
    assert_sums_close(got, expected)  # (ORT 1.19's Conv is off on some strided 3-D depthwise cases)
    (no_bias,) = ref_run("Conv", [x, w], [("float32", None)], attrs)
    assert_sums_close(run_kernel("Conv", [x, w], [("float32", expected.shape)], attrs)[0], no_bias)
    grad_attrs = dict(attrs)
    if "auto_pad" in grad_attrs:  # ORT's ConvGrad takes explicit pads: the window's own
        win = conv_layout.conv_window(attrs, x_shape, w_shape, expected.shape)
        del grad_attrs["auto_pad"]
        grad_attrs["pads"] = [*win.pads_begin, *win.pads_end]
    inputs = [randn(rng, *expected.shape), x, w]
    outs = _conv_grad_outputs(x_shape, w_shape, expected.shape, (1, 1, 1))
    grads = run_kernel("ConvGrad", inputs, outs, grad_attrs, MS)
    for g, e in zip(grads, ort_run("ConvGrad", inputs, outs, grad_attrs, MS)):
        assert_sums_close(g, e)
    dx_only = run_kernel("ConvGrad", inputs, [outs[0], None, None], grad_attrs, MS)[0]
    _generic_path(monkeypatch)
    try:
        assert_sums_close(got, run_kernel("Conv", [x, w, b], [("float32", expected.shape)], attrs)[0])
        for g, e in zip(grads, run_kernel("ConvGrad", inputs, outs, grad_attrs, MS)):
            assert_sums_close(g, e)
        assert_sums_close(dx_only, grads[0])
    finally:
        conv_layout.layout_for.cache_clear()


@pytest.mark.parametrize("op", ["Conv", "ConvGrad"])
def test_conv_allocates_well_under_its_output(op):
    """Columns live in the declared scratch; BLAS writes straight into the output views.

    What remains is numpy's ufunc iterator buffers for strided operands (3 x 8192 elements,
    96 KiB for float32, whatever the tensor size), against outputs of 1.2 MiB and more.
    """
    rng = np.random.default_rng(5)
    x, w = randn(rng, 16, 32, 24, 24), randn(rng, 48, 32, 3, 3)
    attrs = {"pads": [1, 1, 1, 1]}
    y_shape = (16, 48, 24, 24)
    if op == "Conv":
        inputs, outs = [x, w, randn(rng, 48)], [("float32", y_shape)]
    else:
        inputs, outs = [randn(rng, *y_shape), x, w], _conv_grad_outputs(x.shape, w.shape, y_shape, (1, 1, 1))
    run, outputs = arena_run(op, inputs, outs, attrs, "" if op == "Conv" else MS)
    peak = peak_bytes(run)
    biggest = max(o.nbytes for o in outputs)
    assert peak < 128 * 1024 and peak < biggest // 8, (peak, biggest)
    expected = ort_run(op, inputs, outs, attrs, "" if op == "Conv" else MS)
    for g, e in zip(outputs, expected):
        assert_sums_close(g, e)


@pytest.mark.parametrize("op", ["Conv", "ConvGrad"])
def test_depthwise_allocates_well_under_its_output(op):
    """A depthwise conv's block products live in its declared scratch."""
    rng = np.random.default_rng(9)
    x, w = randn(rng, 8, 32, 40, 40), randn(rng, 64, 1, 3, 3)
    attrs = {"pads": [1, 1, 1, 1], "group": 32}
    y_shape = (8, 64, 40, 40)
    if op == "Conv":
        inputs, outs = [x, w, randn(rng, 64)], [("float32", y_shape)]
    else:
        inputs, outs = [randn(rng, *y_shape), x, w], _conv_grad_outputs(x.shape, w.shape, y_shape, (1, 1, 1))
    run, outputs = arena_run(op, inputs, outs, attrs, "" if op == "Conv" else MS)
    peak = peak_bytes(run)
    assert peak < 128 * 1024, peak
    for g, e in zip(outputs, ort_run(op, inputs, outs, attrs, "" if op == "Conv" else MS)):
        assert_sums_close(g, e)


# ---- pooling -------------------------------------------------------------------------------

POOL_CASES = [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 1, 1]},  # MLAS's generic path (stride 3)
    {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [3], "strides": [2], "pads": [1, 1]},
    {"kernel_shape": [2, 2, 2], "strides": [1, 2, 2], "pads": [0, 1, 0, 0, 1, 1]},
]
MAXPOOL_ONLY = [
    {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "storage_order": 1},
    {"kernel_shape": [2, 2], "strides": [1, 1], "dilations": [2, 2]},
    {"kernel_shape": [2, 2, 2], "strides": [1, 2, 2], "storage_order": 1},
    {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 1, 1], "ceil_mode": 1},  # a window in the padding
]


def _pool_input(rng, attrs):
    x = randn(rng, *(2, 3, 7, 8, 5)[:2 + len(attrs["kernel_shape"])])
    x.reshape(-1)[1:3] = x.reshape(-1)[0]  # ties: the first maximum wins
    return x


@pytest.mark.parametrize("attrs", POOL_CASES + MAXPOOL_ONLY)
def test_maxpool_values_and_indices_match_ort_exactly(attrs):
    rng = np.random.default_rng(6)
    x = _pool_input(rng, attrs)
    y, ind = ort_run("MaxPool", [x], [("float32", None), ("int64", None)], attrs)
    got_y, got_ind = run_kernel("MaxPool", [x], [("float32", y.shape), ("int64", y.shape)], attrs)
    np.testing.assert_array_equal(got_y, y)
    np.testing.assert_array_equal(got_ind, ind)
    (single,) = run_kernel("MaxPool", [x], [("float32", y.shape)], attrs)
    np.testing.assert_array_equal(single, y)


@pytest.mark.parametrize("attrs", [a for a in POOL_CASES + MAXPOOL_ONLY
                                   if not a.get("ceil_mode") and not a.get("storage_order")])
def test_maxpool_matches_reference(attrs):
    """(The reference evaluator's column-major Indices differ from ORT's; those are checked above.)"""
    rng = np.random.default_rng(7)
    x = _pool_input(rng, attrs)
    y, ind = ref_run("MaxPool", [x], [("float32", None), ("int64", None)], attrs)
    got_y, got_ind = run_kernel("MaxPool", [x], [("float32", y.shape), ("int64", y.shape)], attrs)
    np.testing.assert_array_equal(got_y, y)
    np.testing.assert_array_equal(got_ind, ind)


def test_maxpool_in_chunks(small_chunks):
    rng = np.random.default_rng(8)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    x = randn(rng, 6, 4, 9, 9)
    y, ind = ort_run("MaxPool", [x], [("float32", None), ("int64", None)], attrs)
    got_y, got_ind = run_kernel("MaxPool", [x], [("float32", y.shape), ("int64", y.shape)], attrs)
    np.testing.assert_array_equal(got_y, y)
    np.testing.assert_array_equal(got_ind, ind)


@pytest.mark.parametrize("attrs", POOL_CASES + MAXPOOL_ONLY)
def test_maxpool_grad_matches_ort(attrs):
    rng = np.random.default_rng(9)
    x = _pool_input(rng, attrs)
    y, ind = ort_run("MaxPool", [x], [("float32", None), ("int64", None)], attrs)
    if any(_empty_outputs(pool_window(attrs, x.shape, y.shape))):
        pytest.skip("ORT's MaxPoolGrad writes out of bounds at a window wholly in the padding")
    dy = randn(rng, *y.shape)
    (expected,) = ort_run("MaxPoolGrad", [dy, ind], [("float32", x.shape)], attrs)
    (got,) = run_kernel("MaxPoolGrad", [dy, ind], [("float32", x.shape)], attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)  # overlapping windows add


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("attrs", POOL_CASES + [{"kernel_shape": [7, 8], "strides": [1, 1]}])
def test_average_pool_matches_ort_exactly(attrs, count_include_pad):
    """Summed in the order of the MLAS routine ORT picks, so equal to the last bit."""
    rng = np.random.default_rng(10)
    attrs = dict(attrs, count_include_pad=count_include_pad)
    x = _pool_input(rng, attrs)
    (expected,) = ort_run("AveragePool", [x], [("float32", None)], attrs)
    (got,) = run_kernel("AveragePool", [x], [("float32", expected.shape)], attrs)
    np.testing.assert_array_equal(got, expected)


def test_average_pool_with_a_kernel_far_larger_than_its_input():
    """EfficientNet's pooler: AvgPool2d(1280, ceil_mode=True) over a 2x3 map. Of its 1280 x 1280
    taps six reach the input; the kernels visit only those (the others cost 0.3 s per call)."""
    rng = np.random.default_rng(16)
    attrs = {"kernel_shape": [1280, 1280], "strides": [1280, 1280], "ceil_mode": 1}
    x = randn(rng, 2, 3, 2, 3)
    win = pool_window(attrs, x.shape, (2, 3, 1, 1))
    assert len(win.live_taps()) == 6
    (expected,) = ort_run("AveragePool", [x], [("float32", None)], attrs)
    (got,) = run_kernel("AveragePool", [x], [("float32", expected.shape)], attrs)
    np.testing.assert_array_equal(got, expected)
    dy = randn(rng, *expected.shape)
    (expected_dx,) = ort_run("AveragePoolGrad", [dy], [("float32", x.shape)], attrs)
    (got_dx,) = run_kernel("AveragePoolGrad", [dy], [("float32", x.shape)], attrs)
    np.testing.assert_array_equal(got_dx, expected_dx)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("attrs", [a for a in POOL_CASES if not a.get("ceil_mode")])
def test_average_pool_matches_reference(attrs, count_include_pad):
    rng = np.random.default_rng(11)
    attrs = dict(attrs, count_include_pad=count_include_pad)
    x = _pool_input(rng, attrs)
    (expected,) = ref_run("AveragePool", [x], [("float32", None)], attrs)
    (got,) = run_kernel("AveragePool", [x], [("float32", expected.shape)], attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("attrs", [a for a in POOL_CASES if not a.get("ceil_mode") and len(a["kernel_shape"]) < 3])
def test_average_pool_grad_matches_ort_exactly(attrs, count_include_pad):
    """1-D and 2-D: ORT's 3-D AveragePoolGrad assigns instead of accumulating."""
    rng = np.random.default_rng(12)
    attrs = dict(attrs, count_include_pad=count_include_pad)
    x = _pool_input(rng, attrs)
    y_shape = ort_run("AveragePool", [x], [("float32", None)], attrs)[0].shape
    dy = randn(rng, *y_shape)
    (expected,) = ort_run("AveragePoolGrad", [dy], [("float32", x.shape)], attrs)
    (got,) = run_kernel("AveragePoolGrad", [dy], [("float32", x.shape)], attrs)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape", [(2, 3, 7, 8), (2, 3, 1, 3), (4, 5, 9), (2, 3, 4, 3, 5), (2, 3, 16, 16)])
def test_global_pools_match_ort(shape):
    """Up to 67 values per channel the sums follow MLAS's four-lane order bit for bit; longer
    rows are summed pairwise (a few ulps off, far faster than emulating the lanes)."""
    rng = np.random.default_rng(13)
    x = randn(rng, *shape)
    exact = int(np.prod(shape[2:])) < 68
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        (expected,) = ort_run(op, [x], [("float32", None)])
        (got,) = run_kernel(op, [x], [("float32", expected.shape)])
        if exact or op == "GlobalMaxPool":
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        if x.ndim == 4:  # the reference evaluator drops axes of other ranks
            (reference,) = ref_run(op, [x], [("float32", None)])
            np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("attrs", [{"kernel_shape": [2, 2], "strides": [2, 2]},
                                   {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]},
                                   {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}])
def test_lp_pool_matches_ort(p, attrs):
    from tests.kernel_harness import check

    rng = np.random.default_rng(14)
    x = randn(rng, 2, 3, 7, 6)
    check("LpPool", [x], {**attrs, "p": p}, rtol=1e-5, atol=1e-5, against=("ort",))
    check("GlobalLpPool", [x], {"p": p}, rtol=1e-5, atol=1e-5, against=("ort",))  # no reference


def _brute_im2col(x, win):
    """col[c, i, j, n, oh, ow] = x[n, c, oh - ph + i * dh, ow - pw + j * dw], 0 outside: loops."""
    nb, c = x.shape[:2]
    (kh, kw), (dh, dw), (ph, pw) = win.kernel, win.dilations, win.pads_begin
    col = np.zeros((c, kh, kw, nb, *win.out_dims), x.dtype)
    for i, j, oh, ow in itertools.product(range(kh), range(kw), *map(range, win.out_dims)):
        ih, iw = oh - ph + i * dh, ow - pw + j * dw
        if 0 <= ih < x.shape[2] and 0 <= iw < x.shape[3]:
            col[:, i, j, :, oh, ow] = x[:, :, ih, iw].T
    return col


@pytest.mark.parametrize("x_shape,kernel,attrs", [
    ((2, 3, 9, 8), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 9, 8), (3, 3), {"pads": [2, 1, 0, 1]}),
    ((2, 3, 9, 8), (2, 3), {"pads": [0, 2, 1, 0]}),
    ((1, 2, 7, 9), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((2, 4, 5, 6), (3, 2), {"pads": [1, 0, 1, 1]}),
    ((2, 4, 5, 6), (1, 3), {"pads": [0, 1, 0, 1]}),
])
def test_im2col_by_rows_matches_brute_force(x_shape, kernel, attrs):
    """Unit strides, rows as wide as the input's: each tap one run of a row-padded copy (the
    wrapped columns zeroed), whole images and bands of rows, against a loop over every column."""
    rng = np.random.default_rng(13)
    x = randn(rng, *x_shape)
    pads, dil = attrs["pads"], attrs.get("dilations", [1, 1])
    out = tuple(i + pads[a] + pads[a + 2] - (k - 1) * d for a, (i, k, d) in enumerate(zip(x_shape[2:], kernel, dil)))
    win = windows.window(attrs, x_shape[2:], out, kernel)
    assert im2col.by_rows(win)
    expected = _brute_im2col(x, win)
    for b0, b1 in [(0, out[0]), (0, 2), (1, 3), (out[0] - 2, out[0])]:
        sub = win.band(b0, b1)
        col = np.full((x_shape[1], *kernel, x_shape[0], *sub.out_dims), np.nan, np.float32)
        src = np.full(x_shape[0] * x_shape[1] * math.prod(windows.extent(sub)), np.nan, np.float32)
        im2col.im2col(np, sub, x, col, src if windows.reads_padding(sub) else None)
        np.testing.assert_array_equal(col, expected[..., b0:b1, :])


# ---- a plan made with torch's kernels on runs with them off ----------------------------------------
def _depthwise_step(n: int, c: int, side: int):
    """x -> depthwise 3x3 Conv -> sum of squares, its ConvGrad (dW) and an SGD update: short rows
    (side < TAPS_MIN_WIDTH) with enough outputs that the Conv runs tap by tap only with torch on."""
    from onnxplan.ir.graph import ValueClass
    from tests.graphs import GraphBuilder

    b = GraphBuilder("depthwise")
    b.value("x", (n, c, side, side), ValueClass.INPUT)
    b.value("W", (c, 1, 3, 3), ValueClass.PARAMETER, trainable=True)
    attrs = {"group": c, "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    b.node("Conv", ["x", "W"], ["y"], **attrs)
    b.node("ReduceSumSquare", ["y"], ["loss"], [()], keepdims=0)
    b.g.outputs.append("loss")
    b.g.loss = "loss"
    b.const("two", np.array([2.0], np.float32))
    b.node("Scale", ["y", "two"], ["dy"], domain=MS, phase="backward", vclass=ValueClass.TEMPORARY)
    b.node("ConvGrad", ["dy", "x", "W"], ["", "dW"], [None, (c, 1, 3, 3)], domain=MS, phase="backward",
           vclass=ValueClass.GRADIENT, **attrs)
    b.value("W.updated", (c, 1, 3, 3), ValueClass.PARAMETER, trainable=True)
    b.value("lr", (1,), ValueClass.INPUT)
    b.node("SGDOptimizerV2", ["lr", "W", "dW"], ["flag", "W.updated"], [(1,), (c, 1, 3, 3)], domain=MS,
           phase="optimizer", vclass=ValueClass.TEMPORARY, num_params=1)
    from onnxplan.ir.tensor import TensorSpec

    b.g.values["flag"].spec = TensorSpec("bool", (1,))
    b.g.outputs.append("W.updated")
    b.g.optimizer = {"type": "SGD", "params": ["W"], "grads": ["dW"]}
    return b.g


@pytest.mark.parametrize("plan_torch", [True, False])
def test_depthwise_plan_runs_with_torch_kernels_switched(monkeypatch, plan_torch):
    """ONNXPLAN_TORCH_KERNELS decides whether a short-row depthwise conv runs tap by tap (its scratch
    is the taps layout) or by columns (more scratch); it is read by the process that runs the plan,
    which need not be the one that made it. The declared scratch covers both paths: a plan made
    with torch on (off) runs with it off (on) inside its arena, checked, and its first loss is the
    reference evaluator's."""
    from onnxplan.executor.runner import Executor
    from onnxplan.planning import PlanOptions, plan_step

    rng = np.random.default_rng(41)
    shape, w_shape = (64, 32, 6, 6), (32, 1, 3, 3)
    assert conv_taps.by_taps(shape, w_shape, shape, 32, True)
    assert not conv_taps.by_taps(shape, w_shape, shape, 32, False)
    w, x = randn(rng, *w_shape, scale=0.3), randn(rng, *shape)
    settings.use(replace(settings.current(), torch_kernels=plan_torch))
    res = plan_step(_depthwise_step(*shape[:3]), PlanOptions("given", "best-fit"))
    settings.use(replace(settings.current(), torch_kernels=not plan_torch))
    ex = Executor(res.graph, res.plan, check_arena=True)
    ex.load_state({"W": w})
    losses = [ex.step({"x": x, "lr": np.array([1e-6], np.float32)}) for _ in range(2)]
    (y,) = ref_run("Conv", [x, w], 1, {"group": 32, "pads": [1, 1, 1, 1], "kernel_shape": [3, 3]})
    np.testing.assert_allclose(losses[0], np.sum(y.astype(np.float64) ** 2), rtol=1e-5)
    assert losses[1] < losses[0]
