"""Exact decompositions of ops onnxruntime-training 1.19.2 has no gradient for, into ops it
differentiates (each checked against onnx.reference in tests/test_forward_decompose.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxplan.forward._names import NameSource
from onnxplan.forward.gradients import has_gradient

__all__ = ["DECOMPOSITIONS", "decompose", "value_types"]


def value_ranks(model: onnx.ModelProto) -> dict[str, int]:
    """Rank of every value onnx shape inference can give one (non-strict)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - best effort
        inferred = model
    g = inferred.graph
    ranks = {t.name: len(t.dims) for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    return ranks


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every value onnx type inference can name (non-strict)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - best effort: fall back to what the file declares
        inferred = model
    g = inferred.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


class _Emit:
    """Builds the replacement nodes of one decomposed node."""

    def __init__(self, node: onnx.NodeProto, names: NameSource, graph: onnx.GraphProto, elem: int,
                 synthetic: set[str], rank: int | None = None, opset: int = 17) -> None:
        self.base = node.name or node.output[0]
        self.names, self.graph, self.elem, self.synthetic = names, graph, elem, synthetic
        self.rank, self.opset = rank, opset
        self.nodes: list[onnx.NodeProto] = []

    def const(self, value: float) -> str:
        dtype = helper.tensor_dtype_to_np_dtype(self.elem)
        name = self.names.fresh(f"{self.base}/const")
        self.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=dtype), name))
        self.synthetic.add(name)
        return name

    def ints(self, values: list[int]) -> str:
        name = self.names.fresh(f"{self.base}/axes")
        self.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
        self.synthetic.add(name)
        return name

    def mean(self, x: str, axes: list[int]) -> str:
        """ReduceMean keeping dims, in the form of the model's opset (axes an input from 18)."""
        if self.opset >= 18:
            return self.op("ReduceMean", x, self.ints(axes), keepdims=1)
        return self.op("ReduceMean", x, axes=axes, keepdims=1)

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        out = out or self.names.fresh(f"{self.base}/{op_type}")
        self.nodes.append(helper.make_node(op_type, list(inputs), [out],
                                           name=self.names.fresh(f"{self.base}/{op_type}"), **attrs))
        return out


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _clip01(e: _Emit, x: str, alpha: float, beta: float, out: str | None = None) -> str:
    lin = e.op("Add", e.op("Mul", x, e.const(alpha)), e.const(beta))
    return e.op("Clip", lin, e.const(0.0), e.const(1.0), out=out)


def _hard_sigmoid(e, node, x, y):
    _clip01(e, x, float(_attr(node, "alpha", 0.2)), float(_attr(node, "beta", 0.5)), out=y)


def _hard_swish(e, node, x, y):
    e.op("Mul", x, _clip01(e, x, 1.0 / 6.0, 0.5), out=y)


def _softplus_of(e: _Emit, x: str, out: str | None = None) -> str:
    # relu(x) + log(1 + exp(-|x|)): never overflows
    tail = e.op("Log", e.op("Add", e.op("Exp", e.op("Neg", e.op("Abs", x))), e.const(1.0)))
    return e.op("Add", e.op("Relu", x), tail, out=out)


def _softplus(e, node, x, y):
    _softplus_of(e, x, out=y)


def _mish(e, node, x, y):
    e.op("Mul", x, e.op("Tanh", _softplus_of(e, x)), out=y)


def _elu_of(e: _Emit, x: str, alpha: float, out: str | None = None) -> str:
    # relu(x) + alpha * (exp(min(x, 0)) - 1)
    neg = e.op("Sub", e.op("Exp", e.op("Min", x, e.const(0.0))), e.const(1.0))
    return e.op("Add", e.op("Relu", x), e.op("Mul", neg, e.const(alpha)), out=out)


def _elu(e, node, x, y):
    _elu_of(e, x, float(_attr(node, "alpha", 1.0)), out=y)


def _selu(e, node, x, y):
    alpha = float(_attr(node, "alpha", 1.67326319217681884765625))
    gamma = float(_attr(node, "gamma", 1.05070102214813232421875))
    e.op("Mul", _elu_of(e, x, alpha), e.const(gamma), out=y)


def _celu(e, node, x, y):
    alpha = float(_attr(node, "alpha", 1.0))
    scaled = e.op("Div", e.op("Min", x, e.const(0.0)), e.const(alpha))
    neg = e.op("Mul", e.op("Sub", e.op("Exp", scaled), e.const(1.0)), e.const(alpha))
    e.op("Add", e.op("Relu", x), neg, out=y)


def _softsign(e, node, x, y):
    e.op("Div", x, e.op("Add", e.op("Abs", x), e.const(1.0)), out=y)


def _prelu(e, node, x, y):
    slope = node.input[1]
    e.op("Add", e.op("Relu", x), e.op("Mul", e.op("Min", x, e.const(0.0)), slope), out=y)


def _gelu(e, node, x, y):
    approximate = _attr(node, "approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    if approximate == "tanh":
        cube = e.op("Mul", x, e.op("Mul", x, x))
        inner = e.op("Mul", e.op("Add", x, e.op("Mul", cube, e.const(0.044715))),
                     e.const(math.sqrt(2.0 / math.pi)))
        one_plus = e.op("Add", e.op("Tanh", inner), e.const(1.0))
    else:
        one_plus = e.op("Add", e.op("Erf", e.op("Div", x, e.const(math.sqrt(2.0)))), e.const(1.0))
    e.op("Mul", e.op("Mul", x, e.const(0.5)), one_plus, out=y)


def _instance_norm(e, node, x, y):
    # scale * (x - mean) / sqrt(var + eps) + B over the spatial axes, per sample and channel
    if e.rank is None or e.rank < 3:
        raise _CannotDecompose("its input's rank is unknown")
    axes = list(range(2, e.rank))
    d = e.op("Sub", x, e.mean(x, axes))
    eps = e.const(float(_attr(node, "epsilon", 1e-5)))
    std = e.op("Sqrt", e.op("Add", e.mean(e.op("Mul", d, d), axes), eps))
    per_channel = e.ints(list(range(1, e.rank - 1)))
    scaled = e.op("Mul", e.op("Div", d, std), e.op("Unsqueeze", node.input[1], per_channel))
    e.op("Add", scaled, e.op("Unsqueeze", node.input[2], per_channel), out=y)


class _CannotDecompose(Exception):
    """A node of a decomposable op whose decomposition needs what is not known (left as is)."""


def _sum_of(e: _Emit, node, out: str | None = None) -> str:
    terms = [i for i in node.input if i]
    if len(terms) == 1:
        return e.op("Identity", terms[0], out=out)
    acc = terms[0]
    for k, t in enumerate(terms[1:], start=2):
        acc = e.op("Add", acc, t, out=out if k == len(terms) else None)
    return acc


def _sum(e, node, x, y):
    _sum_of(e, node, out=y)


def _mean(e, node, x, y):
    n = len([i for i in node.input if i])
    e.op("Div", _sum_of(e, node), e.const(float(n)), out=y)


# op type -> builder(emit, node, x, y); every emitted op has an ORT gradient
DECOMPOSITIONS: dict[str, Callable] = {
    "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish, "Softplus": _softplus, "Mish": _mish,
    "Elu": _elu, "Selu": _selu, "Celu": _celu, "Softsign": _softsign, "PRelu": _prelu, "Gelu": _gelu,
    "Sum": _sum, "Mean": _mean, "InstanceNormalization": _instance_norm,
}


def decompose(model: onnx.ModelProto, notes: list[str], synthetic: set[str]) -> None:
    """Replace, in place, every default-domain node of DECOMPOSITIONS that has no ORT gradient;
    the constants it creates are named in `synthetic`."""
    graph = model.graph
    targets = [n for n in graph.node if n.domain in ("", "ai.onnx") and n.op_type in DECOMPOSITIONS
               and not has_gradient(n)]
    if not targets:
        return
    types = value_types(model)
    ranks = value_ranks(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    names = NameSource(graph)
    new_nodes: list[onnx.NodeProto] = []
    counts: dict[str, list[str]] = {}
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in DECOMPOSITIONS and not has_gradient(node):
            e = _Emit(node, names, graph, types.get(node.input[0], onnx.TensorProto.FLOAT), synthetic,
                      ranks.get(node.input[0]), opset)
            try:
                DECOMPOSITIONS[node.op_type](e, node, node.input[0], node.output[0])
            except _CannotDecompose:  # left for the gradient check to name
                new_nodes.append(node)
                continue
            new_nodes.extend(e.nodes)
            counts.setdefault(node.op_type, []).append(node.name or node.output[0])
        else:
            new_nodes.append(node)
    del graph.node[:]
    graph.node.extend(new_nodes)
    for op, where in counts.items():
        shown = ", ".join(where[:3]) + (f", ... ({len(where)} nodes)" if len(where) > 3 else "")
        notes.append(f"decomposed {op} (no gradient in onnxruntime-training 1.19.2) into differentiable "
                     f"ops: {shown}")
