"""Decompositions of ops without an ORT gradient: equal to the op (onnx.reference), made only
of ops onnxruntime-training 1.19.2 differentiates, and trainable by it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxplan.loading.artifacts as art
from onnxplan.forward import prepare_forward
from onnxplan.forward.decompose import DECOMPOSITIONS, decompose
from onnxplan.forward.gradients import has_gradient

# (op, attributes, opset): every decomposition, with non-default attributes where it has them
CASES = [
    ("HardSigmoid", {}, 17), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 17), ("HardSwish", {}, 17),
    ("Softplus", {}, 17), ("Mish", {}, 18), ("Elu", {}, 17), ("Elu", {"alpha": 0.5}, 17), ("Selu", {}, 17),
    ("Selu", {"alpha": 1.5, "gamma": 1.2}, 17), ("Celu", {"alpha": 2.0}, 17), ("Softsign", {}, 17),
    ("PRelu", {}, 17), ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20), ("Sum", {}, 17),
    ("Mean", {}, 17), ("InstanceNormalization", {"epsilon": 1e-3}, 17), ("InstanceNormalization", {}, 18),
]


def _model(op: str, attrs: dict, opset: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 50])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3, 50])
    inputs, inits = ["x"], []
    if op == "PRelu":  # a per-channel slope, broadcast as PyTorch exports it
        inits.append(numpy_helper.from_array(np.array([[0.25], [-0.5], [1.5]], np.float32), "slope"))
        inputs.append("slope")
    if op == "InstanceNormalization":  # per-channel scale and bias (3 channels, axis 1)
        inits += [numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "slope"),
                  numpy_helper.from_array(np.array([0.1, 0.2, -0.3], np.float32), "row")]
        inputs += ["slope", "row"]
    if op in ("Sum", "Mean"):  # variadic, broadcasting
        inits += [numpy_helper.from_array(np.array([[0.25], [-0.5], [1.5]], np.float32), "slope"),
                  numpy_helper.from_array(np.linspace(-1, 1, 50, dtype=np.float32), "row")]
        inputs += ["slope", "row"]
    node = helper.make_node(op, inputs, ["y"], name=f"/act/{op}", **attrs)
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference Elu/Selu overflow at -90
@pytest.mark.parametrize(("op", "attrs", "opset"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_decomposition_equals_the_op(op, attrs, opset):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 3, 50)) * 4).astype(np.float32)
    x[0, 0, :6] = [0.0, -3.0, 3.0, 90.0, -90.0, 1e-8]  # kinks, saturation, overflow-prone values
    model = _model(op, attrs, opset)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    notes: list[str] = []
    synthetic: set[str] = set()
    decompose(model, notes, synthetic)
    assert notes and op in notes[0] and f"/act/{op}" in notes[0]
    assert all(n.op_type != op for n in model.graph.node), [n.op_type for n in model.graph.node]
    assert all(has_gradient(n) for n in model.graph.node), [n.op_type for n in model.graph.node]
    assert synthetic == {t.name for t in model.graph.initializer} - {"slope", "row"}
    onnx.checker.check_model(model, full_check=True)
    got = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.slow
@pytest.mark.parametrize(("op", "attrs", "opset"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_onnxruntime_training_builds_the_decomposed_model(op, attrs, opset, tmp_path):
    """w + x -> op -> y with w trained: the prepared model's artifacts build."""
    model = _model(op, attrs, opset)
    node = model.graph.node[0]
    node.input[0] = "xw"
    model.graph.initializer.append(numpy_helper.from_array(np.full((4, 3, 50), 0.1, np.float32), "w"))
    model.graph.node.insert(0, helper.make_node("Add", ["x", "w"], ["xw"], name="/add"))
    fm = prepare_forward(model, op.lower(), "mse")
    assert "w" in fm.trainable and not [n for n in fm.trainable if n.startswith(f"/act/{op}")]
    art.build_artifacts(fm, None, optimizer="sgd", cache_dir=tmp_path)


def test_every_decomposition_is_covered():
    assert {c[0] for c in CASES} == set(DECOMPOSITIONS)


def test_an_op_with_a_gradient_is_left_alone():
    model = _model("LeakyRelu", {}, 17)
    notes: list[str] = []
    decompose(model, notes, set())
    assert notes == [] and [n.op_type for n in model.graph.node] == ["LeakyRelu"]
