"""The gradient table against the installed onnxruntime-training, and ORT failures as one
untruncated line naming the cause (generate_artifacts and the runtime's load refusals)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxplan.loading.artifacts as art
from onnxplan.errors import ModelError
from onnxplan.forward.gradients import GRADIENT_OPS, ZERO_GRADIENT_OPS
from onnxplan.forward.spec import ForwardModel, InputSpec, labels_for_output
from onnxplan.ort import ort_cause
from tests.zoo_small import small_artifacts

UNARY = ["Abs", "Acos", "Asin", "Atan", "Cos", "Cosh", "Elu", "Erf", "Exp", "HardSigmoid", "HardSwish",
         "Identity", "LeakyRelu", "Log", "Neg", "Reciprocal", "Relu", "Selu", "Sigmoid", "Sin", "Sinh",
         "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "Celu", "ThresholdedRelu", "Shrink"]


def _unary_fm(op: str) -> ForwardModel:
    """x + w -> op -> y, w trained: ORT needs op's gradient."""
    w = numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"),
             helper.make_node(op, ["a"], ["y"], name=f"/features/{op}")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return ForwardModel(op.lower(), model, ["w"], [], [InputSpec("x", "float32", (2, 3), -1, 1)],
                        labels_for_output((2, 3), "mse"), "mse")


@pytest.mark.parametrize("op", UNARY)
def test_gradient_table_matches_the_installed_onnxruntime_training(op, tmp_path):
    """The table says what ORT does: it builds the artifacts exactly for the ops listed, and
    for the others it fails with the one line naming op and node."""
    fm = _unary_fm(op)
    if op in GRADIENT_OPS:
        art.build_artifacts(fm, None, optimizer="sgd", cache_dir=tmp_path)
        return
    assert op not in ZERO_GRADIENT_OPS
    with pytest.raises(ModelError) as exc:
        art.build_artifacts(fm, None, optimizer="sgd", cache_dir=tmp_path)
    assert str(exc.value) == (f"onnxruntime-training could not build the training graph of '{op.lower()}': "
                              f"onnxruntime-training 1.19.2 has no gradient for {op} (node /features/{op})")


def test_ort_cause_drops_locations_and_signatures():
    raw = ("/onnxruntime_src/orttraining/orttraining/core/graph/gradient_builder_base.h:123 "
           "onnxruntime::training::ArgDef onnxruntime::training::GradientBuilderBase::O(size_t, bool) const "
           "i < node_->OutputDefs().size() was false. ")
    assert ort_cause(raw) == ("internal check failed: i < node_->OutputDefs().size() "
                              "(gradient_builder_base.h:123)")
    long_reason = "x" * 700
    raw = ("[ONNXRuntimeError] : 1 : FAIL : /onnxruntime_src/a/b.cc:9 void f(int) cond was false. "
           f"{long_reason}")
    assert ort_cause(raw) == long_reason  # never truncated
    assert ort_cause("[ONNXRuntimeError] : 10 : INVALID_GRAPH : No Op registered for Foo with domain_version "
                     "of 1 ==> Context: Bad node spec for node. Name: n7 OpType: Foo").startswith(
        "onnxruntime has no operator Foo for opset 1 of its domain (node n7)")


def _tampered(tmp_path: Path, change) -> Path:
    folder = tmp_path / "art"
    shutil.copytree(small_artifacts("mlp", "sgd"), folder)
    change(folder)
    return folder


def _opset30(folder: Path) -> None:
    model = onnx.load(str(folder / "training_model.onnx"))
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = 30
    onnx.save(model, str(folder / "training_model.onnx"))


def _custom_op(folder: Path) -> None:
    model = onnx.load(str(folder / "training_model.onnx"))
    model.graph.node[0].domain, model.graph.node[0].op_type = "my.ops", "Foo"
    model.opset_import.add(domain="my.ops", version=1)
    onnx.save(model, str(folder / "training_model.onnx"))


def _bad_checkpoint(folder: Path) -> None:
    (folder / "checkpoint").write_bytes(b"not a checkpoint" * 8)


@pytest.mark.parametrize(("change", "cause"), [
    (_opset30, "opset 30 of ai.onnx is newer than onnxruntime 1.19.2 supports (at most 21)"),
    (_custom_op, "unknown custom op my.ops::Foo: onnxruntime 1.19.2 has no kernel for it"),
    (_bad_checkpoint, "unreadable checkpoint"),
])
def test_runtime_refusals_name_the_cause(change, cause, tmp_path):
    from onnxplan.verification.reference import run_reference

    folder = _tampered(tmp_path, change)
    with pytest.raises(ModelError) as exc:
        run_reference(folder, steps=1)
    text = str(exc.value)
    assert cause in text and "\n" not in text
    assert "onnxruntime::" not in text and "/onnxruntime_src" not in text


def test_ort_cause_names_op_and_node_without_a_kernel():
    raw = ("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for "
           "ArgMax(13) node with name '/inner/ArgMax'")
    assert ort_cause(raw) == ("onnxruntime 1.19.2 (CPU) has no kernel for ArgMax-13 on the input types "
                              "of node /inner/ArgMax")
