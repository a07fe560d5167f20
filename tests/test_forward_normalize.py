"""Exporter normalisation: local functions inlined, opset 18+ converted to 17 (also the ops
onnx's converter has no adapter for), IR 9; outputs equal before and after (onnx.reference)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxplan.forward.normalize import TARGET_OPSET, convert_opset, default_opset, normalize


def _opset20_model() -> onnx.ModelProto:
    """x[2,6] -> local function (Relu then Mul) -> Split(num_outputs=3, uneven) -> Pad(axes) ->
    Concat with ConstantOfShape -> ReduceMean(axes input) -> y."""
    f = helper.make_function("local", "ReluTwice", ["a"], ["b"],
                             [helper.make_node("Relu", ["a"], ["r"]),
                              helper.make_node("Add", ["r", "r"], ["b"])],
                             [helper.make_opsetid("", 20)])
    inits = [numpy_helper.from_array(np.array([1, 2], np.int64), "pads"),
             numpy_helper.from_array(np.array([1], np.int64), "pad_axes"),
             numpy_helper.from_array(np.array([2, 1], np.int64), "cshape"),
             numpy_helper.from_array(np.array([1], np.int64), "raxes")]
    nodes = [
        helper.make_node("ReluTwice", ["x"], ["t"], domain="local", name="fn"),
        helper.make_node("Split", ["t"], ["s0", "s1", "s2"], axis=1, num_outputs=3, name="split"),
        helper.make_node("Pad", ["s1", "pads", "", "pad_axes"], ["p"], mode="reflect", name="pad"),
        helper.make_node("ConstantOfShape", ["cshape"], ["c"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
        helper.make_node("Concat", ["s0", "p", "s2", "c"], ["cat"], axis=1, name="cat"),
        helper.make_node("ReduceMean", ["cat", "raxes"], ["y"], keepdims=1, name="mean"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])
    model = helper.make_model(helper.make_graph(nodes, "g", [x, helper.make_tensor_value_info(
        "pads", TensorProto.INT64, [2])], [y], inits), functions=[f],
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("local", 1)])
    model.ir_version = 10
    return model


def test_opset20_export_converts_to_17_with_equal_outputs():
    model = _opset20_model()
    x = np.random.default_rng(3).standard_normal((2, 7)).astype(np.float32)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    notes: list[str] = []
    out = convert_opset(normalize(model, notes), notes)
    assert default_opset(out) == TARGET_OPSET and out.ir_version == 9 and not out.functions
    assert [o.domain for o in out.opset_import if o.domain not in ("", "ai.onnx", "local")] == []
    assert "pads" not in {vi.name for vi in out.graph.input}  # an initializer listed as an input
    onnx.checker.check_model(out, full_check=True)
    got = ReferenceEvaluator(out).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    text = " | ".join(notes)
    assert "inlined 1 local function(s): ReluTwice" in text and "converted ai.onnx opset 20 to 17" in text


def _argmax_model(scale: int, through_input: bool = False) -> onnx.ModelProto:
    """ids[2,5] int64 -> Equal(ids, 0) -> Not -> Cast(int32) -> Cast(int64) -> Mul(positions *
    scale) -> ArgMax (or ArgMax straight over ids) -> y int64."""
    pos = numpy_helper.from_array(np.arange(5, dtype=np.int64) * scale, "pos")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    nodes = [helper.make_node("Equal", ["ids", "zero"], ["eq"]),
             helper.make_node("Not", ["eq"], ["keep"]),
             helper.make_node("Cast", ["keep"], ["k32"], to=TensorProto.INT32),
             helper.make_node("Cast", ["k32"], ["k64"], to=TensorProto.INT64),
             helper.make_node("Mul", ["pos", "k64"], ["m"]),
             helper.make_node("ArgMax", ["ids" if through_input else "m"], ["y"], axis=-1, keepdims=0,
                              name="pool")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, [2])], [pos, zero])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_integer_argmax_provably_in_int32_is_cast_first_and_exact():
    from onnxplan.forward.int_args import cast_integer_args

    model, notes = _argmax_model(3), []
    cast_integer_args(model, notes)
    onnx.checker.check_model(model, full_check=True)
    assert notes == [("ArgMax (node pool) over int64 values provably in [0, 12] cast to int32 first "
                      "(onnxruntime 1.19.2's CPU ArgMax has no int64 kernel)")]
    pool = next(n for n in model.graph.node if n.name == "pool")
    cast = next(n for n in model.graph.node if n.output[0] == pool.input[0])
    assert cast.op_type == "Cast" and cast.attribute[0].i == TensorProto.INT32
    ids = np.random.default_rng(0).integers(0, 3, (2, 5)).astype(np.int64)
    want = ReferenceEvaluator(_argmax_model(3)).run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, {"ids": ids})[0], want)


def test_integer_argmax_not_provably_in_int32_is_left_alone():
    from onnxplan.forward.int_args import cast_integer_args

    for model in (_argmax_model(2 ** 30), _argmax_model(1, through_input=True)):  # [0, 2^32]; unknown
        before, notes = model.SerializeToString(), []
        cast_integer_args(model, notes)
        assert notes == [] and model.SerializeToString() == before
