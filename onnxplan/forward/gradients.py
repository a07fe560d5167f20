"""What onnxruntime-training 1.19.2 can differentiate: the one home for that knowledge.

GRADIENT_OPS is the set of op types with a gradient builder in onnxruntime-training
1.19.2 (orttraining/core/graph/gradient_builder_registry.cc of that release; the builder
classes are also listed in the installed binary, and tests/test_forward_gradients.py
checks the table against the installed package). NON_DIFFERENTIABLE_INPUTS gives, per op,
the input positions ORT's gradient graph builder never differentiates (its stop-gradient
edges: shapes, indices, axes, running statistics). ZERO_GRADIENT_OPS are ops whose gradient
is zero wherever it exists (comparisons, rounding, shape queries, random draws): a path
through them carries no gradient, so it is cut rather than refused.
"""

from __future__ import annotations

import onnx

from onnxplan.ort import MS, ORT_TRAINING

__all__ = [
    "FLOAT_TYPES",
    "GRADIENT_OPS",
    "NON_DIFFERENTIABLE_INPUTS",
    "ORT_TRAINING",
    "ZERO_GRADIENT_OPS",
    "differentiable_positions",
    "has_gradient",
]


GRADIENT_OPS = frozenset("""
    Abs Add Sub Mul Div Neg Pow Sqrt Exp Log Reciprocal Sin Cos Tanh Sigmoid Erf Relu LeakyRelu
    Gelu FastGelu BiasGelu QuickGelu Cast Clip Min Max MatMul Gemm Conv ConvTranspose MaxPool
    AveragePool GlobalAveragePool BatchNormalization BatchNormInternal LayerNormalization
    SimplifiedLayerNormalization Softmax LogSoftmax Dropout Reshape Flatten Squeeze Unsqueeze
    Transpose Concat ConcatTraining Split Slice Gather GatherND GatherElements Expand Tile Pad
    Where TopK Identity ReduceMean ReduceSum ReduceL2 ReduceLogSumExp Resize Trilu ScatterND
    ScatterElements SoftmaxCrossEntropyLoss
""".split())  # noqa: SIM905 - a table: one op name per word

# input positions never differentiated (ORT's stop-gradient edges and index/shape inputs)
NON_DIFFERENTIABLE_INPUTS: dict[str, frozenset[int]] = {
    op: frozenset(pos) for op, pos in {
        "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Slice": {1, 2, 3, 4}, "Gather": {1},
        "GatherND": {1}, "GatherElements": {1}, "Squeeze": {1}, "Unsqueeze": {1}, "Split": {1},
        "ReduceSum": {1}, "ReduceMean": {1}, "ReduceL2": {1}, "ReduceLogSumExp": {1},
        "Clip": {1, 2}, "Pad": {1, 2, 3}, "TopK": {1}, "Resize": {1, 2, 3}, "Where": {0},
        "Dropout": {1, 2}, "BatchNormalization": {3, 4}, "ScatterND": {1},
        "ScatterElements": {1}, "Trilu": {1}, "Pow": {1}, "SoftmaxCrossEntropyLoss": {1, 2},
    }.items()
}

ZERO_GRADIENT_OPS = frozenset("""
    Shape Size ConstantOfShape Constant Equal Less Greater LessOrEqual GreaterOrEqual Not And Or
    Xor IsNaN IsInf NonZero ArgMax ArgMin Floor Ceil Round Sign Range OneHot RandomUniform
    RandomNormal RandomUniformLike RandomNormalLike Multinomial Bernoulli EyeLike
""".split())  # noqa: SIM905 - a table: one op name per word

FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                         onnx.TensorProto.BFLOAT16})

_ORT_DOMAINS = ("", "ai.onnx", MS)
# builders registered for com.microsoft ops (ai.onnx Gelu of opset 20 is not the contrib Gelu)
_CONTRIB_OPS = frozenset({"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BatchNormInternal",
                          "SimplifiedLayerNormalization", "ConcatTraining"})


def has_gradient(node: onnx.NodeProto) -> bool:
    """Whether onnxruntime-training 1.19.2 has a gradient builder for this node's op."""
    if node.op_type not in GRADIENT_OPS:
        return False
    if node.op_type in _CONTRIB_OPS:
        return node.domain == MS
    return node.domain in ("", "ai.onnx")


def differentiable_positions(node: onnx.NodeProto) -> list[int] | None:
    """Input positions a gradient could flow through (None: the op's gradient is zero)."""
    if node.domain in _ORT_DOMAINS and node.op_type in ZERO_GRADIENT_OPS:
        return None
    skip = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, frozenset()) if node.domain in _ORT_DOMAINS else ()
    return [i for i, name in enumerate(node.input) if name and i not in skip]
