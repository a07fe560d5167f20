"""Copies (recompute, swap-in) are named NAME@rcK / NAME@inK / NAME@start; a model's own '@' stays."""

from __future__ import annotations

import json

import onnx
import pytest
from typer.testing import CliRunner

from onnxplan.cli.app import app
from onnxplan.ir.graph import original_name, recompute_suffix, recomputed_from, swap_in_suffix

torch = pytest.importorskip("torch")


def test_original_name_strips_only_copy_suffixes():
    assert original_name("relu1@rc2") == "relu1"
    assert original_name("relu1@in17") == "relu1" and original_name("relu1@start") == "relu1"
    assert original_name("relu1@rc2@in5") == "relu1"  # a swap-in of a recomputed value
    assert original_name("blk@3/relu@v2") == "blk@3/relu@v2"  # the model's own '@'
    assert original_name("blk@3/relu@v2@rc1") == "blk@3/relu@v2"
    assert original_name("x@rcx") == "x@rcx" and original_name("x@in") == "x@in"


def test_copy_names_are_written_and_read_by_one_parser():
    """The names the recompute and swap passes write are the names original_name and
    recomputed_from (explain's grouping of copies) read back."""
    assert recomputed_from("blk@3/relu" + recompute_suffix(2)) == "blk@3/relu"
    assert recomputed_from("relu1") is None and recomputed_from("x@rcx") is None
    assert recomputed_from("x@rc1" + swap_in_suffix("4")) is None  # a swap-in copy, not a recomputation
    assert original_name("x" + recompute_suffix(1) + swap_in_suffix("start")) == "x"
    assert swap_in_suffix("3") == "@in3" and swap_in_suffix("start") == "@start"


def _rename(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every node and value name of `model` wrapped in '@'s: `m@NAME@v2`."""
    g = model.graph
    new = {}
    for vi in [*g.input, *g.output, *g.value_info]:
        new[vi.name] = f"m@{vi.name}@v2"
    for t in g.initializer:
        new[t.name] = f"m@{t.name}@v2"
    for n in g.node:
        for x in [*n.input, *n.output]:
            if x:
                new.setdefault(x, f"m@{x}@v2")
    for vi in [*g.input, *g.output, *g.value_info]:
        vi.name = new[vi.name]
    for t in g.initializer:
        t.name = new[t.name]
    for i, n in enumerate(g.node):
        n.name = f"m@{n.name or n.op_type + str(i)}@v2"
        n.input[:] = [new.get(x, x) for x in n.input]
        n.output[:] = [new.get(x, x) for x in n.output]
    return model


@pytest.mark.parametrize("strategy", [["--checkpoint", "sqrt"], ["--swap", "on-demand"]])
def test_model_names_with_at_signs_plan_run_and_verify(tmp_path, strategy):
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 16), nn.ReLU(), nn.Linear(16, 5)).train()
    raw = tmp_path / "raw.onnx"
    torch.onnx.export(model, (torch.randn(2, 3, 6, 6),), str(raw), dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["x"], output_names=["y"])
    path = tmp_path / "at.onnx"
    onnx.save(_rename(onnx.load(str(raw))), str(path))
    res = CliRunner().invoke(app, ["run", str(path), "--steps", "2", "--verify", "--json", *strategy])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    out = json.loads(res.stdout)
    assert out["verified"] is True, out["verification"]
