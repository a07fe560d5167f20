"""Helpers shared by the shape rules: attributes, constant inputs, broadcasting and axes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod
from typing import Any, overload

import numpy as np
from onnx import TensorProto, numpy_helper

from onnxplan.ir import attrs
from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import ShapeInferenceError, shape_rule
from onnxplan.ir.tensor import TensorSpec, onnx_to_numpy_dtype
from onnxplan.ir.windows import WindowError
from onnxplan.ort import MS

__all__ = [
    "MS",
    "attr",
    "attr_ints",
    "attr_str",
    "broadcast",
    "const",
    "const_ints",
    "dtype_of_onnx",
    "fail",
    "has_input",
    "need",
    "need_const",
    "norm_axes",
    "norm_axis",
    "outputs",
    "prod",
    "register_same_as_input",
    "required_ints",
    "tensor_value",
    "window_dims",
]



def fail(message: str) -> ShapeInferenceError:
    """The error a rule raises when the node's shapes cannot be derived (the engine adds the node)."""
    return ShapeInferenceError(message)


def attr(node: Node, name: str, default: Any = None) -> Any:
    return attrs.attr(node.attrs, name, default)


def attr_str(node: Node, name: str, default: str = "") -> str:
    return attrs.attr_str(node.attrs.get(name), default)


@overload
def attr_ints(node: Node, name: str) -> list[int] | None: ...
@overload
def attr_ints(node: Node, name: str, default: Sequence[int]) -> list[int]: ...
@overload
def attr_ints(node: Node, name: str, default: Sequence[int] | None) -> list[int] | None: ...
def attr_ints(node: Node, name: str, default: Sequence[int] | None = None) -> list[int] | None:
    value = node.attrs.get(name)
    if value is None:
        return None if default is None else list(default)
    return [int(v) for v in np.asarray(value).reshape(-1)]


def required_ints(node: Node, name: str) -> list[int]:
    """An ints attribute the op must have (a model without it is malformed)."""
    value = attr_ints(node, name)
    if value is None:
        raise fail(f"attribute '{name}' is missing")
    return value


def window_dims(dims_of: Callable[..., list[int]], node: Node, *args: Any) -> list[int]:
    """dims_of(node's attributes, *args), a function of ir/windows.py, its WindowError the node's."""
    try:
        return dims_of(node.attrs, *args)
    except WindowError as e:
        raise fail(str(e)) from None


def tensor_value(value: Any) -> np.ndarray:
    """A tensor attribute (TensorProto, numpy array or python value) as a numpy array."""
    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


def dtype_of_onnx(elem_type: int) -> str:
    return np.dtype(onnx_to_numpy_dtype(int(elem_type))).name


def has_input(node: Node, i: int) -> bool:
    return i < len(node.inputs) and bool(node.inputs[i])


def need(node: Node, specs: list[TensorSpec | None], i: int) -> TensorSpec:
    """The spec of input i, which must be present."""
    spec = specs[i] if i < len(specs) else None
    if spec is None:
        raise fail(f"required input {i} is missing")
    return spec


def const(node: Node, consts: dict[str, np.ndarray], i: int) -> np.ndarray | None:
    """The statically known value of input i, or None (absent input or not constant)."""
    if not has_input(node, i):
        return None
    return consts.get(node.inputs[i])


def need_const(node: Node, consts: dict[str, np.ndarray], i: int, what: str) -> np.ndarray:
    value = const(node, consts, i)
    if value is None:
        name = node.inputs[i] if has_input(node, i) else "<missing>"
        raise fail(f"its {what} (input {i}, '{name}') is not a constant: output shape is data-dependent")
    return value


def const_ints(node: Node, consts: dict[str, np.ndarray], i: int, what: str) -> list[int]:
    return [int(v) for v in need_const(node, consts, i, what).reshape(-1)]


def norm_axis(node: Node, axis: int, rank: int) -> int:
    try:
        return attrs.norm_axis(axis, rank)
    except ValueError as exc:
        raise fail(str(exc)) from None


def norm_axes(node: Node, axes: Sequence[int], rank: int) -> list[int]:
    return [norm_axis(node, a, rank) for a in axes]


def broadcast(node: Node, *shapes: Sequence[int]) -> tuple[int, ...]:
    """Multidirectional (numpy) broadcasting of shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dims = {s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise fail(f"shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def outputs(node: Node, *specs: TensorSpec | None) -> list[TensorSpec | None]:
    """`specs` fitted to the node's outputs: None for omitted ("") names and missing tails."""
    fitted = list(specs[: len(node.outputs)]) + [None] * max(0, len(node.outputs) - len(specs))
    return [s if name else None for s, name in zip(fitted, node.outputs)]


def register_same_as_input(ops: Sequence[str], domain: str = "", index: int = 0) -> None:
    """Register ops whose single output has the spec of input `index`."""

    def rule(node, specs, consts):
        return outputs(node, need(node, specs, index))

    for op in ops:
        shape_rule(op, domain)(rule)
