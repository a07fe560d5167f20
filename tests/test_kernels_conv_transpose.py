"""ConvTranspose against ONNX Runtime and the reference evaluator; ConvTransposeGrad (which ONNX Runtime
has on CUDA only) against torch autograd of the same transposed convolution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onnxplan.ir.windows import transpose_pads
from tests.kernel_harness import MS, assert_sums_close, ort_run, randn, ref_run, run_kernel

CASES = [
    # x shape, w shape (C_in, C_out / group, *k), attrs
    ((2, 3, 4, 5), (3, 2, 3, 3), {}),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 4, 5), (3, 2, 3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}),
    ((2, 4, 5, 5), (4, 3, 3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 4, 5, 4), (4, 1, 3, 3), {"group": 4, "dilations": [2, 1], "pads": [2, 1, 0, 1]}),  # depthwise
    ((2, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((2, 3, 4, 5), (3, 2, 2, 2), {"strides": [3, 2], "auto_pad": "VALID"}),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [10, 10]}),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [8, 9], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 7), (3, 4, 3), {"strides": [2], "pads": [1, 2], "dilations": [2]}),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [1, 2, 2], "pads": [0, 1, 0, 1, 0, 1]}),
]


def _inputs(rng, x_shape, w_shape, bias):
    c_out = w_shape[1]
    return [randn(rng, *x_shape), randn(rng, *w_shape)] + ([randn(rng, c_out)] if bias else [])


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_conv_transpose_matches_ort_and_reference(x_shape, w_shape, attrs, bias):
    rng = np.random.default_rng(5)
    inputs = _inputs(rng, x_shape, w_shape, bias and "group" not in attrs)
    (expected,) = ort_run("ConvTranspose", inputs, [("float32", None)], attrs)
    (got,) = run_kernel("ConvTranspose", inputs, [("float32", expected.shape)], attrs)
    assert_sums_close(got, expected)
    # the reference evaluator has no groups, and splits odd SAME / output_shape pads otherwise
    if "output_shape" not in attrs and "SAME" not in attrs.get("auto_pad", "") and "group" not in attrs:
        (reference,) = ref_run("ConvTranspose", inputs, [("float32", None)], attrs)
        assert_sums_close(got, reference)


def _torch_conv_transpose(x, w, attrs, y_dims):
    """Y of a ConvTranspose by torch: unpadded, zero-extended at the end, then cut at the pads."""
    n = x.ndim - 2
    strides = attrs.get("strides", [1] * n)
    dilations = attrs.get("dilations", [1] * n)
    fn = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d,
          3: torch.nn.functional.conv_transpose3d}[n]
    full = fn(x, w, stride=strides, dilation=dilations, groups=attrs.get("group", 1))
    begin, _ = transpose_pads(attrs, list(x.shape[2:]), list(w.shape[2:]))
    grow = []
    for a in reversed(range(n)):
        grow += [0, max(0, begin[a] + y_dims[a] - full.shape[2 + a])]
    full = torch.nn.functional.pad(full, grow)
    index = (slice(None), slice(None)) + tuple(slice(b, b + d) for b, d in zip(begin, y_dims))
    return full[index]


@pytest.mark.parametrize("which", [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1)])
@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_conv_transpose_grad_matches_torch_autograd(x_shape, w_shape, attrs, which):
    rng = np.random.default_rng(6)
    x, w = randn(rng, *x_shape), randn(rng, *w_shape)
    (y,) = ort_run("ConvTranspose", [x, w], [("float32", None)], attrs)
    dy = randn(rng, *y.shape)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = _torch_conv_transpose(tx, tw, attrs, list(y.shape[2:]))
    assert_sums_close(ty.detach().numpy(), y)  # the torch formulation is ORT's forward
    ty.backward(torch.tensor(dy))
    want = [tx.grad.numpy(), tw.grad.numpy(), dy.sum(axis=tuple(a for a in range(dy.ndim) if a != 1))]
    outs = [("float32", e.shape) if keep else None for e, keep in zip(want, which)]
    got = run_kernel("ConvTransposeGrad", [dy, x, w], outs, attrs, MS)
    for g, e, keep in zip(got, want, which):
        if keep:
            assert_sums_close(g, e)


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES[:5])
def test_conv_transpose_and_grad_in_chunks(monkeypatch, x_shape, w_shape, attrs):
    """A tiny scratch target: the multi-chunk and row-band paths of the underlying (grad) convolutions."""
    from onnxplan.kernels import scratch

    monkeypatch.setattr(scratch, "SCRATCH_TARGET", 512)
    rng = np.random.default_rng(7)
    x, w = randn(rng, *x_shape), randn(rng, *w_shape)
    (y,) = ort_run("ConvTranspose", [x, w], [("float32", None)], attrs)
    assert_sums_close(run_kernel("ConvTranspose", [x, w], [y], attrs)[0], y)
    dy = randn(rng, *y.shape)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    _torch_conv_transpose(tx, tw, attrs, list(y.shape[2:])).backward(torch.tensor(dy))
    dx, dw, _ = run_kernel("ConvTransposeGrad", [dy, x, w], [tx.grad.numpy(), tw.grad.numpy(), None], attrs, MS)
    assert_sums_close(dx, tx.grad.numpy())
    assert_sums_close(dw, tw.grad.numpy())


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_conv_transpose_shape_rule_matches_ort(x_shape, w_shape, attrs):
    from onnxplan.ir.graph import Node
    from onnxplan.ir.shapes import infer_shapes
    from onnxplan.ir.tensor import TensorSpec

    rng = np.random.default_rng(10)
    x, w = randn(rng, *x_shape), randn(rng, *w_shape)
    (y,) = ort_run("ConvTranspose", [x, w], [("float32", None)], attrs)
    node = Node("t", "ConvTranspose", "", ["x", "w"], ["y"], attrs)
    known = {"x": TensorSpec("float32", x_shape), "w": TensorSpec("float32", w_shape)}
    specs, _ = infer_shapes([node], known, {}, {"": 17})
    assert specs["y"].shape == y.shape


def test_conv_transpose_memos_stay_bounded(monkeypatch):
    """A ConvTranspose runs as the Conv it is the adjoint of: the same node called again adds no
    memo entry (each call used to make a new Conv node, hence one more window entry per call), and
    ever new nodes keep each memo within NODE_MEMO_ENTRIES, oldest evicted first. Every call still
    matches the reference evaluator."""
    from onnxplan.kernels import conv_layout, conv_transpose
    from tests.kernel_harness import make_node

    rng = np.random.default_rng(31)
    x_shape, w_shape, attrs = CASES[1]
    x, w = randn(rng, *x_shape), randn(rng, *w_shape)
    (want,) = ref_run("ConvTranspose", [x, w], 1, attrs)
    monkeypatch.setattr(conv_layout, "WINDOWS", {})
    monkeypatch.setattr(conv_transpose, "_AS_CONV", {})
    node = make_node("ConvTranspose", [x, w], 1, attrs)
    for _ in range(5):
        (got,) = run_kernel("ConvTranspose", [x, w], [want], node=node)
        assert_sums_close(got, want)
    assert len(conv_layout.WINDOWS) == 1 and len(conv_transpose._AS_CONV) == 1
    monkeypatch.setattr(conv_layout, "NODE_MEMO_ENTRIES", 3)
    for _ in range(6):
        (got,) = run_kernel("ConvTranspose", [x, w], [want], node=make_node("ConvTranspose", [x, w], 1, attrs))
        assert_sums_close(got, want)
        assert len(conv_layout.WINDOWS) <= 3 and len(conv_transpose._AS_CONV) <= 3
    (got,) = run_kernel("ConvTranspose", [x, w], [want], node=node)  # evicted, made again
    assert_sums_close(got, want)
