"""ONNX Runtime reference runner and seeded step data, checked against a numpy restatement."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.training import artifacts

from onnxplan.data import InputSpec, make_step_batch, read_input_specs
from onnxplan.errors import ModelError
from onnxplan.verification.reference import OPTIMIZER_MODEL, run_reference

BATCH, N_IN, N_HIDDEN, N_OUT = 6, 4, 5, 3
DEFAULT_LR = 1e-3  # onnxruntime.training.api.Optimizer's initial learning rate


def mlp_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    shapes = {"W1": (N_IN, N_HIDDEN), "b1": (N_HIDDEN,), "W2": (N_HIDDEN, N_OUT), "b2": (N_OUT,)}
    return {name: (0.5 * rng.standard_normal(shape)).astype(np.float32) for name, shape in shapes.items()}


def build_mlp_artifacts(root, loss: str, optimizer: str, frozen: list[str]) -> None:
    """x -> MatMul W1 -> Add b1 -> Relu -> MatMul W2 -> Add b2, with generate_artifacts + onnxplan.json."""
    onnxruntime.set_default_logger_severity(3)
    weights = mlp_weights()
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", N_IN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", N_OUT])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    root.mkdir(parents=True, exist_ok=True)
    trainable = [name for name in weights if name not in frozen]
    artifacts.generate_artifacts(
        model,
        requires_grad=trainable,
        frozen_params=frozen,
        loss=artifacts.LossType.CrossEntropyLoss if loss == "ce" else artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.SGD if optimizer == "sgd" else artifacts.OptimType.AdamW,
        artifact_directory=str(root),
    )
    if loss == "ce":
        labels = {"name": "labels", "dtype": "int64", "shape": [BATCH], "low": 0, "high": N_OUT}
    else:
        labels = {"name": "target", "dtype": "float32", "shape": [BATCH, N_OUT], "low": -1, "high": 1}
    meta = {
        "schema_version": 1,
        "model": "tiny_mlp",
        "batch": BATCH,
        "loss": loss,
        "optimizer": optimizer,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [BATCH, N_IN], "low": -1, "high": 1}],
        "labels": labels,
        "trainable": trainable,
        "frozen": frozen,
        "content_hash": "test",
    }
    (root / "onnxplan.json").write_text(json.dumps(meta))


def numpy_mlp_grads(params, x, y, loss: str) -> tuple[float, dict[str, np.ndarray]]:
    """Loss and gradients of one forward/backward pass, in float64, written out by hand."""
    p = {name: value.astype(np.float64) for name, value in params.items()}
    x = x.astype(np.float64)
    h = x @ p["W1"] + p["b1"]
    r = np.maximum(h, 0.0)
    z = r @ p["W2"] + p["b2"]
    if loss == "ce":  # SoftmaxCrossEntropyLoss, mean over the batch
        e = np.exp(z - z.max(axis=1, keepdims=True))
        prob = e / e.sum(axis=1, keepdims=True)
        value = -np.mean(np.log(prob[np.arange(len(y)), y]))
        dz = prob.copy()
        dz[np.arange(len(y)), y] -= 1.0
        dz /= len(y)
    else:  # MSELoss: mean over every element
        value = np.mean((z - y) ** 2)
        dz = 2.0 * (z - y) / z.size
    dh = (dz @ p["W2"].T) * (h > 0)
    grads = {"W1": x.T @ dh, "b1": dh.sum(axis=0), "W2": r.T @ dz, "b2": dz.sum(axis=0)}
    return float(value), grads


def numpy_update(params, grads, optimizer: str, lr: float, frozen: list[str]) -> dict[str, np.ndarray]:
    """The first optimizer step: SGD (w -= lr*g) or ORT's AdamW (adam_mode=1, bias-corrected, t=1)."""
    alpha, beta, eps = 0.9, 0.999, 1e-6  # generate_artifacts' AdamW attributes
    out = {}
    for name, value in params.items():
        w = value.astype(np.float64)
        if name in frozen:
            out[name] = w
            continue
        g = grads[name]
        if optimizer == "sgd":
            out[name] = w - lr * g
        else:
            m, v = (1 - alpha) * g, (1 - beta) * g * g
            step_size = lr * np.sqrt(1 - beta) / (1 - alpha)
            out[name] = w - step_size * m / (np.sqrt(v) + eps)
    return out


CASES = {
    "ce_sgd": ("ce", "sgd", []),
    "mse_adamw": ("mse", "adamw", ["b1"]),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def mlp_case(request, tmp_path_factory):
    loss, optimizer, frozen = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    build_mlp_artifacts(root, loss, optimizer, frozen)
    return root, loss, optimizer, frozen


@pytest.mark.parametrize("lr", [None, 0.5])
def test_first_step_matches_numpy(mlp_case, lr):
    root, loss, optimizer, frozen = mlp_case
    inputs, labels = read_input_specs(root)
    batch = make_step_batch(inputs, labels, seed=0, step=0)
    params0 = mlp_weights()
    want_loss, grads = numpy_mlp_grads(params0, batch["x"], batch[labels.name], loss)
    want = numpy_update(params0, grads, optimizer, lr or DEFAULT_LR, frozen)

    got = run_reference(root, steps=1, seed=0, learning_rate=lr)

    assert got.losses[0] == pytest.approx(want_loss, rel=1e-5)
    assert sorted(got.params) == sorted(params0)  # trainable and frozen
    for name, value in got.params.items():
        assert value.dtype == np.float32
        np.testing.assert_allclose(value, want[name], rtol=1e-5, atol=1e-7, err_msg=name)
        # the update itself, not just the (mostly unchanged) weights
        # float32 weights: allow two ulps of the weight on top of 1e-5 of the update
        delta, want_delta = value - params0[name], want[name] - params0[name]
        tolerance = 1e-5 * np.abs(want_delta) + 2 * np.spacing(np.abs(params0[name]))
        assert np.all(np.abs(delta - want_delta) <= tolerance), name
    for name in frozen:
        np.testing.assert_array_equal(got.params[name], params0[name])


def test_runs_are_deterministic_and_warmup_changes_nothing(mlp_case):
    root = mlp_case[0]
    first = run_reference(root, steps=3, seed=1)
    second = run_reference(root, steps=3, seed=1, warmup=2)
    assert len(first.losses) == len(first.step_seconds) == 3
    assert all(np.isfinite(first.losses)) and all(s > 0 for s in second.step_seconds)
    assert first.losses == second.losses
    for name in first.params:
        np.testing.assert_array_equal(first.params[name], second.params[name])
    assert run_reference(root, steps=3, seed=2).losses != first.losses


def test_optimizer_model_ir_is_patched_not_touched(mlp_case):
    root = mlp_case[0]
    assert onnx.load(root / OPTIMIZER_MODEL).ir_version > 10  # as generate_artifacts wrote it
    run_reference(root, steps=1)
    assert onnx.load(root / OPTIMIZER_MODEL).ir_version > 10  # the patch went to a scratch copy


def test_step_batch_is_seeded_and_in_range():
    x = InputSpec("x", "float32", (64, 8), low=-2.0, high=3.0)
    y = InputSpec("y", "int64", (64,), low=0, high=10)
    a, b = make_step_batch([x], y, seed=3, step=1), make_step_batch([x], y, seed=3, step=1)
    for name in ("x", "y"):
        np.testing.assert_array_equal(a[name], b[name])
    assert a["x"].dtype == np.float32 and a["x"].shape == (64, 8)
    assert a["y"].dtype == np.int64 and a["y"].shape == (64,)
    assert a["x"].min() >= -2.0 and a["x"].max() < 3.0
    assert a["y"].min() >= 0 and a["y"].max() < 10
    other_step = make_step_batch([x], y, seed=3, step=2)
    other_seed = make_step_batch([x], y, seed=4, step=1)
    assert not np.array_equal(a["x"], other_step["x"]) and not np.array_equal(a["x"], other_seed["x"])
    # an input's data does not depend on which other inputs are listed
    z = InputSpec("z", "float32", (3,), 0.0, 1.0)
    np.testing.assert_array_equal(make_step_batch([z, x], y, seed=3, step=1)["x"], a["x"])


def test_bad_artifact_folder_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="onnxplan.json"):
        read_input_specs(tmp_path)
    (tmp_path / "onnxplan.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ModelError, match="schema_version"):
        read_input_specs(tmp_path)


def test_truncated_model_is_a_model_error(mlp_case, tmp_path):
    root = mlp_case[0]
    for path in root.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "training_model.onnx").write_bytes((root / "training_model.onnx").read_bytes()[:100])
    with pytest.raises(ModelError, match=r"onnxruntime refused the artifacts: Protobuf parsing failed\. \(loading training_model.onnx\)"):
        run_reference(tmp_path, steps=1)
