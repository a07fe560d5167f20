"""The model zoo: every model builds, is valid ONNX, and matches its documented shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxplan.errors import UsageError
from onnxplan.forward.spec import ForwardModel, InputSpec
from onnxplan.models import (
    build_forward,
    build_gpt,
    build_transformer,
    get_model,
    list_models,
)

ZOO = [spec.name for spec in list_models()]

# name -> (input shapes at the default batch, label shape, label dtype, parameter count)
DOCUMENTED = {
    "mlp": ([(64, 784)], (64,), "int64", 235_146),
    "mlp-frozen": ([(64, 784)], (64,), "int64", 235_146),
    "nnt-linear": ([(64, 150528)], (64, 300), "float32", 45_158_700),
    "nnt-conv2d": ([(64, 3, 224, 224)], (64, 3, 112, 112), "float32", 84),
    "nnt-fc3": ([(2048, 784)], (2048, 100), "float32", 6_438_756),
    "nnt-fc3-frozen": ([(2048, 784)], (2048, 100), "float32", 6_438_756),
    "nnt-conv-ac-fl": ([(64, 3, 224, 224)], (64, 37632), "float32", 84),
    "vgg16": ([(64, 3, 32, 32)], (64,), "int64", 14_914_378),
    "resnet18": ([(64, 3, 32, 32)], (64,), "int64", 11_183_562),
    "transformer": ([(16, 64)], (16,), "int64", 534_282),
    "gpt": ([(16, 64)], (1024,), "int64", 661_992),
}


def _static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = vi.type.tensor_type.shape.dim
    assert all(d.HasField("dim_value") for d in dims), f"{vi.name} has a symbolic dim"
    return tuple(d.dim_value for d in dims)


def test_zoo_lists_every_documented_model():
    assert set(ZOO) == set(DOCUMENTED)
    for spec in list_models():
        assert spec.default_loss in ("ce", "mse")
        assert spec.default_optimizer in ("adamw", "sgd")
        assert spec.default_batch > 0 and spec.description
        assert get_model(spec.name) is spec


def test_nntrainer_cases_default_to_mse_and_sgd():
    for name in ("nnt-linear", "nnt-conv2d", "nnt-fc3", "nnt-conv-ac-fl"):
        spec = get_model(name)
        assert (spec.default_loss, spec.default_optimizer) == ("mse", "sgd")


def test_unknown_model_names_the_known_ones():
    with pytest.raises(UsageError, match=r"unknown model 'nope'; known: mlp, "):
        get_model("nope")
    with pytest.raises(UsageError):
        build_forward("nope")


@pytest.mark.parametrize("name", ZOO)
def test_model_builds_and_checks(name):
    fm = build_forward(name, batch=2)
    assert isinstance(fm, ForwardModel) and fm.name == name
    onnx.checker.check_model(fm.model, full_check=True)
    assert fm.model.ir_version == 9
    assert {(o.domain, o.version) for o in fm.model.opset_import} == {("", 17)}
    graph = fm.model.graph
    inits = {t.name for t in graph.initializer}
    assert fm.trainable and set(fm.trainable) <= inits and set(fm.frozen) <= inits
    assert not set(fm.trainable) & set(fm.frozen)
    data_inputs = [vi for vi in graph.input if vi.name not in inits]
    assert [vi.name for vi in data_inputs] == [s.name for s in fm.inputs]
    for vi, spec in zip(data_inputs, fm.inputs):
        assert _static_shape(vi) == spec.shape and spec.shape[0] == 2
    assert len(graph.output) == 1
    out_shape = _static_shape(graph.output[0])
    if fm.loss == "ce":
        assert fm.labels == InputSpec("labels", "int64", (out_shape[0],), 0, out_shape[1])
    else:
        assert fm.labels.shape == out_shape and fm.labels.dtype == "float32"


@pytest.mark.parametrize("name", ZOO)
def test_default_shapes_and_parameter_counts(name):
    spec = get_model(name)
    fm = build_forward(name)
    shapes, label_shape, label_dtype, params = DOCUMENTED[name]
    assert [s.shape for s in fm.inputs] == shapes
    assert fm.inputs[0].shape[0] == spec.default_batch
    assert (fm.labels.shape, fm.labels.dtype) == (label_shape, label_dtype)
    assert fm.loss == spec.default_loss
    assert fm.parameter_count == params


def test_builds_are_deterministic():
    a, b = build_forward("resnet18", batch=2), build_forward("resnet18", batch=2)
    assert a.model.SerializeToString() == b.model.SerializeToString()


def test_frozen_models_freeze_the_middle_layer():
    fm = build_forward("mlp-frozen")
    assert fm.frozen == ["fc2.weight", "fc2.bias"]
    assert fm.trainable == ["fc1.weight", "fc1.bias", "fc3.weight", "fc3.bias"]
    assert build_forward("nnt-fc3-frozen", batch=2).frozen == ["fc2.weight", "fc2.bias"]
    assert build_forward("mlp").frozen == []


def test_resnet18_batchnorm_is_training_mode_with_three_outputs():
    fm = build_forward("resnet18", batch=2)
    bns = [n for n in fm.model.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == 20
    for node in bns:
        assert len(node.output) == 3
        assert onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "training_mode")) == 1
    assert any(n.op_type == "GlobalAveragePool" for n in fm.model.graph.node)
    assert sum(n.op_type == "Add" for n in fm.model.graph.node) == 8  # one residual per block


def test_transformer_uses_plain_opset17_ops():
    fm = build_transformer(batch=2, layers=3)
    ops = {n.op_type for n in fm.model.graph.node}
    assert {"Gather", "MatMul", "Softmax", "Transpose", "Reshape", "LayerNormalization", "Erf"} <= ops
    lns = [n for n in fm.model.graph.node if n.op_type == "LayerNormalization"]
    assert len(lns) == 2 * 3 + 1 and all(len(n.output) == 3 for n in lns)
    assert fm.inputs[0].dtype == "int64" and fm.inputs[0].high == 1000


def test_transformer_24_layers_builds_quickly():
    fm = build_transformer(batch=2, layers=24)
    onnx.checker.check_model(fm.model, full_check=True)
    assert sum(n.op_type == "Softmax" for n in fm.model.graph.node) == 24
    assert fm.name == "transformer-24l"


def test_gpt_has_a_causal_mask_and_token_level_labels():
    fm = build_gpt(batch=2, seq=8)
    mask = next(t for t in fm.model.graph.initializer if t.name == "causal_mask")
    m = onnx.numpy_helper.to_array(mask)
    assert m.shape == (8, 8) and np.all(np.tril(m) == 0) and np.all(m[np.triu_indices(8, 1)] < -1e8)
    assert "causal_mask" not in fm.trainable
    assert fm.labels.shape == (16,) and fm.labels.high == 1000


def test_loss_override_changes_labels():
    fm = build_forward("mlp", batch=4, loss="mse")
    assert fm.loss == "mse" and fm.labels == InputSpec("target", "float32", (4, 10), 0.0, 1.0)
    fm = build_forward("nnt-fc3", batch=4, loss="ce")
    assert fm.labels == InputSpec("labels", "int64", (4,), 0, 100)
    with pytest.raises(UsageError, match="ce"):
        build_forward("nnt-conv2d", batch=2, loss="ce")
    with pytest.raises(UsageError, match="unknown loss"):
        build_forward("mlp", loss="hinge")
    with pytest.raises(UsageError, match="batch"):
        build_forward("mlp", batch=0)


def test_input_spec_sampling_is_seeded_and_in_range():
    ids = InputSpec("ids", "int64", (4, 8), 0, 5)
    a, b = ids.sample(np.random.default_rng(1)), ids.sample(np.random.default_rng(1))
    assert a.dtype == np.int64 and a.shape == (4, 8) and np.array_equal(a, b)
    assert a.min() >= 0 and a.max() < 5
    x = InputSpec("x", "float32", (100,), -1.0, 1.0).sample(np.random.default_rng(0))
    assert x.dtype == np.float32 and x.min() >= -1.0 and x.max() < 1.0
    assert InputSpec.from_dict(ids.to_dict()) == ids
