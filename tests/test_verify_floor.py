"""The rounding floor of a gradient-producing reduction (onnxplan.verification.step_check.
reduction_floor): it bounds what float32 rounding leaves in a sum that cancels to ~0, against the
same sum in float64, and stays far below the gradient tolerance where nothing cancels; the floors
of BatchNorm statistics, LayerNorm gradients and the loss grow with their reduction's length, and a
planted 1e-3 fault in a BatchNorm over 100k values still fails against ONNX Runtime."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxplan.kernels.registry import find_decl
from onnxplan.verification.norm_floors import loss_floor
from onnxplan.verification.step_check import (
    TOLERANCES,
    bn_floor,
    ln_grad_floor,
    reduction_floor,
    sum_rounding,
    verify_run,
)


def _matmul(ctx, inputs, outputs):
    np.matmul(inputs[0], inputs[1], out=outputs[0])


def _ctx(op: str = "MatMul"):
    return SimpleNamespace(node=SimpleNamespace(op_type=op), scratch=None)


def test_floor_bounds_the_rounding_of_a_sum_that_cancels():
    rng = np.random.default_rng(0)
    half = rng.standard_normal((8, 2048)).astype(np.float32)
    a = np.concatenate([half, half], axis=1)  # a @ b is exactly zero: every term meets its negation
    v = rng.standard_normal((2048, 16)).astype(np.float32)
    b = np.concatenate([v, -v * np.float32(1 + 2 ** -20)], axis=0)  # ... up to a tiny exact rest
    got = np.empty((8, 16), np.float32)
    _matmul(None, [a, b], [got])
    exact = a.astype(np.float64) @ b.astype(np.float64)
    c, magnitude = reduction_floor(_matmul, _ctx(), [a, b], [got], np)[0]
    floor = c * magnitude
    err = float(np.linalg.norm(got - exact))
    assert 0 < err <= floor / 2  # one side's rounding: within half the two sides' floor
    assert float(np.linalg.norm(exact)) < floor  # the value itself is below rounding: no relative test holds


def test_floor_is_negligible_where_nothing_cancels():
    rng = np.random.default_rng(1)
    a = np.abs(rng.standard_normal((8, 4096))).astype(np.float32)
    b = np.abs(rng.standard_normal((4096, 16))).astype(np.float32)
    got = np.empty((8, 16), np.float32)
    _matmul(None, [a, b], [got])
    c, magnitude = reduction_floor(_matmul, _ctx(), [a, b], [got], np)[0]
    assert c * magnitude / np.linalg.norm(got) < 1e-2 * TOLERANCES["gradient"]  # ~5e-5 at K = 4096


def test_floor_counts_the_terms_of_each_output_element():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 64)).astype(np.float32)
    b = rng.standard_normal((64, 4)).astype(np.float32)
    got = np.empty((4, 4), np.float32)
    c, magnitude = reduction_floor(_matmul, _ctx(), [a, b], [got], np)[0]
    u = 2.0 ** -24
    assert np.isclose(c, 2 * (6 * np.sqrt(64) + 2) * u)  # K = 64, the inner dimension
    assert np.isclose(magnitude, np.linalg.norm(np.abs(a).astype(np.float64) @ np.abs(b)), rtol=1e-5)


def test_an_all_zero_reference_is_judged_by_the_absolute_floor():
    """ORT's gradient exactly zero, ours rounding noise: within the floor passes, above it fails,
    and with no floor any nonzero value fails (as before); a NaN never passes."""
    from onnxplan.verification.step_check import gradient_error

    zero = np.zeros(16, np.float32)
    noise = np.full(16, 1e-9, np.float32)  # norm 4e-9
    tol = TOLERANCES["gradient"]
    assert gradient_error(noise, zero, tol, floor=1e-8) <= tol
    assert gradient_error(noise, zero, tol, floor=1e-9) > tol
    assert gradient_error(noise, zero, tol, floor=0.0) == float("inf")
    assert gradient_error(np.full(16, np.nan, np.float32), zero, tol, floor=1.0) == float("inf")
    assert gradient_error(zero, zero, tol, floor=0.0) == 0.0
    want = np.ones(16, np.float32)  # a nonzero reference: the relative error, as before
    assert gradient_error(want * 2, want, tol, floor=1e9) == 1.0


# -- floors that grow with the reduction's length (issue 26.5) -----------------------------------

def test_a_sequential_sum_breaks_a_log2_bound_and_stays_within_sum_rounding():
    """ONNX Runtime sums a BatchNorm channel with Eigen in a few SIMD accumulators, each running
    sequentially: a float32 running sum of N = 100k values ~1 is off by ~u sqrt(N) relative, more
    than the ceil(log2 N) + 4 roundings a pairwise sum allows, and within sum_rounding(N, 4)."""
    rng = np.random.default_rng(5)
    n = 224 * 224 * 2
    x = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    seq = float(np.cumsum(x, dtype=np.float32)[-1])  # one accumulator: the worst order a lane runs
    exact = float(np.sum(x.astype(np.float64)))
    err = abs(seq - exact) / np.sum(np.abs(x.astype(np.float64)))
    u = 2.0 ** -24
    assert err > (np.ceil(np.log2(n)) + 4) * u  # the old per-side floor does not hold
    assert err < sum_rounding(n, 4) / 2  # one side within half the two sides' floor
    assert sum_rounding(n, 4) < 1e-3 / 2  # still far below a 1e-3 fault


def test_bn_floor_counts_the_error_its_input_carries_in():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    zero, one = np.zeros(3, np.float32), np.ones(3, np.float32)
    plain, carried = bn_floor(x, zero, one, 0.9), bn_floor(x, zero, one, 0.9, rho=1e-5)
    abs_mean = np.abs(x.astype(np.float64)).mean(axis=(0, 2, 3))
    assert carried[3] - plain[3] == pytest.approx(1e-5 * np.linalg.norm(abs_mean), rel=1e-6)
    assert carried[1] > plain[1] and carried[2] > plain[2]


def test_ln_grad_floor_bounds_float32_against_float64():
    """LayerNormalizationGrad's dscale sums batch x sequence rows: a float32 sequential sum of R
    terms whose exact value cancels stays within the floor."""
    rng = np.random.default_rng(7)
    rows, d = 4096, 16
    x = rng.standard_normal((rows, d)).astype(np.float32)
    dy = rng.standard_normal((rows, d)).astype(np.float32)
    mean = x.mean(axis=1, keepdims=True)
    inv_std = (1 / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5)).astype(np.float32)
    xh = ((x - mean) * inv_std).astype(np.float32)
    dscale32 = np.cumsum(dy * xh, axis=0, dtype=np.float32)[-1]  # sequential over the rows
    dscale64 = np.sum(dy.astype(np.float64) * xh.astype(np.float64), axis=0)
    c, m = ln_grad_floor(dy, x, np.ones(d, np.float32), mean, inv_std)[1]
    assert float(np.linalg.norm(dscale32 - dscale64)) < c * m / 2
    assert c == pytest.approx(sum_rounding(rows, 4))


def test_loss_floor_bounds_a_long_token_mean_and_not_a_1e3_fault():
    rng = np.random.default_rng(8)
    k, v = 512, 4096
    scores = (3 * rng.standard_normal((k, v))).astype(np.float32)
    labels = rng.integers(0, v, k)
    labels[::7] = -100
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["s", "y"], ["l"], ignore_index=-100)

    def sce(x, dtype):
        x = x.astype(dtype)
        keep = labels != -100
        m = x.max(axis=1, keepdims=True)
        lp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True, dtype=dtype))
        return float(np.cumsum(-lp[keep, labels[keep]], dtype=dtype)[-1] / keep.sum())

    exact, f32 = sce(scores, np.float64), sce(scores, np.float32)
    floor = loss_floor(node, [scores, labels])
    assert abs(f32 - exact) < floor / 2
    assert floor / exact < 1e-4  # a 1e-3 fault in the loss is still far beyond it


def _bn_forward(path, n=2, c=4, side=224):
    """x [n, c, side, side] -> 1x1 Conv (bias 0.5: channel means well away from 0) -> BatchNorm
    (training) -> GlobalAveragePool -> [n, c]: one BatchNorm over n x side x side = 100k values."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array((0.3 * rng.standard_normal((c, c, 1, 1))).astype(np.float32), "w"),
             numpy_helper.from_array(np.full(c, 0.5, np.float32), "b"),
             numpy_helper.from_array(np.ones(c, np.float32), "scale"),
             numpy_helper.from_array(np.zeros(c, np.float32), "shift"),
             numpy_helper.from_array(np.zeros(c, np.float32), "mean"),
             numpy_helper.from_array(np.ones(c, np.float32), "var")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "scale", "shift", "mean", "var"], ["y"], training_mode=1),
             helper.make_node("GlobalAveragePool", ["y"], ["p"]),
             helper.make_node("Flatten", ["p"], ["out"])]
    graph = helper.make_graph(nodes, "bn100k", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, side, side])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [n, c])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


@pytest.fixture(scope="module")
def bn100k(tmp_path_factory):
    import onnxplan
    from onnxplan.executor.prepare import Prepared, adopt_plan

    step = onnxplan.load(_bn_forward(tmp_path_factory.mktemp("bn") / "bn100k.onnx"), loss="mse", optimizer="sgd")
    plan = onnxplan.plan(step)
    return Prepared(step.folder, adopt_plan(step.graph, plan), plan)


def test_a_batchnorm_over_100k_values_verifies_against_ort(bn100k):
    v = verify_run(bn100k, steps=2)
    assert v.ok, v.summary()
    running = v.steps[0].checks["running"]
    assert running.tolerance < 1e-3  # the floor at N = 100k, a mean well away from 0: a 1e-3 fault shows


@pytest.mark.parametrize("output", [1, 2])  # running mean, running variance
def test_a_1e3_fault_in_a_running_statistic_over_100k_values_fails(monkeypatch, bn100k, output):
    node = next(n for n in bn100k.graph.nodes if n.op_type in ("BatchNormInternal", "BatchNormalization"))
    decl = find_decl(node.domain, node.op_type, bn100k.graph.opsets.get(node.domain))
    fn = decl.fn

    def bad(ctx, inputs, outputs):
        fn(ctx, inputs, outputs)
        outputs[output] *= np.float32(1 + 1e-3)

    monkeypatch.setattr(decl, "fn", bad)
    monkeypatch.setattr(decl, "bind", None)
    v = verify_run(bn100k, steps=1)
    assert not v.ok
    kinds = {c.kind for c in v.steps[0].failures if c.node == node.name}
    assert kinds == {"running", "node"}, v.steps[0].failures  # end to end, and per node at that BatchNorm
