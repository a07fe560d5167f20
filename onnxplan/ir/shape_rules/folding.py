"""Constant folding with numpy for the small ops of shape subgraphs (Shape, Gather, Concat, Slice...)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxplan.ir.cast import cast_attrs, cast_into
from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import canonical_domain
from onnxplan.ir.shape_rules._common import MS, attr, attr_ints, norm_axes, norm_axis, tensor_value
from onnxplan.ir.shape_rules.reduce import REDUCE_OPS
from onnxplan.ir.shape_rules.tensor_ops import constant_node_value, slice_axes, slice_range
from onnxplan.ir.shape_rules.training import broadcast_gradient_axes
from onnxplan.ir.tensor import TensorSpec

__all__ = ["SPEC_ONLY_OPS", "Folder", "conform", "find_folder"]

# folder(node, input values (None: absent or, for SPEC_ONLY_OPS, unknown), input specs, output specs)
#   -> output values (None: not folded)
Folder = Callable[[Node, list, list, list], list]
# Foldable (at least partly) from input specs alone; their folders may return None for an output.
SPEC_ONLY_OPS = {("", "Shape"), ("", "Size"), (MS, "ConcatTraining")}

_FOLDERS: dict[tuple[str, str], Folder] = {}


def find_folder(domain: str, op_type: str) -> Folder | None:
    return _FOLDERS.get((canonical_domain(domain), op_type))


def _folds(*ops: str, domain: str = ""):
    def register(fn: Folder) -> Folder:
        for op in ops:
            _FOLDERS[(domain, op)] = fn
        return fn

    return register


def _int_div(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) != (b < 0), -q, q)  # C-style truncation, as ONNX Runtime
    return np.divide(a, b)


def _mod(node, a, b):
    return np.fmod(a, b) if attr(node, "fmod", 0) else np.mod(a, b)


_BINARY: dict[str, Callable[..., np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _int_div, "Pow": np.power,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}
_UNARY: dict[str, Callable[..., np.ndarray]] = {
    "Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Sqrt": np.sqrt, "Reciprocal": np.reciprocal,
    "Floor": np.floor, "Ceil": np.ceil, "Identity": lambda x: x, "Sign": np.sign, "Relu": lambda x: np.maximum(x, 0),
}
_REDUCERS: dict[str, Callable[..., np.ndarray]] = {"ReduceSum": np.sum, "ReduceProd": np.prod, "ReduceMin": np.min, "ReduceMax": np.max,
             "ReduceMean": np.mean}


@_folds(*_BINARY, "Mod")
def _fold_binary(node, vals, specs, outs):
    a, b = vals[0], vals[1]
    result = _mod(node, a, b) if node.op_type == "Mod" else _BINARY[node.op_type](a, b)
    return [result]


@_folds(*_UNARY)
def _fold_unary(node, vals, specs, outs):
    return [_UNARY[node.op_type](vals[0])]


@_folds("Sum", "Max", "Min")
def _fold_variadic(node, vals, specs, outs):
    fn = {"Sum": np.add, "Max": np.maximum, "Min": np.minimum}[node.op_type]
    result = vals[0]
    for v in vals[1:]:
        result = fn(result, v)
    return [result]


@_folds("Where")
def _fold_where(node, vals, specs, outs):
    return [np.where(vals[0], vals[1], vals[2])]


@_folds("Cast", "CastLike")
def _fold_cast(node, vals, specs, outs):
    """ONNX's Cast rules (onnxplan.ir.cast, as the kernel runs them) on the folded value."""
    x = np.asarray(vals[0])
    out = np.empty(x.shape, np.dtype(outs[0].dtype))
    cast_into(np, x, out, *cast_attrs(node.attrs))
    return [out]


@_folds("Constant")
def _fold_constant(node, vals, specs, outs):
    return [constant_node_value(node)]


@_folds("Shape")
def _fold_shape(node, vals, specs, outs):
    shape = specs[0].shape
    start, end = int(attr(node, "start", 0)), attr(node, "end", None)
    return [np.asarray(shape[slice(start, None if end is None else int(end))], dtype=np.int64)]


@_folds("Size")
def _fold_size(node, vals, specs, outs):
    return [np.asarray(specs[0].numel, dtype=np.int64)]


@_folds("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand")
def _fold_reshape(node, vals, specs, outs):
    x = vals[0]
    if node.op_type == "Expand":
        return [np.broadcast_to(x, outs[0].shape).copy()]
    return [x.reshape(outs[0].shape)]


@_folds("Transpose")
def _fold_transpose(node, vals, specs, outs):
    return [np.transpose(vals[0], attr_ints(node, "perm"))]


@_folds("Tile")
def _fold_tile(node, vals, specs, outs):
    return [np.tile(vals[0], [int(r) for r in vals[1].reshape(-1)])]


@_folds("Gather")
def _fold_gather(node, vals, specs, outs):
    data = vals[0]
    return [np.take(data, vals[1], axis=norm_axis(node, attr(node, "axis", 0), data.ndim))]


@_folds("GatherElements")
def _fold_gather_elements(node, vals, specs, outs):
    data, idx = vals[0], vals[1]
    axis = norm_axis(node, attr(node, "axis", 0), data.ndim)
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return [np.take_along_axis(data, idx, axis=axis)]


@_folds("Concat")
def _fold_concat(node, vals, specs, outs):
    present = [v for v in vals if v is not None]
    return [np.concatenate(present, axis=norm_axis(node, attr(node, "axis"), present[0].ndim))]


@_folds("ConcatTraining", domain=MS)
def _fold_concat_training(node, vals, specs, outs):
    """per_input_length from the specs; the concatenation only when every input is constant."""
    present = [(v, s) for v, s, name in zip(vals, specs, node.inputs) if name]
    axis = norm_axis(node, attr(node, "axis"), present[0][1].rank)
    lengths = np.asarray([s.shape[axis] for _, s in present], dtype=np.int64)
    if any(v is None for v, _ in present):
        return [None, lengths]
    return [np.concatenate([v for v, _ in present], axis=axis), lengths]


@_folds("Slice")
def _fold_slice(node, vals, specs, outs):
    x = vals[0]
    params = [None if v is None else [int(i) for i in v.reshape(-1)] for v in (vals + [None] * 5)[1:5]]
    for axis, start, end, step in slice_axes(node, x.ndim, *params):
        x = np.take(x, np.asarray(slice_range(x.shape[axis], start, end, step), dtype=np.int64), axis=axis)
    return [x]


@_folds("Range")
def _fold_range(node, vals, specs, outs):
    start, limit, delta = (v.reshape(-1)[0] for v in vals[:3])
    return [np.arange(start, limit, delta)]


@_folds("ConstantOfShape")
def _fold_constant_of_shape(node, vals, specs, outs):
    value = node.attrs.get("value")
    fill = tensor_value(value).reshape(-1)[0] if value is not None else 0.0
    return [np.full(outs[0].shape, fill)]


@_folds(*(op for op in REDUCE_OPS if op in _REDUCERS))
def _fold_reduce(node, vals, specs, outs):
    x = vals[0]
    axes = vals[1].reshape(-1).tolist() if len(vals) > 1 and vals[1] is not None else attr_ints(node, "axes")
    if not axes and attr(node, "noop_with_empty_axes", 0):
        return [x]
    axes = tuple(norm_axes(node, axes, x.ndim)) if axes else None
    return [_REDUCERS[node.op_type](x, axis=axes).reshape(outs[0].shape)]


@_folds("BroadcastGradientArgs", domain=MS)
def _fold_broadcast_gradient_args(node, vals, specs, outs):
    a_axes, b_axes = broadcast_gradient_axes(vals[0].reshape(-1).tolist(), vals[1].reshape(-1).tolist())
    return [np.asarray(a_axes, dtype=np.int64), np.asarray(b_axes, dtype=np.int64)]


def conform(value: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """`value` with the dtype and shape its spec promises (raises if the shape disagrees)."""
    value = np.asarray(value).astype(spec.dtype, copy=False)
    if value.shape != spec.shape:
        raise ValueError(f"folded value has shape {value.shape}, its rule says {spec.shape}")
    return value

