"""PyTorch models exported both ways (TorchScript opset 17, dynamo opset 18+) go through
inspect, plan and run --verify as exported: trained/frozen parameters, completed outputs,
decompositions, re-batching, and one-line refusals."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxplan.cli.app import app

torch = pytest.importorskip("torch")
nn = torch.nn
runner = CliRunner()


class BNCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.bn(self.conv(x))), 1))


class ActMLP(nn.Module):
    """HardSwish and HardSigmoid: no gradient in onnxruntime-training 1.19.2, decomposed."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 5)

    def forward(self, x):
        return self.l3(nn.functional.hardsigmoid(self.l2(nn.functional.hardswish(self.l1(x)))))


class LNDropMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.ln = nn.Linear(8, 16), nn.LayerNorm(16)
        self.drop, self.l2 = nn.Dropout(0.1), nn.Linear(16, 5)

    def forward(self, x):
        return self.l2(self.drop(self.ln(self.l1(x))))


class EmbLN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.ln, self.fc = nn.Embedding(30, 8), nn.LayerNorm(8), nn.Linear(8, 5)

    def forward(self, ids):
        return self.fc(self.ln(self.emb(ids)).mean(1))


class LastToken(nn.Module):
    """GPT-2's last-token pooling: ArgMax over int64 (positions times a not-pad mask), which
    onnxruntime 1.19.2's CPU has no kernel for: cast to int32 first by the forward path."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc = nn.Embedding(30, 8), nn.Linear(8, 5)

    def forward(self, ids):
        last = (torch.arange(7) * (ids != 0).int()).argmax(-1)  # int32 mask promoted to int64
        pick = (torch.arange(7) == last[:, None]).unsqueeze(-1).float()
        return self.fc((self.emb(ids) * pick).sum(1))


MODELS = {  # name: (module, example input, kernels for run --verify)
    "bncnn": (BNCNN, lambda: torch.randn(2, 3, 6, 6), True),
    "actmlp": (ActMLP, lambda: torch.randn(2, 8), True),
    "lndrop": (LNDropMLP, lambda: torch.randn(2, 8), False),  # Dropout kernel: another branch's work
    "embln": (EmbLN, lambda: torch.randint(0, 30, (2, 7)), True),
    "lasttok": (LastToken, lambda: torch.randint(0, 30, (2, 7)), True),
}
TRAINED = {
    "bncnn": ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"],
    "actmlp": ["l1.weight", "l1.bias", "l2.weight", "l2.bias", "l3.weight", "l3.bias"],
    "lndrop": ["l1.weight", "l1.bias", "ln.weight", "ln.bias", "l2.weight", "l2.bias"],
    "embln": ["emb.weight", "ln.weight", "ln.bias", "fc.weight", "fc.bias"],
    "lasttok": ["emb.weight", "fc.weight", "fc.bias"],
}

# The dynamo exporter turns a train-mode BatchNorm into an inference one (no training_mode)
# and its optimizer folds that into the convolution: no BN parameters are left to train.
TRAINED_DYNAMO = {**TRAINED, "bncnn": ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]}


def export(name: str, dynamo: bool, folder: Path, batch_axis: bool = True) -> Path:
    """Seeded module `name` in train mode, exported to folder/<name>-<exporter>.onnx."""
    cls, example, _ = MODELS[name]
    torch.manual_seed(0)
    module = cls().train()
    x = example()
    path = folder / f"{name}-{'dynamo' if dynamo else 'ts'}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(module, (x,), str(path), dynamo=True, input_names=["x"], output_names=["y"],
                              verbose=False)
        else:
            torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "batch"}} if batch_axis else None)
    return path


def cli(*args: str):
    return runner.invoke(app, list(args))


def one_line_error(result, needle: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("onnxplan: error: "), err
    assert needle in err, err
    assert "Traceback" not in result.stdout + result.stderr
    return err


def check_model(path: Path, name: str, batch: str = "2") -> dict:
    res = cli("inspect", str(path), "--batch", batch, "--json")
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["unshaped_values"] == [] and summary["ops_without_rule"] == []
    params = summary["parameters"]
    expected = TRAINED_DYNAMO[name] if "-dynamo" in path.name else TRAINED[name]
    assert params["trained"] == expected
    if name == "bncnn" and "-ts" in path.name:
        assert params["frozen"] == ["bn.running_mean", "bn.running_var"]
    res = cli("plan", str(path), "--batch", batch, "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["parameters"]["trained"] == expected
    if MODELS[name][2]:
        res = cli("run", str(path), "--batch", batch, "--steps", "2", "--verify", "--no-measure", "--json")
        assert res.exit_code == 0, res.stdout + res.stderr
        assert json.loads(res.stdout)["verified"] is True
    return summary


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("exports")


@pytest.mark.parametrize("name", list(MODELS))
def test_torchscript_export_trains_as_exported(name, exports):
    summary = check_model(export(name, False, exports), name)
    rewrites = summary["parameters"]["rewrites"]
    if name == "actmlp":
        assert any("decomposed HardSwish" in r for r in rewrites)
        assert any("decomposed HardSigmoid" in r for r in rewrites)
    if name in ("lndrop", "embln"):
        assert any("LayerNormalization Mean/InvStdDev" in r for r in rewrites)
    if name == "lasttok":
        assert any(r.startswith("ArgMax") and "provably in [0, 6] cast to int32" in r for r in rewrites), rewrites


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_dynamo_export_trains_as_exported(name, exports):
    path = export(name, True, exports)
    summary = check_model(path, name)
    rewrites = " | ".join(summary["parameters"]["rewrites"])
    assert "converted ai.onnx opset" in rewrites and "IR version 10 set to 9" in rewrites
    if name == "lndrop":
        assert "Dropout mask output" in rewrites
    if name == "lasttok" and "ArgMax" in rewrites:  # the dynamo export may cast to int32 itself
        assert "cast to int32" in rewrites


def test_bn_running_statistics_are_frozen_and_globs_override(exports):
    path = export("bncnn", False, exports)
    res = cli("inspect", str(path), "--batch", "2", "--json", "--freeze", "conv.*", "--train", "*")
    summary = json.loads(res.stdout)
    assert summary["parameters"]["trained"] == ["bn.weight", "bn.bias", "fc.weight", "fc.bias"]
    assert summary["parameters"]["frozen"] == ["conv.weight", "conv.bias", "bn.running_mean",
                                               "bn.running_var"]
    one_line_error(cli("plan", str(path), "--batch", "2", "--freeze", "nosuch.*"),
                   "--freeze 'nosuch.*' matches no initializer")
    one_line_error(cli("inspect", "mlp", "--train", "fc*"), "forward .onnx")


def test_fixed_batch_is_rebatched_or_refused(exports, tmp_path):
    path = export("bncnn", False, tmp_path, batch_axis=False)  # batch fixed at 2
    path = path.rename(tmp_path / "bncnn-ts-fixed.onnx")
    summary = check_model(path, "bncnn", batch="4")
    assert summary["parameters"]["rebatched"] == [2, 4]

    class Baked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            return self.fc(x.reshape(4, 8))  # [2, 2, 8] -> 4 rows: the batch is baked in

    torch.manual_seed(0)
    baked = tmp_path / "baked.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Baked(), (torch.randn(2, 2, 8),), str(baked), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    one_line_error(cli("plan", str(baked), "--batch", "3"), "cannot re-batch baked from its exported batch 2")
    assert cli("plan", str(baked), "--batch", "2").exit_code == 0


@pytest.mark.slow
def test_dynamo_fixed_batch_reshape_follows_the_batch(exports, tmp_path):
    path = export("bncnn", True, tmp_path)  # dynamo: batch 2 fixed, flatten as Reshape [2, 144]
    res = cli("run", str(path), "--batch", "3", "--steps", "2", "--verify", "--no-measure", "--json")
    assert res.exit_code == 0, res.stdout + res.stderr
    res = cli("inspect", str(path), "--batch", "3", "--json")
    rewrites = " | ".join(json.loads(res.stdout)["parameters"]["rewrites"])
    assert "copy the leading dim" in rewrites and "re-batched from the exported batch 2 to 3" in rewrites


def test_bench_takes_the_globs_and_refuses_to_mix_rows(exports, tmp_path):
    path = export("bncnn", False, exports)
    out = tmp_path / "results.json"
    common = ["bench", str(path), "--batch", "2", "--strategies", "given+naive", "--peers", "none",
              "--no-measure", "-o", str(out)]
    res = cli(*common, "--freeze", "conv.*")
    assert res.exit_code == 0, res.stdout + res.stderr
    frozen_peak = json.loads(out.read_text())["rows"][0]["planned_peak_bytes"]
    one_line_error(cli(*common), "was made with other --freeze globs; give --fresh")
    res = cli(*common, "--fresh")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert json.loads(out.read_text())["rows"][0]["planned_peak_bytes"] > frozen_peak  # conv's AdamW state
