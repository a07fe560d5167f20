"""The less common elementwise ops and activations against the ONNX reference evaluator and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernel_harness import MS, F, check, rand

ACTIVATIONS = [
    ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSwish", {}),
    ("Softplus", {}), ("Softsign", {}), ("Elu", {}), ("Elu", {"alpha": 0.5}), ("Selu", {}),
    ("Selu", {"alpha": 1.5, "gamma": 2.0}), ("Celu", {"alpha": 2.0}), ("ThresholdedRelu", {"alpha": 0.7}),
    ("Shrink", {"lambd": 1.0, "bias": 0.5}),
    ("Acos", {}), ("Asin", {}), ("Atan", {}), ("Sinh", {}), ("Cosh", {}), ("Tan", {}), ("Asinh", {}),
]


@pytest.mark.parametrize("op,attrs", ACTIVATIONS)
def test_activations(op, attrs):
    lo, hi = (-0.95, 0.95) if op in ("Acos", "Asin") else (-30, 30) if op == "Softplus" else (-4, 4)
    check(op, [rand(5, 37, lo=lo, hi=hi)], attrs, aliases=[(0, 0)])


def test_inverse_hyperbolics_on_their_domains():
    check("Acosh", [rand(4, 5, lo=1.0, hi=5.0)])
    check("Atanh", [rand(4, 5, lo=-0.9, hi=0.9)])


def test_prelu_broadcasts_its_slope():
    check("PRelu", [rand(2, 3, 4, 5), rand(3, 1, 1)], aliases=[(0, 0)])
    check("PRelu", [rand(2, 3, 4), rand(4)])


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod(fmod):
    a = np.array([7, -7, 7, -7, 0, 6, -6, 9], np.int64)
    b = np.array([2, 3, -2, -3, 3, 4, 4, -4], np.int64)
    check("Mod", [a, b], {"fmod": fmod}, aliases=[(0, 0), (0, 1)])
    check("Mod", [a.astype(np.int32), np.array(5, np.int32)], {"fmod": fmod})
    if fmod:
        check("Mod", [rand(3, 4), rand(4, lo=0.5, hi=2)], {"fmod": 1})


@pytest.mark.parametrize("pos,neg", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_is_inf(pos, neg):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -2.5, 1e38], F)
    check("IsInf", [x], {"detect_positive": pos, "detect_negative": neg})


def test_cast_like():
    """(BitShift on unsigned types and the opset-18 Bitwise* ops: the ONNX conformance cases test them.)"""
    check("CastLike", [rand(3, 4), np.zeros(1, np.int64)])
    check("CastLike", [np.array([1, 0, 2], np.int64), np.zeros(1, F)])


def test_leaky_relu_grad():
    y = rand(5, 30)
    y[0, :4] = 0.0
    check("LeakyReluGrad", [rand(5, 30), y], {"alpha": 0.2}, domain=MS, aliases=[(0, 0), (0, 1)])


def test_bias_gelu_and_its_grads():
    x, b, dy = rand(6, 16), rand(16), rand(6, 16)
    check("BiasGelu", [x, b], domain=MS, aliases=[(0, 0)])
    check("BiasGeluGrad_dX", [dy, x, b], domain=MS, aliases=[(0, 0), (0, 1)])
    check("BiasFastGeluGrad_dX", [dy, x, b], domain=MS, aliases=[(0, 0), (0, 1)], atol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_at_opset_20(approximate):
    """ai.onnx Gelu (opset 20, the dynamo exporter's) against ORT and the reference at opset 20."""
    import onnx
    import onnxruntime as ort
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from onnxplan.ir.graph import Node
    from onnxplan.kernels.registry import KernelContext, find_kernel

    x = rand(7, 33, lo=-6, hi=6)
    node = helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, x.shape)])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 20)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    wants = [session.run(None, {"x": x})[0], ReferenceEvaluator(model).run(None, {"x": x})[0]]
    ours = Node("n", "Gelu", "", ["x"], ["y"], {"approximate": approximate})
    got = np.full_like(x, np.nan)
    find_kernel(ours, 20).fn(KernelContext(np, ours, [], []), [x], [got])
    for want in wants:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("to", ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0"])
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("source", ["float32", "float16"])
def test_cast_to_float8_saturates_as_the_reference(to, saturate, source):
    """saturate=1 (the default) clamps to the type's largest finite value (+-inf too), saturate=0
    gives NaN (inf for E5M2) out of range; E8M0 rounds its exponent by round_mode. Against the ONNX
    reference evaluator (onnx.numpy_helper's conversions), in blocks larger than one kernel block."""
    from onnx import TensorProto
    from onnx.reference import ReferenceEvaluator

    from tests.kernel_harness import RNG, one_node_model, run_kernel

    with np.errstate(over="ignore"):  # float16 overflows to inf: more out-of-range values
        x = (RNG.standard_normal(70_000) * np.exp(RNG.uniform(-12, 12, 70_000))).astype(source)
    x[:6] = [np.inf, -np.inf, np.nan, 0.0, 1e4, -3e4]
    modes = ["up", "down", "nearest"] if to == "FLOAT8E8M0" else ["up"]
    for mode in modes:
        attrs = {"to": getattr(TensorProto, to), "saturate": saturate, "round_mode": mode}
        model, feeds = one_node_model("Cast", [x], 1, attrs)
        model.opset_import[0].version = 25
        (want,) = ReferenceEvaluator(model).run(None, feeds)
        (got,) = run_kernel("Cast", [x], [want], attrs)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8))
