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
    # not yet implemented (no corpus model uses them)
    ("", "LpPool"), ("", "GlobalLpPool"),
}


def test_every_rule_has_a_kernel_or_a_reason():
    missing = {(d, op) for d, op in registered_ops() if not (find_decl(d, op) and find_decl(d, op).fn)}
    assert missing <= RULE_ONLY, sorted(missing - RULE_ONLY)
