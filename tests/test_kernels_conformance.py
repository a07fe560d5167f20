"""ONNX's own node conformance cases (onnx.backend.test) for the ops this project implements: each
case's shape rule gives the expected output specs, and its kernel the expected values, or the rule
refuses the node at plan time with one line (an attribute value or opset form we do not support)."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from onnxplan.errors import UnsupportedOpError
from onnxplan.ir.graph import Node
from onnxplan.ir.load import _attrs
from onnxplan.ir.shape_rules import ShapeInferenceError
from onnxplan.ir.shapes import infer_shapes
from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.registry import find_kernel
from tests.kernel_harness import call_kernel

# onnx.backend.test.case.node modules -> the ops of theirs we run (importing a module makes its cases)
MODULES = {
    "argmax": "ArgMax", "argmin": "ArgMin", "cumsum": "CumSum", "trilu": "Trilu", "pad": "Pad",
    "tile": "Tile", "rangeop": "Range", "onehot": "OneHot", "gatherelements": "GatherElements",
    "gathernd": "GatherND", "scatterelements": "ScatterElements", "scatternd": "ScatterND", "topk": "TopK",
    "mod": "Mod", "isinf": "IsInf", "hardsigmoid": "HardSigmoid", "hardswish": "HardSwish",
    "softplus": "Softplus", "softsign": "Softsign", "elu": "Elu", "selu": "Selu", "celu": "Celu",
    "thresholdedrelu": "ThresholdedRelu", "shrink": "Shrink", "mish": "Mish", "prelu": "PRelu",
    "bitshift": "BitShift", "bitwiseand": "BitwiseAnd", "bitwiseor": "BitwiseOr", "bitwisexor": "BitwiseXor",
    "bitwisenot": "BitwiseNot", "castlike": "CastLike", "convtranspose": "ConvTranspose", "conv": "Conv",
    "reduce_log_sum": "ReduceLogSum", "reduce_log_sum_exp": "ReduceLogSumExp", "reducel1": "ReduceL1",
    "reducel2": "ReduceL2", "reducesumsquare": "ReduceSumSquare", "reducemean": "ReduceMean",
    "reducesum": "ReduceSum", "reducemax": "ReduceMax", "reducemin": "ReduceMin", "gelu": "Gelu",
    "where": "Where", "expand": "Expand", "sin": "Sin", "cos": "Cos", "tan": "Tan", "erf": "Erf", "pow": "Pow",
    "sqrt": "Sqrt", "tanh": "Tanh", "sigmoid": "Sigmoid", "acos": "Acos", "asin": "Asin", "atan": "Atan",
    "acosh": "Acosh", "asinh": "Asinh", "atanh": "Atanh", "sinh": "Sinh", "cosh": "Cosh",
    "layernormalization": "LayerNormalization", "averagepool": "AveragePool",
    "globalaveragepool": "GlobalAveragePool", "split": "Split", "concat": "Concat", "slice": "Slice",
    "gather": "Gather", "softmax": "Softmax",
    "instance_normalization": "InstanceNormalization", "groupnormalization": "GroupNormalization",
    "einsum": "Einsum", "resize": "Resize", "upsample": "Upsample",
    "negativeloglikelihoodloss": "NegativeLogLikelihoodLoss", "hardmax": "Hardmax",
    "lpnormalization": "LpNormalization", "meanvariancenormalization": "MeanVarianceNormalization", "lrn": "LRN",
}


def _cases():
    from onnx.backend.test.case.node import _NodeTestCases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in MODULES:
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
    ops = set(MODULES.values())
    seen = {}
    for case in _NodeTestCases:
        nodes = case.model.graph.node
        if len(nodes) == 1 and nodes[0].op_type in ops and nodes[0].domain in ("", "ai.onnx"):
            seen[case.name] = case
    return [seen[name] for name in sorted(seen)]


CASES = _cases()
# where ONNX Runtime 1.19 (which the training graphs run on, and which we follow) differs from ONNX
ORT_DEVIATIONS = {
    "test_averagepool_2d_ceil_last_window_starts_on_pad": "ORT keeps a ceil-mode window that starts in the padding",
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True": "ORT keeps a ceil-mode "
    "window that starts in the padding",
    "test_resize_downsample_scales_linear_align_corners": "ORT's align_corners divides by the integer output "
    "length, ONNX by input length * scale",
}


NUMPY_DTYPES = {"bool", "float16", "float32", "float64", *(f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64))}


def _array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_conformance(case):
    if case.name in ORT_DEVIATIONS:
        pytest.skip(f"ONNX Runtime differs: {ORT_DEVIATIONS[case.name]}")
    model = case.model
    proto = model.graph.node[0]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    node = Node("n", proto.op_type, "", list(proto.input), list(proto.output), _attrs(proto))
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for (inputs, expected) in case.data_sets:
        feeds = dict(values)
        feeds.update({vi.name: _array(a) for vi, a in zip(model.graph.input, inputs)})
        expected = [_array(w) for w in expected]
        if any(a.dtype.name not in NUMPY_DTYPES for a in [*feeds.values(), *expected]):
            pytest.skip("a dtype numpy does not have (bfloat16, float8, int4...)")
        known = {k: TensorSpec(v.dtype.name, v.shape) for k, v in feeds.items()}
        # what a shape rule may read: every input but the data (input 0, unless a scalar)
        consts = {k: v for k, v in feeds.items() if k != proto.input[0] or v.ndim == 0}
        try:
            specs, _ = infer_shapes([node], known, consts, {"": opset})
        except ShapeInferenceError as exc:
            if "not supported" in str(exc):
                pytest.skip(f"refused at plan time: {exc}")
            raise
        for name, want in zip(proto.output, expected):
            if name:
                assert specs[name] == TensorSpec(np.asarray(want).dtype.name, np.asarray(want).shape), name
        try:
            find_kernel(node, opset)
        except UnsupportedOpError as exc:
            pytest.fail(str(exc))
        outs = [np.full(np.asarray(w).shape, np.nan if np.asarray(w).dtype.kind == "f" else 0, np.asarray(w).dtype)
                for w in expected]
        outs += [None] * (len(proto.output) - len(outs))
        call_kernel(node, [feeds[n] if n else None for n in proto.input],
                    [o if name else None for o, name in zip(outs, proto.output)])
        for got, want in zip(outs, expected):
            want = np.asarray(want)
            if want.dtype.kind in "fc":
                np.testing.assert_allclose(got, want, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-5))
            else:
                np.testing.assert_array_equal(got, want)
