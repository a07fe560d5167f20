"""ArgMax/ArgMin over integers onnxruntime 1.19.2's CPU kernels cannot take (int64, uint32,
uint64, int16, uint16: it has float, double, int32, int8, uint8), cast to int32 first where
every value provably fits: the indices, and so the int64 output, are unchanged (exact).

The proof is a small interval walk back from the ArgMax input through integer-valued ops
(Cast, comparisons and logic, Where, Mul/Add/Sub/Neg/Abs/Min/Max, Range, shape-only ops,
constants);
any other producer, a graph input, or an interval leaving its type's range means "unknown",
and the node is left as it is (ONNX Runtime's refusal then names it: onnxplan/ort.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxplan.forward._names import NameSource
from onnxplan.forward.decompose import value_types

__all__ = ["cast_integer_args"]

_CAST_FIRST: dict[int, str] = {TensorProto.INT64: "int64", TensorProto.UINT64: "uint64", TensorProto.UINT32: "uint32",
               TensorProto.INT16: "int16", TensorProto.UINT16: "uint16"}
_INT32 = (int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max))
_BOOL_OPS = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor",
             "IsNaN", "IsInf")
_SAME_VALUES = ("Identity", "Reshape", "Squeeze", "Unsqueeze", "Expand", "Flatten", "Transpose")
_MAX_DEPTH = 32

Interval = tuple[int, int]


def _type_range(elem: int) -> Interval | None:
    """Values a tensor of `elem` holds exactly as integers (floats: up to their mantissa)."""
    if elem == TensorProto.BOOL:
        return (0, 1)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return (int(info.min), int(info.max))
    if dtype.kind == "f":
        m = 2 ** (np.finfo(dtype).nmant + 1)
        return (-m, m)
    return None


def _const_range(t: onnx.TensorProto) -> Interval | None:
    if t.data_location == onnx.TensorProto.EXTERNAL:  # a large tensor left on disk: range unknown
        return None
    a = numpy_helper.to_array(t)
    if a.size == 0 or a.dtype.kind not in "biu":
        return None
    return (int(a.min()), int(a.max()))


class _Ranges:
    def __init__(self, model: onnx.ModelProto, types: dict[str, int]) -> None:
        g = model.graph
        self.types = types
        self.consts = {t.name: t for t in g.initializer}
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.memo: dict[str, Interval | None] = {}

    def of(self, name: str, depth: int = 0) -> Interval | None:
        if name not in self.memo:
            self.memo[name] = None if depth > _MAX_DEPTH else self._walk(name, depth)
        return self.memo[name]

    def _walk(self, name: str, depth: int) -> Interval | None:
        if name in self.consts:
            return _const_range(self.consts[name])
        node = self.producer.get(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            return None  # a graph input or an op this walk does not know
        op, ins = node.op_type, list(node.input)
        if op == "Constant":
            t = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
            return None if t is None else _const_range(t)
        if op in _BOOL_OPS:
            return (0, 1)
        r = None
        if op == "Cast":
            to = next(a.i for a in node.attribute if a.name == "to")
            if self.types.get(ins[0]) == TensorProto.BOOL:
                return (0, 1)
            dst = _type_range(to)
            r = self.of(ins[0], depth + 1) if dst is not None else None
            if dst is not None and r is not None and not (dst[0] <= r[0] and r[1] <= dst[1]):
                return None  # the cast could wrap or round
            return r
        if op in _SAME_VALUES:
            r = self.of(ins[0], depth + 1)
        elif op == "Where" and len(ins) == 3:
            a, b = self.of(ins[1], depth + 1), self.of(ins[2], depth + 1)
            r = None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
        elif op in ("Mul", "Add", "Sub", "Min", "Max") and len(ins) >= 2:
            found = [self.of(i, depth + 1) for i in ins]
            rs = [x for x in found if x is not None]
            if len(rs) < len(found):
                return None
            r = rs[0]
            for b in rs[1:]:
                a = r
                if op == "Mul":
                    p = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
                    r = (min(p), max(p))
                elif op == "Add":
                    r = (a[0] + b[0], a[1] + b[1])
                elif op == "Sub":
                    r = (a[0] - b[1], a[1] - b[0])
                elif op == "Min":
                    r = (min(a[0], b[0]), min(a[1], b[1]))
                else:
                    r = (max(a[0], b[0]), max(a[1], b[1]))
        elif op == "Range" and len(ins) == 3:  # start + k*delta strictly before limit: between the two
            a, b = self.of(ins[0], depth + 1), self.of(ins[1], depth + 1)
            r = None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
        elif op == "Neg":
            a = self.of(ins[0], depth + 1)
            r = None if a is None else (-a[1], -a[0])
        elif op == "Abs":
            a = self.of(ins[0], depth + 1)
            r = None if a is None else ((0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))),
                                        max(abs(a[0]), abs(a[1])))
        if r is None:
            return None
        own = _type_range(self.types.get(name, 0)) if self.types.get(name) else None
        # an interval outside the value's own type means it could have wrapped: unknown
        return r if own is not None and own[0] <= r[0] and r[1] <= own[1] else None


def cast_integer_args(model: onnx.ModelProto, notes: list[str]) -> None:
    """Insert Cast(int32) before each ArgMax/ArgMin whose integer input provably fits int32."""
    g = model.graph
    if not any(n.op_type in ("ArgMax", "ArgMin") for n in g.node):
        return
    types = value_types(model)
    targets = [k for k, n in enumerate(g.node) if n.domain in ("", "ai.onnx")
               and n.op_type in ("ArgMax", "ArgMin") and types.get(n.input[0]) in _CAST_FIRST]
    if not targets:
        return
    ranges, names = _Ranges(model, types), NameSource(g)
    new_nodes: dict[int, onnx.NodeProto] = {}  # position of the ArgMax -> the Cast to put before it
    for k in targets:
        node = g.node[k]
        r = ranges.of(node.input[0])
        if r is None or not (_INT32[0] <= r[0] and r[1] <= _INT32[1]):
            continue
        label = node.name or node.output[0]
        cast_out = names.fresh(f"{node.input[0]}_int32")
        cast = helper.make_node("Cast", [node.input[0]], [cast_out], name=names.fresh(f"{label}/CastInt32"),
                                to=TensorProto.INT32)
        new_nodes[k] = cast
        node.input[0] = cast_out
        notes.append(f"{node.op_type} (node {label}) over {_CAST_FIRST[types[cast.input[0]]]} values "
                     f"provably in [{r[0]}, {r[1]}] cast to int32 first (onnxruntime 1.19.2's CPU "
                     f"{node.op_type} has no {_CAST_FIRST[types[cast.input[0]]]} kernel)")
    if not new_nodes:
        return
    ordered = []
    for k, n in enumerate(g.node):
        if k in new_nodes:
            ordered.append(new_nodes[k])
        ordered.append(n)
    del g.node[:]
    g.node.extend(ordered)
