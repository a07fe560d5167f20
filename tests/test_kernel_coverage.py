"""Every op with a shape rule has a kernel, except the few listed here with the reason (so a new
rule without a kernel, or a kernel lost, fails here rather than at `onnxplan run`)."""

from __future__ import annotations

from onnxplan.ir.shape_rules import registered_ops
from onnxplan.kernels.registry import find_decl

MS = "com.microsoft"
RULE_ONLY = {
    # refused at plan time by their rules: data-dependent output shapes
    ("", "NonZero"), ("", "Unique"), ("", "Compress"),
    # random ops and dropout (their kernels come with the verification work)
    ("", "Dropout"), ("", "TrainableDropout"), ("", "TrainableDropoutGrad"), (MS, "BiasDropout"),
    (MS, "BitmaskDropout"), (MS, "BitmaskBiasDropout"), (MS, "BitmaskDropoutGrad"), (MS, "DropoutGrad"),
    (MS, "BiasSoftmaxDropout"), (MS, "SoftmaxDropoutGrad"), (MS, "TrainableDropoutGrad"),
    # folded from constant inputs at plan time (never executed)
    (MS, "BroadcastGradientArgs"),
    # ONNX Runtime registers these on CUDA only, or only in ORTModule / distributed / legacy graphs
    (MS, "FlattenAndUnpad"), (MS, "PadAndUnflatten"), (MS, "IsFinite"), (MS, "MegatronF"), (MS, "MegatronG"),
    (MS, "YieldOp"), (MS, "Group"), (MS, "PassThrough"), (MS, "MixedPrecisionScale"), (MS, "InplaceClipGradNorm"),
    (MS, "FakeQuantGrad"), (MS, "AdamOptimizer"), (MS, "SGDOptimizer"), (MS, "BatchScale"),
    (MS, "InvertibleLayerNormalizationGrad"), (MS, "SoftmaxCrossEntropy"), (MS, "SoftmaxCrossEntropyGrad"),
    ("", "SparseSoftmaxCrossEntropy"), ("", "SparseSoftmaxCrossEntropyGrad"),
    (MS, "NegativeLogLikelihoodLossInternal"), (MS, "NegativeLogLikelihoodLossInternal2"), (MS, "DivGrad"),
    (MS, "BiasSoftmax"),
    # registered in both domains by the rules; ONNX Runtime's kernels are in one of them
    ("", "ConvGrad"), (MS, "MaxPoolGrad"), (MS, "AveragePoolGrad"),
}


def test_every_rule_has_a_kernel_or_a_reason():
    missing = {(d, op) for d, op in registered_ops() if not (find_decl(d, op) and find_decl(d, op).fn)}
    assert missing <= RULE_ONLY, sorted(missing - RULE_ONLY)


def test_the_kernel_modules_are_listed():
    """registry.KERNEL_MODULES names every module of onnxplan.kernels that declares kernels (the
    registry imports that list, it does not discover modules)."""
    from pathlib import Path

    import onnxplan.kernels
    from onnxplan.kernels.registry import KERNEL_MODULES

    folder = Path(onnxplan.kernels.__file__).parent
    declaring = {p.stem for p in folder.glob("*.py") if p.stem != "registry"
                 and ("@kernel(" in p.read_text() or "declare(" in p.read_text())}
    assert declaring == set(KERNEL_MODULES)


def test_random_ops_declare_the_output_holding_their_draw():
    """One table of random ops, from the kernel declarations: what recompute never re-runs and what
    verification feeds ONNX Runtime's draws into (Dropout: its mask, output 1)."""
    from onnxplan.ir.graph import Node
    from onnxplan.kernels.registry import is_random, random_ops

    ops = random_ops()
    assert ops[("", "Dropout")] == 1 and ops[(MS, "BitmaskDropout")] == 1 and ops[("", "RandomUniformLike")] == 0
    assert {("", "RandomNormal"), ("", "Bernoulli"), (MS, "BiasDropout")} <= set(ops)
    assert (MS, "DropoutGrad") not in ops  # reads the forward's mask: deterministic
    assert is_random(Node("d", "Dropout", "", ["x"], ["y", "m"]), 13)
    assert not is_random(Node("r", "Relu", "", ["x"], ["y"]), 13)
