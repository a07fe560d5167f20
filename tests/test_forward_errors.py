"""Forward models onnxruntime-training cannot train: one untruncated line naming the op or the
cause, exit 2, and an ORT build failure cached so the next command fails fast the same way."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import onnxplan.loading.artifacts as art
from onnxplan import settings
from onnxplan.cli.app import app

runner = CliRunner()


def _forward(path: Path, act: tuple[str, str], opset: int = 17, on_path: bool = True) -> Path:
    """y = act(x @ w) (on the gradient path) or y = x @ w + act(x) (off it), x [batch, 4]."""
    domain, op = act
    w = numpy_helper.from_array(np.full((4, 3), 0.1, np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="/fc/MatMul")]
    if on_path:
        nodes.append(helper.make_node(op, ["m"], ["y"], name="/features/3/act", domain=domain))
    else:
        nodes += [helper.make_node(op, ["x"], ["a"], name="/side/act", domain=domain),
                  helper.make_node("ReduceMean", ["a"], ["s"], name="/side/mean", keepdims=1, axes=[1]),
                  helper.make_node("Add", ["m", "s"], ["y"], name="/add")]
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=imports)
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _fails(path: Path, needle: str) -> str:
    res = runner.invoke(app, ["plan", str(path), "--batch", "2", "--loss", "mse"])
    assert res.exit_code == 2, (res.stdout, res.stderr)
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("onnxplan: error: ") and needle in err, err
    assert "Traceback" not in res.stdout + res.stderr and "onnxruntime::" not in err
    return err


@pytest.mark.parametrize(("act", "opset", "needle"), [
    (("", "Acos"), 17, "onnxruntime-training 1.19.2 has no gradient for Acos (node /features/3/act)"),
    (("my.ops", "Foo"), 17, "unknown custom op my.ops::Foo (node /features/3/act)"),
    (("", "Relu"), 30, "ai.onnx opset 30 is newer than any this onnxplan knows"),
])
def test_untrainable_forward_model_is_one_line(act, opset, needle, tmp_path, monkeypatch):
    """onnxplan refuses these itself, before onnxruntime-training builds anything: no build runs,
    nothing is cached, and the second command fails the same way (as fast: there is no build to
    skip). The ORT build failures onnxplan cannot foresee are cached: the test below."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ONNXPLAN_CACHE", str(cache))
    settings.reload()  # the environment changed: read it again

    def no_build(*args, **kwargs):
        raise AssertionError("generate_artifacts called for a model onnxplan refuses itself")

    monkeypatch.setattr(art, "_run_generate_artifacts", no_build)
    path = _forward(tmp_path / "net.onnx", act, opset)
    first = _fails(path, needle)
    assert _fails(path, needle) == first
    assert not cache.exists() or not os.listdir(cache), os.listdir(cache)


def test_ort_build_failure_is_cached(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ONNXPLAN_CACHE", str(cache))
    settings.reload()  # the environment changed: read it again
    # a com.microsoft op ORT does not have, off the gradient path: only ORT itself can refuse it
    path = _forward(tmp_path / "net.onnx", ("com.microsoft", "NoSuchOp"), on_path=False)
    first = _fails(path, "NoSuchOp")
    assert "could not build the training graph of 'net'" in first
    [failed] = [p for p in cache.iterdir() if p.name.endswith(art.FAILED_SUFFIX)]
    assert failed.read_text().strip() in first

    def no_second_build(*args, **kwargs):
        raise AssertionError("generate_artifacts called again for a cached failure")

    monkeypatch.setattr(art, "_run_generate_artifacts", no_second_build)
    assert _fails(path, "NoSuchOp") == first
    assert not [p for p in cache.iterdir() if p.is_dir()], os.listdir(cache)
