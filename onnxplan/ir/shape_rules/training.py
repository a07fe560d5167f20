"""Shape rules for ONNX Runtime training ops: activation/softmax/norm/conv/pool/gather gradients, accumulators."""

from __future__ import annotations

import re

from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import hint_spec, producer_input_spec, shape_rule
from onnxplan.ir.shape_rules._common import (
    MS,
    attr,
    attr_ints,
    attr_str,
    const_ints,
    dtype_of_onnx,
    fail,
    has_input,
    need,
    outputs,
    register_same_as_input,
    required_ints,
    window_dims,
)
from onnxplan.ir.tensor import TensorSpec
from onnxplan.ir.windows import pool_out_dims, unit_stride_in_dims

__all__ = ["GRAD_LIKE_DY_OPS", "broadcast_gradient_axes"]

# (dY, X or Y, ...) -> dX with the spec of dY.
GRAD_LIKE_DY_OPS = (
    "ReluGrad SigmoidGrad TanhGrad GeluGrad FastGeluGrad QuickGeluGrad BiasGeluGrad_dX "
    "BiasFastGeluGrad_dX LeakyReluGrad SoftmaxGrad SoftmaxGrad_13 LogSoftmaxGrad LogSoftmaxGrad_13 "
    "DropoutGrad BitmaskDropoutGrad SoftmaxDropoutGrad FakeQuantGrad TrainableDropoutGrad "
    "InPlaceAccumulator ZeroGradient MegatronF MegatronG"
).split()
register_same_as_input(GRAD_LIKE_DY_OPS, MS)
register_same_as_input(("TrainableDropoutGrad",))  # registered in the ONNX domain by old builds


@shape_rule("InPlaceAccumulatorV2", MS)
def _accumulator_v2(node, specs, consts):
    """(updated_flag bool[1], optional accumulation_buffer_out like input 0)."""
    return outputs(node, TensorSpec("bool", (1,)), need(node, specs, 0))


@shape_rule("ConvGrad", MS)
@shape_rule("ConvGrad")
def _conv_grad(node, specs, consts):
    """(dY, X, W) -> (dX like X, dW like W, dB [M])."""
    x, w = need(node, specs, 1), need(node, specs, 2)
    return outputs(node, x, w, w.with_shape((w.shape[0],)))


@shape_rule("ConvGradInput", "onnxplan")
def _conv_grad_input(node, specs, consts):
    """(dY, W) -> dX of shape x_shape (the dX half of a split ConvGrad, passes/split_grad.py)."""
    dy = need(node, specs, 0)
    return outputs(node, dy.with_shape(tuple(required_ints(node, "x_shape"))))


@shape_rule("ResizeGrad", MS)
def _resize_grad(node, specs, consts):
    """(dY, X, roi, scales) -> dX like X (dY's dtype)."""
    return outputs(node, need(node, specs, 1).with_dtype(need(node, specs, 0).dtype))


@shape_rule("ConvTransposeGrad", MS)
def _conv_transpose_grad(node, specs, consts):
    """(dY, X, W) -> (dX like X, dW like W, dB [C_out = W[1] * group])."""
    x, w = need(node, specs, 1), need(node, specs, 2)
    return outputs(node, x, w, w.with_shape((w.shape[1] * int(attr(node, "group", 1)),)))


_GRAD_NAME = re.compile(r"^(?P<base>.+)_grad(_\d+)?$")


def _pool_grad_input(node: Node, dy: TensorSpec) -> TensorSpec:
    """The forward pooling input, which the gradient dX copies: ORT reads it from the graph."""
    hinted = hint_spec(node.outputs[0])
    if hinted is not None:
        return hinted.with_dtype(dy.dtype)
    match = _GRAD_NAME.match(node.outputs[0])
    candidate = hint_spec(match.group("base")) if match else None  # ORT names dX "<X>_grad[_k]"
    kernel = attr_ints(node, "kernel_shape")
    if candidate is not None and candidate.rank == dy.rank and kernel:
        dims = window_dims(pool_out_dims, node, candidate.shape[2:], kernel, bool(attr(node, "ceil_mode", 0)))
        if candidate.shape[:2] == dy.shape[:2] and tuple(dims) == dy.shape[2:]:
            return candidate.with_dtype(dy.dtype)
    strides = attr_ints(node, "strides", [1] * (dy.rank - 2))
    if kernel and all(s == 1 for s in strides) and attr_str(node, "auto_pad", "NOTSET") == "NOTSET":
        return dy.with_shape(dy.shape[:2] + tuple(unit_stride_in_dims(node.attrs, dy.shape[2:], kernel)))
    raise fail("cannot tell the forward input's shape (stride > 1 makes it ambiguous); "
                     "pass its spec as a hint (value_info)")


@shape_rule("MaxPoolGrad")
@shape_rule("MaxPoolGrad", MS)
def _max_pool_grad(node, specs, consts):
    """(dY, Indices) -> dX with the shape of the MaxPool input that produced Indices."""
    dy = need(node, specs, 0)
    if len(node.inputs) >= 3 and specs[1] is not None:  # (dY, X, Y) form
        return outputs(node, specs[1].with_dtype(dy.dtype))
    x = producer_input_spec(node.inputs[1], 0) if has_input(node, 1) else None
    return outputs(node, x.with_dtype(dy.dtype) if x is not None else _pool_grad_input(node, dy))


@shape_rule("AveragePoolGrad")
@shape_rule("AveragePoolGrad", MS)
def _average_pool_grad(node, specs, consts):
    """dY -> dX with the shape of the forward AveragePool's input."""
    return outputs(node, _pool_grad_input(node, need(node, specs, 0)))


@shape_rule("BatchNormalizationGrad", MS)
@shape_rule("LayerNormalizationGrad", MS)
@shape_rule("SimplifiedLayerNormalizationGrad", MS)
def _norm_grad(node, specs, consts):
    """(dY, X, scale, ...) -> (dX like X, dscale like scale, dbias like scale)."""
    x, scale = need(node, specs, 1), need(node, specs, 2)
    return outputs(node, x, scale, scale)


@shape_rule("InvertibleLayerNormalizationGrad", MS)
def _invertible_ln_grad(node, specs, consts):
    """(dY, Y, scale, bias, inv_std) -> (dX like Y, dscale, dbias)."""
    y, scale, bias = need(node, specs, 1), need(node, specs, 2), need(node, specs, 3)
    return outputs(node, y.with_dtype(need(node, specs, 0).dtype), scale, bias)


def _shape_from_input(node, consts, i, dtype) -> TensorSpec:
    return TensorSpec(dtype, tuple(const_ints(node, consts, i, "shape")))


@shape_rule("GatherGrad", MS)
@shape_rule("GatherNDGrad", MS)
def _gather_grad(node, specs, consts):
    """(shape, indices, dY) -> dX of the given shape."""
    return outputs(node, _shape_from_input(node, consts, 0, need(node, specs, 2).dtype))


@shape_rule("GatherElementsGrad", MS)
@shape_rule("SliceGrad", MS)
def _shape_second_grad(node, specs, consts):
    """(dY, shape, ...) -> dX of the given shape."""
    return outputs(node, _shape_from_input(node, consts, 1, need(node, specs, 0).dtype))


@shape_rule("DivGrad", MS)
def _div_grad(node, specs, consts):
    """(dY, A, B) -> (dA like A, dB like B) in dY's dtype."""
    dy = need(node, specs, 0)
    return outputs(node, need(node, specs, 1).with_dtype(dy.dtype), need(node, specs, 2).with_dtype(dy.dtype))


@shape_rule("BatchScale", MS)
def _batch_scale(node, specs, consts):
    x = need(node, specs, 0)
    return outputs(node, *([x] * len(node.outputs)))


@shape_rule("PassThrough", MS)
def _pass_through(node, specs, consts):
    return outputs(node, *specs)


@shape_rule("YieldOp", MS)
def _yield(node, specs, consts):
    """Outputs are the gradients of the differentiable module outputs (inputs), in order."""
    skip = set(attr_ints(node, "non_differentiable_outputs", []))
    return outputs(node, *(s for i, s in enumerate(specs) if i not in skip))


@shape_rule("Group", MS)
def _group(node, specs, consts):
    return outputs(node, TensorSpec("bool", ()))


@shape_rule("MixedPrecisionScale", MS)
def _mixed_precision_scale(node, specs, consts):
    dtype = dtype_of_onnx(attr(node, "to"))
    xs = [need(node, specs, i) for i in range(1, len(node.inputs))]
    if attr(node, "fuse_outputs", 0):
        return outputs(node, TensorSpec(dtype, (sum(x.numel for x in xs),)))
    return outputs(node, *(x.with_dtype(dtype) for x in xs))


def broadcast_gradient_axes(a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    """The axes (last to first) that the gradients of a and b must be summed over (ORT's rule)."""
    a_axes: list[int] = []
    b_axes: list[int] = []
    i, j, k = len(a) - 1, len(b) - 1, max(len(a), len(b)) - 1
    while i >= 0 and j >= 0:
        if a[i] != b[j]:
            if a[i] == 1:
                a_axes.append(k)
            elif b[j] == 1:
                b_axes.append(k)
            else:
                raise ValueError(f"shapes {a} and {b} do not broadcast")
        i, j, k = i - 1, j - 1, k - 1
    rest = list(range(k, -1, -1))
    (a_axes if i < 0 else b_axes).extend(rest)
    return a_axes, b_axes


@shape_rule("BroadcastGradientArgs", MS)
def _broadcast_gradient_args(node, specs, consts):
    a = const_ints(node, consts, 0, "a_shape")
    b = const_ints(node, consts, 1, "b_shape")
    try:
        a_axes, b_axes = broadcast_gradient_axes(a, b)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    return outputs(node, TensorSpec("int64", (len(a_axes),)), TensorSpec("int64", (len(b_axes),)))
