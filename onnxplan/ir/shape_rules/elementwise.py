"""Shape rules for elementwise ops: unary, broadcasting binary and variadic, comparisons, casts."""

from __future__ import annotations

from onnxplan.ir.shape_rules import shape_rule
from onnxplan.ir.shape_rules._common import (
    MS,
    attr,
    attr_str,
    broadcast,
    dtype_of_onnx,
    fail,
    need,
    outputs,
    register_same_as_input,
)
from onnxplan.ir.tensor import TensorSpec

__all__ = ["UNARY_OPS", "BINARY_OPS", "COMPARISON_OPS", "VARIADIC_OPS"]

UNARY_OPS = (
    "Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Ceil Celu Clip Cos Cosh Elu Erf Exp Floor "
    "HardSigmoid HardSwish Identity LeakyRelu Log Mish Neg Not Reciprocal Relu Round Selu "
    "Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh ThresholdedRelu"
).split()
# ONNX Runtime contrib activations with the shape of their first input (bias, if any, broadcasts).
MS_UNARY_OPS = ("Gelu", "FastGelu", "QuickGelu", "BiasGelu", "Scale")
BINARY_OPS = "Add Sub Mul Div Pow Mod PRelu BitShift BitwiseAnd BitwiseOr BitwiseXor".split()
LOGICAL_OPS = ("And", "Or", "Xor")
COMPARISON_OPS = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
VARIADIC_OPS = ("Sum", "Max", "Min", "Mean")

register_same_as_input(UNARY_OPS)
register_same_as_input(MS_UNARY_OPS, MS)


def _binary(node, specs, consts):
    a, b = need(node, specs, 0), need(node, specs, 1)
    return outputs(node, TensorSpec(a.dtype, broadcast(node, a.shape, b.shape)))


def _boolean(node, specs, consts):
    a, b = need(node, specs, 0), need(node, specs, 1)
    return outputs(node, TensorSpec("bool", broadcast(node, a.shape, b.shape)))


def _variadic(node, specs, consts):
    present = [need(node, specs, i) for i in range(len(node.inputs)) if node.inputs[i]]
    return outputs(node, TensorSpec(present[0].dtype, broadcast(node, *(s.shape for s in present))))


for _op in BINARY_OPS:
    shape_rule(_op)(_binary)
for _op in LOGICAL_OPS + COMPARISON_OPS:
    shape_rule(_op)(_boolean)
for _op in VARIADIC_OPS:
    shape_rule(_op)(_variadic)


@shape_rule("Gelu")
def _gelu(node, specs, consts):
    approximate = attr_str(node, "approximate", "none")
    if approximate not in ("none", "tanh"):
        raise fail(f"Gelu approximate={approximate!r} is not supported (only 'none' and 'tanh')")
    return outputs(node, need(node, specs, 0))


@shape_rule("IsNaN")
@shape_rule("IsInf")
@shape_rule("IsFinite", MS)
def _predicate(node, specs, consts):
    return outputs(node, need(node, specs, 0).with_dtype("bool"))


@shape_rule("Where")
def _where(node, specs, consts):
    c, x, y = (need(node, specs, i) for i in range(3))
    return outputs(node, TensorSpec(x.dtype, broadcast(node, c.shape, x.shape, y.shape)))


def _round_mode(node) -> None:
    mode = attr_str(node, "round_mode", "up")
    if mode not in ("up", "down", "nearest"):
        raise fail(f"{node.op_type} round_mode {mode!r} is not supported (up, down and nearest are)")


@shape_rule("Cast")
def _cast(node, specs, consts):
    _round_mode(node)
    return outputs(node, need(node, specs, 0).with_dtype(dtype_of_onnx(attr(node, "to"))))


@shape_rule("CastLike")
def _cast_like(node, specs, consts):
    _round_mode(node)
    return outputs(node, need(node, specs, 0).with_dtype(need(node, specs, 1).dtype))
