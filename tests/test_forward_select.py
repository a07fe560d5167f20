"""Which initializers a forward model trains: backward reachability over differentiable
inputs, --train/--freeze globs, and a refusal naming an op without a gradient on the path."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxplan.errors import ModelError, UsageError
from onnxplan.forward.decompose import value_types
from onnxplan.forward.select import TORCH_KIND, select_parameters


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _bn_mlp():
    """x[2,4,3,3] -> Conv(w,b) -> BN(scale, bias, mean, var; train) -> Reshape(shape) -> MatMul(fc)
    -> Mul(scalar) -> Pow(exponent) -> y, plus a Gather with int indices on a float table."""
    f32 = np.float32
    inits = [
        _init("conv.w", np.ones((4, 4, 1, 1), f32)), _init("conv.b", np.zeros(4, f32)),
        _init("bn.scale", np.ones(4, f32)), _init("bn.bias", np.zeros(4, f32)),
        _init("bn.running_mean", np.zeros(4, f32)), _init("bn.running_var", np.ones(4, f32)),
        _init("shape", np.array([2, 36], np.int64)), _init("fc", np.ones((36, 5), f32)),
        _init("half", np.array(0.5, f32)), _init("exponent", np.array([2.0], f32)),
        _init("table", np.ones((5, 5), f32)), _init("idx", np.array([0, 1], np.int64)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], name="/conv"),
        helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.running_mean",
                                                "bn.running_var"], ["n", "rm", "rv"], name="/bn",
                         training_mode=1),
        helper.make_node("Reshape", ["n", "shape"], ["r"], name="/flat"),
        helper.make_node("MatMul", ["r", "fc"], ["m"], name="/fc"),
        helper.make_node("Mul", ["m", "half"], ["h"], name="/scale"),
        helper.make_node("Gather", ["table", "idx"], ["g"], name="/gather"),
        helper.make_node("Add", ["h", "g"], ["a"], name="/add"),
        helper.make_node("Pow", ["a", "exponent"], ["y"], name="/pow"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def _select(model, train=None, freeze=None):
    return select_parameters(model, value_types(model), train, freeze)


def test_only_parameters_reaching_the_loss_are_trained():
    sel = _select(_bn_mlp())
    assert sel.trained == ["conv.w", "conv.b", "bn.scale", "bn.bias", "fc", "table"]
    assert sel.frozen == ["bn.running_mean", "bn.running_var"]
    # shape constant, 0-d scalar, Pow exponent and int indices stay constants
    assert set(sel.constants) == {"shape", "half", "exponent", "idx"}


def test_train_restricts_and_freeze_excludes():
    sel = _select(_bn_mlp(), train=["conv.*", "fc"])
    assert sel.trained == ["conv.w", "conv.b", "fc"]
    assert sel.frozen == ["bn.scale", "bn.bias", "bn.running_mean", "bn.running_var", "table"]
    sel = _select(_bn_mlp(), freeze=["bn.*", "table"])
    assert sel.trained == ["conv.w", "conv.b", "fc"]
    assert "bn.scale" in sel.frozen and "table" in sel.frozen


@pytest.mark.parametrize(("train", "freeze", "needle"), [
    (["nosuch*"], None, "--train 'nosuch*' matches no initializer"),
    (None, ["nope"], "--freeze 'nope' matches no initializer"),
    (["idx"], None, "matches no float initializer that reaches the loss"),
])
def test_bad_globs_are_usage_errors(train, freeze, needle):
    with pytest.raises(UsageError, match=needle.replace("*", r"\*")):
        _select(_bn_mlp(), train, freeze)


def test_everything_frozen_is_one_line():
    with pytest.raises(ModelError, match="nothing to train"):
        _select(_bn_mlp(), freeze=["*"])


def test_op_without_gradient_on_the_path_is_named():
    model = _bn_mlp()
    model.graph.node[4].op_type = "Acos"  # /scale: Mul -> Acos (one input)
    del model.graph.node[4].input[1:]
    with pytest.raises(ModelError) as exc:
        _select(model)
    assert str(exc.value).startswith("onnxruntime-training 1.19.2 has no gradient for Acos (node /scale)")
    # freezing everything before it takes it off the path
    sel = _select(model, freeze=["conv.*", "bn.*", "fc"])
    assert sel.trained == ["table"]


def test_dynamo_annotations_keep_buffers_out():
    model = _bn_mlp()
    for name, kind in (("conv.w", "PARAMETER"), ("conv.b", "PARAMETER"), ("fc", "PARAMETER"),
                       ("table", "BUFFER"), ("bn.scale", "PARAMETER"), ("bn.bias", "PARAMETER")):
        vi = model.graph.value_info.add()
        vi.name = name
        vi.metadata_props.add(key=TORCH_KIND, value=kind)
    sel = _select(model)
    assert sel.trained == ["conv.w", "conv.b", "bn.scale", "bn.bias", "fc"]
    assert "table" in sel.constants
    # a 0-d PARAMETER trains; an unannotated (folded) weight trains
    vi = model.graph.value_info.add()
    vi.name = "half"
    vi.metadata_props.add(key=TORCH_KIND, value="PARAMETER")
    del model.graph.value_info[0]  # conv.w loses its annotation, as a weight the optimizer folded
    assert _select(model).trained == ["conv.w", "conv.b", "bn.scale", "bn.bias", "fc", "half"]
