"""A dynamo export's optimizer (torch.onnx.export optimize=True, the default) changes the
parameters: equal-valued initializers merged (two zero biases train as one), a tied weight split
by a folded Transpose; so do the TorchScript exporter's defaults (eval mode, constant folding).
The forward path says so in one line (onnxplan.forward.exported); the corpus builders' exports
(models.hf._optimize_keeping_parameters; TorchScript in training mode without folding) keep every
parameter and tie."""

from __future__ import annotations

import warnings

import pytest

from onnxplan.forward import prepare_forward
from onnxplan.forward.exported import optimizer_warning, torchscript_warning

torch = pytest.importorskip("torch")


class TwoBiasesAndATie(torch.nn.Module):
    """Two Linear layers with zero biases, two LayerNorms (ones / zeros), and an embedding tied
    to the output head (one parameter used twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.ln1, self.ln2 = torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight
        torch.nn.init.zeros_(self.a.bias)
        torch.nn.init.zeros_(self.b.bias)

    def forward(self, x):
        h = self.ln1(self.a(self.emb(x)))
        return self.head(self.ln2(self.b(h))).reshape(-1, 10)


def _export(optimize: bool, keep_parameters: bool = False):
    torch.manual_seed(0)
    x = torch.randint(0, 10, (2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(TwoBiasesAndATie(), (x,), dynamo=True, optimize=optimize, verbose=False)
    if keep_parameters:
        from onnxplan.models.hf import _optimize_keeping_parameters

        _optimize_keeping_parameters(program.model)
    return program.model_proto


def test_default_export_merges_biases_and_splits_the_tie_and_is_named_in_one_line():
    model = _export(optimize=True)
    inits = {t.name for t in model.graph.initializer}
    assert "b.bias" not in inits and "ln2.bias" not in inits  # merged into a.bias by the exporter
    line = optimizer_warning(model)
    assert line is not None and "\n" not in line
    assert "merged" in line and "'a.bias' also for b_bias, ln1_bias, ln2_bias" in line
    assert "trains as two" in line and "from head.weight" in line  # the tie, split by a folded Transpose
    assert line.endswith("re-export with torch.onnx.export(..., dynamo=True, optimize=False)")
    fm = prepare_forward(model, "default", "ce")
    assert fm.prep["rewrites"][0] == line  # inspect / plan print it with the other rewrites


@pytest.mark.parametrize("keep_parameters", [False, True], ids=["optimize-false", "corpus-export"])
def test_faithful_export_trains_each_bias_and_one_tied_weight(keep_parameters):
    model = _export(optimize=False, keep_parameters=keep_parameters)
    assert optimizer_warning(model) is None
    fm = prepare_forward(model, "faithful", "ce")
    assert not any(r.startswith("warning:") for r in fm.prep["rewrites"])
    for name in ("a.bias", "b.bias", "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "a.weight", "b.weight"):
        assert name in fm.trainable
    # the tied weight: one parameter, read by the embedding's Gather and the head's Transpose
    assert "head.weight" in fm.trainable
    readers = sorted(n.op_type for n in fm.model.graph.node if "head.weight" in n.input)
    assert readers == ["Gather", "Transpose"]
    assert len(fm.trainable) == 9


class ConvBatchNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def _torchscript(module: torch.nn.Module, x, tmp_path, **kwargs):
    import onnx

    path = tmp_path / "ts.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17, **kwargs)
    return onnx.load(str(path))


def test_torchscript_defaults_merge_and_fold_parameters_and_are_named_in_one_line(tmp_path):
    """torch.onnx.export(dynamo=False) with its defaults: the two zero biases and the LayerNorm
    biases become one (Identity copies), the tied head's transpose and BatchNorm are folded into
    new initializers (onnx::...)."""
    torch.manual_seed(0)
    model = _torchscript(TwoBiasesAndATie().eval(), torch.randint(0, 10, (2, 3)), tmp_path)
    line = torchscript_warning(model)
    assert line is not None and "\n" not in line and optimizer_warning(model) is None
    assert "merged into others" in line and "onnx::" in line
    assert line.endswith("training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)")
    fm = prepare_forward(model, "default", "ce")
    assert fm.prep["rewrites"][0] == line
    conv = _torchscript(ConvBatchNorm().eval(), torch.rand(2, 3, 8, 8), tmp_path)
    assert "BatchNorm" not in {n.op_type for n in conv.graph.node}  # folded into the convolution
    assert "computed from parameters at export time" in torchscript_warning(conv)


@pytest.mark.parametrize("module", [TwoBiasesAndATie, ConvBatchNorm])
def test_torchscript_training_export_without_folding_is_not_warned_about(module, tmp_path):
    torch.manual_seed(0)
    m = module()
    x = torch.randint(0, 10, (2, 3)) if module is TwoBiasesAndATie else torch.rand(2, 3, 8, 8)
    model = _torchscript(m.train(), x, tmp_path, training=torch.onnx.TrainingMode.TRAINING,
                         do_constant_folding=False)
    assert torchscript_warning(model) is None
    fm = prepare_forward(model, "faithful", "ce")
    assert not any(r.startswith("warning:") for r in fm.prep["rewrites"])
