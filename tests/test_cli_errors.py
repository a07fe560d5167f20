"""Bad input ends in one line on stderr, a documented exit code, and nothing written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxplan.cli.app import app
from tests.cli_asserts import assert_one_line_error

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


_assert_one_line_error = assert_one_line_error


def _cache_entries() -> set[str]:
    root = Path(os.environ["ONNXPLAN_CACHE"])
    return {p.name for p in root.iterdir()} if root.exists() else set()


def _forward(path: Path, batch_dim="batch", ir_version=9) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((6, 3)).astype(np.float32), "W")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 3])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = ir_version
    path.write_bytes(m.SerializeToString())
    return path


@pytest.fixture(scope="module")
def mlp_artifacts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mlp-art")
    result = _run("models", "build", "mlp", "--batch", "4", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    return out


def _plan_case(tmp_path: Path, model: str, needle: str, code: int = 2, *extra: str) -> None:
    before = _cache_entries()
    out = tmp_path / "plan.json"
    _assert_one_line_error(_run("plan", model, "-o", str(out), *extra), code, needle)
    assert not out.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".plan.json")] == []
    assert _cache_entries() == before  # nothing generated into the artifact cache either


def test_missing_path(tmp_path):
    _plan_case(tmp_path, str(tmp_path / "nope" / "model.onnx"), "no such file")


def test_unknown_name(tmp_path):
    _plan_case(tmp_path, "resnet1800", "neither a file, an artifact folder nor a zoo model")


def test_directory_without_artifacts(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    _plan_case(tmp_path, str(d), "not an artifact folder (missing training_model.onnx")


def test_not_onnx(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("these are not the bytes you are looking for\n")
    _plan_case(tmp_path, str(p), "not an ONNX model or truncated")


def test_truncated(tmp_path):
    full = _forward(tmp_path / "full.onnx").read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(full[: len(full) // 2])
    _plan_case(tmp_path, str(p), "not an ONNX model or truncated")


def test_ir_version_refused(tmp_path):
    p = _forward(tmp_path / "new.onnx", batch_dim=4, ir_version=14)
    _plan_case(tmp_path, str(p), "IR version 14 is newer than ONNX Runtime 1.19.2 accepts")


def test_ir_version_refused_in_artifact_folder(tmp_path, mlp_artifacts):
    d = tmp_path / "art"
    shutil.copytree(mlp_artifacts, d)
    m = onnx.load(str(d / "optimizer_model.onnx"))
    m.ir_version = 14
    onnx.save(m, str(d / "optimizer_model.onnx"))
    _plan_case(tmp_path, str(d), "optimizer_model.onnx: IR version 14")


def test_op_without_shape_rule(tmp_path, mlp_artifacts):
    d = tmp_path / "art"
    shutil.copytree(mlp_artifacts, d)
    m = onnx.load(str(d / "training_model.onnx"))
    relu = next(n for n in m.graph.node if n.op_type == "Relu")
    relu.op_type, relu.domain = "Frobnicate", "com.example"
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    onnx.save(m, str(d / "training_model.onnx"))
    _plan_case(tmp_path, str(d), "com.example.Frobnicate")
    _assert_one_line_error(_run("inspect", str(d)), 2, "com.example.Frobnicate")


def test_external_data_outside_folder(tmp_path):
    inner = tmp_path / "model"
    inner.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.ones(18, np.float32).tobytes())
    m = onnx.load(str(_forward(inner / "m.onnx", batch_dim=4)))
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../secret.bin"), ("offset", "0"), ("length", "72")):
        w.external_data.add(key=k, value=v)
    (inner / "m.onnx").write_bytes(m.SerializeToString())
    _plan_case(tmp_path, str(inner / "m.onnx"), "outside the model's folder; refusing it (path traversal)")


def test_dynamic_dim_without_value(tmp_path):
    p = _forward(tmp_path / "dyn.onnx", batch_dim="batch")
    _plan_case(tmp_path, str(p), "dynamic dimension 'batch'")


@pytest.mark.parametrize("size", ["12parsecs", "MiB", "-1GB"])
def test_malformed_budget(tmp_path, size, mlp_artifacts):
    _plan_case(tmp_path, str(mlp_artifacts), "invalid size", 2, "--budget", size)


def test_bad_dim_option(tmp_path):
    p = _forward(tmp_path / "dyn.onnx", batch_dim="batch")
    _plan_case(tmp_path, str(p), "invalid --dim 'batch'", 2, "--dim", "batch")


def test_budget_not_reachable_exits_3(tmp_path, mlp_artifacts):
    out = tmp_path / "plan.json"
    result = _run("plan", str(mlp_artifacts), "--budget", "1KiB", "-o", str(out))
    _assert_one_line_error(result, 3, "no plan reaches the budget 1.00 KiB: smallest peak")
    assert out.exists()  # the best plan is still written, complete, for inspection
    assert "peak" in result.stdout


def test_budget_met_exits_0(tmp_path, mlp_artifacts):
    result = _run("plan", str(mlp_artifacts), "--budget", "1GiB", "--json")
    assert result.exit_code == 0, result.stderr
    assert '"fits_budget": true' in result.stdout
