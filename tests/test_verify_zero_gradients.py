"""A gradient that is exactly 0 on both sides passes its check and says nothing: verification
names such parameters (a fresh EfficientNet-B0 at 224x224 underflows to 0 before its classifier,
reports/verify-faults-full.md), and says nothing where every gradient carries a value."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

from onnxplan.executor.prepare import prepare
from onnxplan.loading.request import LoadRequest
from onnxplan.planning import PlanOptions
from onnxplan.verification.report import describe_verification
from onnxplan.verification.step_check import verify_run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _relu_mlp(path, bias: float) -> str:
    """x -> Gemm(w1, b1) -> Relu -> Gemm(w2, b2): with b1 = -100 the Relu passes nothing, so w1,
    b1 and w2 get a gradient of exactly 0 on any runtime; only b2 learns."""
    rng = np.random.default_rng(3)
    init = [numpy_helper.from_array(rng.normal(0, 0.1, (8, 16)).astype(np.float32), "w1"),
            numpy_helper.from_array(np.full(16, bias, np.float32), "b1"),
            numpy_helper.from_array(rng.normal(0, 0.3, (16, 4)).astype(np.float32), "w2"),
            numpy_helper.from_array(np.zeros(4, np.float32), "b2")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "dead", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def _text(v) -> str:
    console = Console(width=200, record=True)
    for r in describe_verification(v.as_dict()):
        console.print(r)
    return console.export_text()


def test_parameters_with_zero_gradients_are_named(tmp_path):
    prep = prepare(LoadRequest(_relu_mlp(tmp_path / "dead.onnx", -100.0), 4, "sgd", "mse"), PlanOptions())
    v = verify_run(prep, steps=1)
    assert v.ok, v.summary()
    assert set(v.steps[0].zero_gradients) == {"w1", "b1", "w2"} and v.parameters == 4
    text = _text(v)
    assert "3 of 4 parameter(s) got a gradient of exactly 0 on both sides" in text, text


def test_no_note_where_every_gradient_carries_a_value(tmp_path):
    prep = prepare(LoadRequest(_relu_mlp(tmp_path / "live.onnx", 0.5), 4, "sgd", "mse"), PlanOptions())
    v = verify_run(prep, steps=1)
    assert v.ok and v.steps[0].zero_gradients == ()
    assert "exactly 0" not in _text(v)
