"""The PyTorch eager peer: same weights, same loss: its first loss equals ONNX Runtime's on every zoo model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from onnxplan.errors import UnsupportedOpError
from onnxplan.torch_peer import OnnxModule, make_optimizer, run_torch
from onnxplan.verification.reference import run_reference
from tests.zoo_small import SMALL, slow_if_large, small_artifacts


@pytest.mark.parametrize("name", slow_if_large(SMALL))
def test_first_loss_matches_onnxruntime(name):
    folder = small_artifacts(name)
    ours = run_torch(folder, steps=2)
    ref = run_reference(folder, steps=2)
    np.testing.assert_allclose(ours["losses"][0], ref.losses[0], rtol=1e-4)
    # the updates are equivalent too: the second step's loss stays close (Adam's first step is
    # about lr * sign(gradient), so float32 rounding of near-zero gradients shows: vgg16 ~3%)
    np.testing.assert_allclose(ours["losses"][1], ref.losses[1], rtol=5e-2, atol=1e-4)


def test_weights_are_the_onnx_initializers_and_only_trainable_ones_get_gradients():
    from tests.zoo_small import small

    fm = small("mlp-frozen")
    module = OnnxModule(fm.model, fm.trainable)
    names = {t.name for t in fm.model.graph.initializer}
    assert {p for p in fm.trainable} <= names
    assert sum(p.numel() for p in module.parameters()) == sum(
        int(np.prod(t.dims)) for t in fm.model.graph.initializer if t.name in fm.trainable)
    w = onnx.numpy_helper.to_array(next(t for t in fm.model.graph.initializer if t.name == "fc1.weight"))
    np.testing.assert_array_equal(module.tensor("fc1.weight").detach().numpy(), w)
    assert not module.tensor("fc2.weight").requires_grad


def test_optimizer_matches_the_artifacts_defaults():
    p = [torch.nn.Parameter(torch.zeros(2))]
    adamw = make_optimizer("adamw", p)
    assert adamw.defaults["lr"] == 1e-3 and adamw.defaults["eps"] == 1e-6 and adamw.defaults["weight_decay"] == 0
    assert make_optimizer("sgd", p).defaults["lr"] == 1e-3


@pytest.mark.parametrize("user_cache", [False, True])
def test_a_torch_step_leaves_nothing_in_tmpdir(tmp_path, user_cache):
    """A torch optimizer imports torch._dynamo, whose import made an empty
    $TMPDIR/torchinductor_<user> in every bench with the torch peer; a fresh process (this one has
    imported torch._dynamo already) trains two steps under a TMPDIR of its own."""
    folder = small_artifacts("mlp")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["TMPDIR"] = str(tmp)
    if user_cache:  # a cache folder the user chose is torch's to use and stays set
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    code = ("import json, os, sys; from onnxplan.torch_peer import run_torch; "
            f"run_torch({str(folder)!r}, steps=2); "
            "print(json.dumps(['torch._dynamo' in sys.modules, os.environ.get('TORCHINDUCTOR_CACHE_DIR')]))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    dynamo, cache_dir = json.loads(res.stdout.splitlines()[-1])
    assert dynamo  # the import that made the folder did run
    assert os.listdir(tmp) == []
    assert cache_dir == (str(tmp_path / "inductor") if user_cache else None)


def test_unknown_op_is_refused_in_one_line():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    g = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"])], "g", [x], [y])
    with pytest.raises(UnsupportedOpError, match="Hardmax"):
        OnnxModule(helper.make_model(g), [])
