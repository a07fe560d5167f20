"""Elementwise kernels against the ONNX reference evaluator and ONNX Runtime, in place and allocation-free."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.ir.graph import Node
from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.registry import KernelContext, find_kernel, may_overwrite
from tests.kernel_harness import (
    ATOL,
    DEVICE,
    MS,
    RNG,
    RTOL,
    F,
    check,
    make_node,
    ort_run,
    peak_bytes,
    rand,
    run_kernel,
)

# ---- standard ops ------------------------------------------------------------------------------------
UNARY = {"Neg": (-3, 3), "Sqrt": (0.01, 9), "Exp": (-5, 5), "Log": (0.01, 9), "Tanh": (-4, 4),
         "Abs": (-3, 3), "Reciprocal": (0.5, 3), "Relu": (-3, 3), "Sigmoid": (-10, 10), "Erf": (-4, 4),
         "Floor": (-3, 3), "Ceil": (-3, 3), "Sin": (-3, 3), "Cos": (-3, 3), "Sign": (-3, 3),
         "Round": (-3, 3)}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op):
    lo, hi = UNARY[op]
    check(op, [rand(4, 5, 6, lo=lo, hi=hi)], aliases=[(0, 0)])


def test_erf_edges():
    x = np.array([0.0, 1e-30, -1e-6, 1e-3, 0.4999, 0.5, -0.5001, 3.9, 6.0, -30.0, np.inf, -np.inf], F)
    check("Erf", [x], against=("reference",))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference evaluator's exp overflows
def test_sigmoid_extremes():
    x = np.array([-200.0, -89.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 200.0], F)
    check("Sigmoid", [x], against=("reference",))


def test_leaky_relu_and_clip():
    check("LeakyRelu", [rand(3, 7)], {"alpha": 0.2}, aliases=[(0, 0)])
    x = rand(3, 7)
    check("Clip", [x, np.array(-1.0, F), np.array(0.5, F)], aliases=[(0, 0)])
    check("Clip", [x, None, np.array(0.5, F)], aliases=[(0, 0)])
    check("Clip", [x], aliases=[(0, 0)])


BINARY_SHAPES = [((3, 4, 5), (3, 4, 5)), ((3, 4, 5), (5,)), ((4, 1), (3, 4, 5)), ((), (2, 3))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum"])
@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
def test_binary(op, shapes):
    lo = 0.5 if op in ("Div", "Pow") else -3.0
    a, b = rand(*shapes[0], lo=lo), rand(*shapes[1], lo=lo, hi=2.0)
    out_shape = np.broadcast_shapes(a.shape, b.shape)
    aliases = [(0, i) for i, x in enumerate((a, b)) if x.shape == out_shape]
    check(op, [a, b], aliases=aliases)


def test_variadic_and_mean():
    xs = [rand(2, 3), rand(3), rand(2, 3)]
    for op in ("Sum", "Max", "Min", "Mean"):
        check(op, xs, aliases=[(0, 0)])
        check(op, xs[:1], aliases=[(0, 0)])


def test_pow_integer_exponent_and_integer_division():
    check("Pow", [rand(3, 4), np.array(2, np.int64)], aliases=[(0, 0)])
    check("Pow", [rand(3, 4), np.array([3, 2, 1, 0], np.int32)], aliases=[(0, 0)])
    a = np.array([7, -7, 7, -7, 0, 6, -6, 9], np.int64)
    b = np.array([2, 2, -2, -2, 3, 3, 4, -4], np.int64)
    check("Div", [a, b], aliases=[(0, 0), (0, 1)])  # truncation toward zero, as C++
    check("Div", [np.array([12, 13], np.int32), np.array(5, np.int32)])


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_comparison(op):
    a = RNG.integers(0, 3, size=(4, 5)).astype(F)
    check(op, [a, RNG.integers(0, 3, size=(5,)).astype(F)])
    check(op, [a.astype(np.int64), np.array(1, np.int64)])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op):
    check(op, [RNG.integers(0, 2, size=(3, 4)).astype(bool), RNG.integers(0, 2, size=(4,)).astype(bool)])
    check("Not", [RNG.integers(0, 2, size=(3, 4)).astype(bool)], aliases=[(0, 0)])


def test_where():
    cond = RNG.integers(0, 2, size=(3, 1, 5)).astype(bool)
    check("Where", [cond, rand(4, 5), rand(3, 4, 1)])
    check("Where", [cond, np.array(0.0, F), rand(5)])


# ---- ONNX Runtime contrib and training ops -----------------------------------------------------
@pytest.mark.parametrize("op", ["Gelu", "FastGelu", "QuickGelu"])
def test_gelu_family(op):
    x = rand(6, 33, lo=-6, hi=6)
    check(op, [x], domain=MS, aliases=[(0, 0)])


def test_fast_gelu_bias():
    check("FastGelu", [rand(4, 8), rand(8)], domain=MS, aliases=[(0, 0)])


@pytest.mark.parametrize("op", ["ReluGrad", "SigmoidGrad", "TanhGrad", "GeluGrad", "FastGeluGrad",
                                "QuickGeluGrad"])
def test_activation_grads(op):
    x = rand(5, 40, lo=-5, hi=5)
    if op == "SigmoidGrad":
        x = 1 / (1 + np.exp(-x))
    elif op == "TanhGrad":
        x = np.tanh(x)
    elif op == "ReluGrad":
        x[0, :5] = 0.0  # the boundary: dX is 0 there
    # FastGeluGrad cancels (tanh ~ -1 plus 1) for X < -3: float32 leaves ~1e-6 |dY| of noise in
    # ORT's formula and ours alike (both that far from the float64 value); QuickGeluGrad cancels
    # likewise (1 + aX(1 - s) near 0), and CUDA's expf is not the CPU's
    atol = 1e-5 if op == "FastGeluGrad" or (op == "QuickGeluGrad" and DEVICE == "cuda") else ATOL
    check(op, [rand(5, 40), x.astype(F)], domain=MS, aliases=[(0, 0), (0, 1)], atol=atol)


@pytest.mark.parametrize("scale_dtype", [np.float32, np.int64])
@pytest.mark.parametrize("scale_down", [0, 1])
def test_scale_matches_ort_bit_for_bit(scale_dtype, scale_down):
    """scale_down multiplies by the float32 reciprocal (not a division): identical bits to ORT."""
    x = rand(7, 9)
    s = np.array(3, scale_dtype)
    want = ort_run("Scale", [x, s], 1, {"scale_down": scale_down}, MS)
    for alias in (None, (0, 0)):
        got = run_kernel("Scale", [x, s], want, {"scale_down": scale_down}, MS, alias=alias)
        np.testing.assert_array_equal(got[0], want[0])


# ---- declarations and memory -----------------------------------------------------------------------
UNARY_IN_PLACE = ["Relu", "Sigmoid", "Tanh", "Exp", "Log", "Neg", "Sqrt", "Reciprocal", "Erf", "Abs",
                  "LeakyRelu", "Clip"]
BINARY_IN_PLACE = ["Add", "Sub", "Mul", "Div", "Pow", "Sum", "Max", "Min"]
GRAD_IN_PLACE = ["ReluGrad", "SigmoidGrad", "TanhGrad", "GeluGrad", "FastGeluGrad"]


def test_in_place_declarations():
    """The Modify-View capabilities, declared with the kernels (as declarations.py had them)."""
    def ow(op, domain=""):
        return may_overwrite(Node("n", op, domain, ["a", "b"], ["y"]))

    for op in UNARY_IN_PLACE:
        assert ow(op) == {0: (0,)}, op
    for op in ("Gelu", "FastGelu", "Scale"):
        assert ow(op, MS) == {0: (0,)}, op
    for op in BINARY_IN_PLACE:
        assert ow(op) == {0: (0, 1)}, op
    for op in GRAD_IN_PLACE:
        assert ow(op, MS) == {0: (0, 1)}, op
    for op in ("Where", "Equal", "IsNaN", "Less"):
        assert ow(op) == {}, op


def test_sum_with_the_output_twice_among_its_inputs():
    """Sum(x, y, x) written into x's memory: both reads of x happen before the first write."""
    x, y = rand(3, 4), rand(3, 4)
    want = x + y + x
    node = make_node("Sum", [x, y, x])
    find_kernel(node).fn(KernelContext(np, node, [], []), [x, y, x], [x])
    np.testing.assert_allclose(x, want, rtol=RTOL)


BIG = (1024, 1024)  # 4 MiB of float32


@pytest.mark.parametrize("op,domain,n_in", [("GeluGrad", MS, 2), ("Gelu", MS, 1), ("FastGeluGrad", MS, 2),
                                            ("Erf", "", 1), ("Sigmoid", "", 1), ("ReluGrad", MS, 2),
                                            ("TanhGrad", MS, 2), ("Add", "", 2), ("Div", "", 2)])
def test_no_tensor_sized_allocation(op, domain, n_in):
    inputs = [rand(*BIG) for _ in range(n_in)]
    if op == "Add":
        inputs[1] = rand(BIG[1])
    node = make_node(op, inputs, domain=domain)
    run_kernel(op, inputs, [(F, BIG)], node=node)  # warm up imports and caches
    outputs = [np.empty(BIG, F)]
    ctx = KernelContext(np, node, [TensorSpec("float32", x.shape) for x in inputs], [TensorSpec("float32", BIG)])
    fn = find_kernel(node).fn
    assert peak_bytes(lambda: fn(ctx, inputs, outputs)) < 4 * 1024 * 1024 // 8


def _fused_loop_runs(monkeypatch, name: str, x, dy) -> list:
    """The outputs of native_activation(`name`) on x (with dy: its gradient): whole, cut on the
    GEMM pool (pieces from 2 elements), then in place over X and (gradient) over dY."""
    from onnxplan.kernels import elementwise, gemm_calls

    outs = []
    for least in (1 << 30, 2):  # whole, then cut on the pool
        monkeypatch.setattr(gemm_calls, "POOLED_MIN_ELEMS", least)
        out = np.full_like(x, 7.0)
        call = elementwise.native_activation(np, name, out, x, dy)
        assert call is not None and isinstance(call, gemm_calls.PooledCalls) == (least == 2)
        call()
        outs.append(out)
    for over in range(1 if dy is None else 2):
        inplace = [a.copy() for a in (x, dy) if a is not None]
        elementwise.native_activation(np, name, inplace[over], *inplace)()
        outs.append(inplace[over])
    return outs


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("size", [1, 7, 8, 9, 4099])
def test_the_fused_gelu_loops_against_float64(size, grad, split, monkeypatch):
    """The exact GELU's fused loops (elementwise.native_activation: erf by Abramowitz and Stegun 7.1.26
    and the SCE loops' exp), the forward and (`grad`) ORT's GeluGrad: within float64's value by
    erf's float32 error through 0.5 x (the gradient: 0.5 dY) plus three roundings, on values
    around +-4 and the edges (+-0, subnormals, +-inf, NaN, +-3e38, +-14), and on 4,099 values no
    further than 1.5x torch's gelu or gelu_backward (the same erf formula); sizes short of and
    past eight lanes; cut on the GEMM pool across 3 threads the whole loop's bits, in place
    (over X, and over dY) the bits out of place."""
    import math

    import torch

    from onnxplan.kernels import native

    if native.activation("gelu", grad) is None:
        pytest.skip("no C compiler: torch's gelu")
    rng = np.random.default_rng(size)
    edges = np.array([0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38, np.inf, np.nan, 14.0, -14.0], F)
    x = np.concatenate([edges, (rng.standard_normal(size) * 4).astype(F)])
    dy = (rng.standard_normal(x.size) * 2).astype(F) if grad else None
    got, *others = _fused_loop_runs(monkeypatch, "gelu", x, dy)
    for other in others:
        np.testing.assert_array_equal(other, got)
    tx = torch.from_numpy(x)
    theirs = (torch.ops.aten.gelu_backward(torch.from_numpy(dy), tx, approximate="none") if grad
              else torch.ops.aten.gelu(tx, approximate="none")).numpy()
    assert np.isnan(got[7]) and np.isnan(theirs[7])
    xd = x.astype(np.float64)
    fin = np.isfinite(xd) & (np.abs(xd) < 1e30 if grad else True)  # the gradient of +-3e38: dY x pdf, 0 x inf
    xf = xd[fin]
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in xf]))
    if grad:
        g = dy.astype(np.float64)[fin]
        want = g * (cdf + xf * np.exp(-0.5 * xf * xf) / math.sqrt(2.0 * math.pi))
        scale = np.abs(g)
    else:
        assert np.isposinf(got[6])
        want, scale = xf * cdf, np.abs(xf)
    err = np.abs(got[fin] - want)
    # erf's error in float32 (the formula's 1.5e-7 and its evaluation's roundings: within 4e-7 for
    # torch's and ours on 400K values) through 0.5 x (0.5 dY), and three roundings of the result
    assert np.all(err <= 2e-7 * scale + 3 * 2.0**-24 * np.abs(want) + 1e-45)
    if size > 1000:
        assert err.max() <= 1.5 * np.abs(theirs[fin] - want).max()


def test_the_fused_gelu_loop_is_refused_where_it_cannot_run():
    """No fused loop for float64, a strided view, or an output overlapping an input other than
    in place (torch's or numpy's path takes those)."""
    from onnxplan.kernels import elementwise, native

    if native.activation("gelu") is None:
        pytest.skip("no C compiler")
    x = rand(64)
    assert elementwise.native_activation(np, "gelu", x.astype(np.float64), x.astype(np.float64)) is None
    assert elementwise.native_activation(np, "gelu", rand(32), x[::2]) is None
    buf = rand(72)
    assert elementwise.native_activation(np, "gelu", buf[8:72], buf[0:64]) is None
    assert elementwise.native_activation(np, "gelu", buf[:64], buf[:64]) is not None
    assert elementwise.native_activation(np, "gelu", buf[8:72], x, buf[0:64]) is None  # dX overlapping dY
    assert elementwise.native_activation(np, "gelu", buf[:64], x, buf[:64]) is not None


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("size", [1, 7, 8, 9, 4099])
def test_the_fused_relu_loops_are_ort_bitwise(size, grad, split, monkeypatch):
    """ReLU's fused loops (elementwise.native_activation "relu") give ONNX Runtime's Relu and
    ReluGrad bit for bit, edges too (NaN and -0 kept by the forward, dX 0 where X is NaN, +-inf,
    subnormals); sizes short of and past eight lanes; cut on the GEMM pool the whole loop's bits;
    in place (over X, and over dY) the same; and the kernels' bound steps take the loop."""
    from onnxplan.kernels import elementwise, native

    if native.activation("relu", grad) is None:
        pytest.skip("no C compiler: numpy's maximum, torch's threshold_backward")
    rng = np.random.default_rng(size + 7 * grad)
    edges = np.array([0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38, np.inf, -np.inf, np.nan, -np.nan], F)
    x = np.concatenate([edges, rng.standard_normal(size).astype(F)])
    dy = np.concatenate([np.array([np.nan, np.inf, -1.0, 2.0, -0.0, 3.0, np.nan, 4.0, 5.0, -np.inf], F),
                         rng.standard_normal(size).astype(F)]) if grad else None
    want = ort_run("ReluGrad", [dy, x], domain=MS)[0] if grad else ort_run("Relu", [x])[0]
    for got in _fused_loop_runs(monkeypatch, "relu", x, dy):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    ins = [dy, x] if grad else [x]
    node = Node("r", "ReluGrad" if grad else "Relu", MS if grad else "", ["a", "b"][:len(ins)], ["y"])
    ctx = KernelContext(np, node, [None] * len(ins), [None])
    out = np.full_like(x, 7.0)
    step = (elementwise._relu_grad_step if grad else elementwise._native_relu)(ctx, ins, [out])
    assert step is not None
    step(ctx, ins, [out])
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_bias_gelu_by_the_fused_loop_matches_ort():
    """BiasGelu (X + bias, then the GELU in place): ORT's values, in place on X too."""
    check("BiasGelu", [rand(4, 40, lo=-6, hi=6), rand(40)], domain=MS, aliases=[(0, 0)])
