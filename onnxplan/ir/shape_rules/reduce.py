"""Shape rules for reductions: Reduce* (axes as attribute or input), ArgMax/ArgMin, CumSum, ReduceSumTraining."""

from __future__ import annotations

from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import shape_rule
from onnxplan.ir.shape_rules._common import (
    MS,
    attr,
    attr_ints,
    const_ints,
    has_input,
    need,
    norm_axes,
    norm_axis,
    outputs,
)
from onnxplan.ir.tensor import TensorSpec

__all__ = ["REDUCE_OPS", "reduced_shape"]

REDUCE_OPS = (
    "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceSumSquare ReduceL1 ReduceL2 "
    "ReduceLogSum ReduceLogSumExp"
).split()


def reduced_shape(node: Node, shape: tuple[int, ...], axes: list[int] | None) -> tuple[int, ...]:
    """Shape after reducing `axes` (None or empty: all axes, unless noop_with_empty_axes)."""
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return shape
        axes = list(range(len(shape)))
    reduced = set(norm_axes(node, axes, len(shape)))
    keep = bool(attr(node, "keepdims", 1))
    return tuple(1 if i in reduced else d for i, d in enumerate(shape) if keep or i not in reduced)


def _reduce(node, specs, consts):
    x = need(node, specs, 0)
    axes = const_ints(node, consts, 1, "axes") if has_input(node, 1) else attr_ints(node, "axes")
    return outputs(node, x.with_shape(reduced_shape(node, x.shape, axes)))


for _op in REDUCE_OPS:
    shape_rule(_op)(_reduce)
shape_rule("ReduceSumTraining", MS)(_reduce)


@shape_rule("CumSum")
def _cum_sum(node, specs, consts):
    return outputs(node, need(node, specs, 0))


@shape_rule("ArgMax")
@shape_rule("ArgMin")
def _arg_reduce(node, specs, consts):
    x = need(node, specs, 0)
    axis = norm_axis(node, attr(node, "axis", 0), x.rank)
    keep = bool(attr(node, "keepdims", 1))
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape) if keep or i != axis)
    return outputs(node, TensorSpec("int64", shape))
