"""Resize (nearest and linear, every coordinate transformation and nearest mode, scales or sizes)
against ONNX Runtime and the reference evaluator; unsupported attributes refused by the shape rule."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import ShapeInferenceError
from onnxplan.ir.shapes import infer_shapes
from onnxplan.ir.tensor import TensorSpec
from tests.kernel_harness import assert_close, ort_run, rand, ref_run, run_kernel

TRANSFORMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"]
SHAPES = [  # (input, scales or None, sizes or None)
    ((1, 2, 4, 5), [1, 1, 2.0, 1.5], None),
    ((2, 1, 6, 7), [1, 1, 0.5, 0.7], None),
    ((1, 2, 4, 5), None, [1, 2, 7, 3]),
    ((1, 1, 3, 4, 5), [1, 1, 2, 1, 0.6], None),
]


def _inputs(shape, scales, sizes):
    x = rand(*shape)
    return [x, None, np.array(scales, np.float32) if scales else None] + \
        ([np.array(sizes, np.int64)] if sizes else [])


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("shape,scales,sizes", SHAPES)
@pytest.mark.parametrize("mode,nearest", [("linear", None), ("nearest", "round_prefer_floor"),
                                          ("nearest", "round_prefer_ceil"), ("nearest", "floor"),
                                          ("nearest", "ceil")])
def test_resize_matches_ort(mode, nearest, transform, shape, scales, sizes):
    if mode == "linear" and transform == "tf_half_pixel_for_nn":
        pytest.skip("ORT refuses tf_half_pixel_for_nn outside nearest")
    attrs = {"mode": mode, "coordinate_transformation_mode": transform}
    if nearest:
        attrs["nearest_mode"] = nearest
    inputs = _inputs(shape, scales, sizes)
    want = ort_run("Resize", inputs, 1, attrs)
    assert_close(run_kernel("Resize", inputs, want, attrs), want, rtol=1e-5, atol=1e-5)
    node = Node("r", "Resize", "", ["x", "", "", "sizes"] if sizes else ["x", "", "scales"], ["y"], attrs)
    consts = {"sizes": inputs[3]} if sizes else {"scales": inputs[2]}
    specs, _ = infer_shapes([node], {"x": TensorSpec("float32", shape)}, consts, {"": 17})
    assert specs["y"].shape == want[0].shape


def test_resize_matches_reference():
    inputs = _inputs((1, 2, 4, 5), [1, 1, 2.0, 1.5], None)
    for attrs in ({"mode": "nearest"}, {"mode": "linear"}, {"mode": "linear", "coordinate_transformation_mode": "asymmetric"}):
        want = ref_run("Resize", inputs, 1, attrs)
        assert_close(run_kernel("Resize", inputs, want, attrs), want, rtol=1e-5, atol=1e-5)


def test_resize_in_slabs():
    inputs = _inputs((16, 8, 20, 20), [1, 1, 2.0, 2.0], None)
    want = ort_run("Resize", inputs, 1, {"mode": "linear"})
    assert_close(run_kernel("Resize", inputs, want, {"mode": "linear"}), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs,match", [
    ({"mode": "cubic"}, "mode 'cubic'"), ({"antialias": 1, "mode": "linear"}, "antialias"),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"}, "tf_crop_and_resize"),
    ({"keep_aspect_ratio_policy": "not_larger"}, "keep_aspect_ratio_policy"),
])
def test_unsupported_resize_is_refused_at_plan_time(attrs, match):
    node = Node("r", "Resize", "", ["x", "", "scales"], ["y"], attrs)
    with pytest.raises(ShapeInferenceError, match=match):
        infer_shapes([node], {"x": TensorSpec("float32", (1, 1, 4, 4))},
                     {"scales": np.array([1, 1, 2, 2], np.float32)}, {"": 17})


@pytest.mark.parametrize("mode,transform,torch_mode,align", [
    ("linear", "half_pixel", "bilinear", False), ("linear", "align_corners", "bilinear", True),
    ("nearest", "asymmetric", "nearest", None),
])
@pytest.mark.parametrize("shape,scale", [((2, 3, 5, 6), 2.0), ((1, 2, 8, 9), 0.5), ((2, 1, 4, 5), 1.5)])
def test_resize_grad_matches_torch_autograd(mode, transform, torch_mode, align, shape, scale):
    """ORT has ResizeGrad on CUDA only: torch's interpolate gradient is the reference."""
    import torch

    from tests.kernel_harness import MS, assert_sums_close

    x = rand(*shape)
    attrs = {"mode": mode, "coordinate_transformation_mode": transform}
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    scales = np.array([1, 1, scale, scale], np.float32)
    (y,) = ort_run("Resize", [x, None, scales], 1, attrs)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.interpolate(tx, scale_factor=scale, mode=torch_mode, align_corners=align,
                                         recompute_scale_factor=False)
    assert_sums_close(ty.detach().numpy(), y)  # the same forward
    dy = rand(*y.shape)
    ty.backward(torch.tensor(dy))
    exact = all(float(d * scale).is_integer() for d in shape[2:])  # else the sizes do not give the scale
    for ins in ([dy, x, None, scales], [dy, x]) if exact else ([dy, x, None, scales],):
        (got,) = run_kernel("ResizeGrad", ins, [("float32", x.shape)], attrs, MS)
        assert_sums_close(got, tx.grad.numpy())
