"""Static shapes of a forward model: dynamic axes, shape arithmetic onnx's data propagation
misses, and re-batching proved by strict shape inference or refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxplan.errors import DynamicDimError, ModelError
from onnxplan.forward.shapes import fix_shapes


def _padded(batch, out_dim0="n") -> onnx.ModelProto:
    """x[batch, 4] -> Pad with pads computed from Shape through Cast/Max (data propagation
    stops there) -> MatMul -> y[out_dim0, 3]."""
    f32, i64 = np.float32, np.int64
    inits = [numpy_helper.from_array(np.full((6, 3), 0.1, f32), "w"),
             numpy_helper.from_array(np.array([1], i64), "one"),
             numpy_helper.from_array(np.array([0], i64), "zero")]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1, end=2),  # [4]
        helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["sf"], ["si"], to=TensorProto.INT64),
        helper.make_node("Max", ["si", "one"], ["m"]),  # [4]
        helper.make_node("Sub", ["m", "si"], ["d"]),  # [0]
        helper.make_node("Add", ["d", "one"], ["p"]),  # [1]
        helper.make_node("Concat", ["zero", "p", "zero", "p"], ["pads"], axis=0),  # [0, 1, 0, 1]
        helper.make_node("Pad", ["x", "pads"], ["xp"]),
        helper.make_node("MatMul", ["xp", "w"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [out_dim0, 3])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    return model


def _fix(model, dims=None, batch=None):
    notes: list[str] = []
    init = {t.name for t in model.graph.initializer}
    return fix_shapes(model, init, dims or {}, batch, "net", notes), notes


def test_static_export_needs_no_batch_even_past_shape_arithmetic():
    shapes, notes = _fix(_padded(2))
    assert shapes.output == (2, 3) and shapes.inputs == {"x": (2, 4)} and notes == []


def test_dynamic_axes_take_batch_or_dim():
    assert _fix(_padded("batch"), batch=5)[0].output == (5, 3)
    assert _fix(_padded("batch"), dims={"batch": 6})[0].output == (6, 3)
    with pytest.raises(DynamicDimError, match="--dim batch=N"):
        _fix(_padded("batch"))


def test_fixed_batch_is_rebatched_when_every_shape_follows():
    model = _padded(2)
    shapes, notes = _fix(model, batch=7)
    assert shapes.output == (7, 3) and shapes.rebatched == (2, 7)
    assert notes == ["re-batched from the exported batch 2 to 7 (every shape re-inferred)"]
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [7, 3]


def test_a_baked_in_batch_is_refused():
    model = _padded(2)  # Reshape [2, 6] after the Pad: its input rows are not known to be the batch
    model.graph.initializer.append(numpy_helper.from_array(np.array([2, 6], np.int64), "fixed"))
    model.graph.node[-1].input[0] = "xr"
    model.graph.node.insert(len(model.graph.node) - 1, helper.make_node("Reshape", ["xp", "fixed"], ["xr"]))
    with pytest.raises(ModelError, match="cannot re-batch net from its exported batch 2 to --batch 4: the "
                                         "output's leading dimension stays 2"):
        _fix(model, batch=4)
