"""Softmax, its gradients and the cross-entropy loss kernels against ONNX Runtime and the reference."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan.ir.graph import Node
from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.registry import KernelContext, find_kernel, may_overwrite, scratch_bytes
from tests.kernel_harness import (
    MS,
    RNG,
    F,
    assert_close,
    check,
    make_node,
    ort_run,
    peak_bytes,
    rand,
    ref_run,
    run_kernel,
)

I64 = np.int64


def log_softmax(x, axis):
    x = x.astype(np.float64)
    z = x - x.max(axis=axis, keepdims=True)
    return (z - np.log(np.exp(z).sum(axis=axis, keepdims=True))).astype(F)


# ---- softmax and its gradients ---------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax(op, axis):
    check(op, [rand(3, 4, 5, lo=-8, hi=8)], {"axis": axis}, aliases=[(0, 0)])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_wide_rows(op):
    """Rows wider than one block: the log-sum-exp accumulates block by block."""
    check(op, [rand(3, 20011, lo=-20, hi=20)], {"axis": -1}, aliases=[(0, 0)])
    check(op, [rand(9000, 2, 3)], {"axis": 1}, aliases=[(0, 0)])


@pytest.mark.parametrize("op", ["SoftmaxGrad_13", "LogSoftmaxGrad_13"])
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_grads_13(op, axis):
    x = rand(3, 4, 5)
    ax = axis % x.ndim
    y = log_softmax(x, ax) if op.startswith("Log") else np.exp(log_softmax(x, ax))
    check(op, [rand(3, 4, 5), y], {"axis": axis}, domain=MS, aliases=[(0, 0), (0, 1)])


@pytest.mark.parametrize("op", ["SoftmaxGrad", "LogSoftmaxGrad"])
@pytest.mark.parametrize("axis", [1, 2, None])
def test_legacy_softmax_grads_coerce_to_2d(op, axis):
    x = rand(2, 3, 4)
    ax = 1 if axis is None else axis
    flat = x.reshape(int(np.prod(x.shape[:ax])), -1)
    y = log_softmax(flat, 1) if op.startswith("Log") else np.exp(log_softmax(flat, 1))
    attrs = {} if axis is None else {"axis": axis}
    check(op, [rand(2, 3, 4), y.reshape(x.shape)], attrs, domain=MS, aliases=[(0, 0), (0, 1)])


def test_softmax_grad_wide_rows():
    x = rand(2, 20011)
    check("SoftmaxGrad_13", [rand(2, 20011), np.exp(log_softmax(x, 1))], domain=MS, aliases=[(0, 1)])


# ---- cross entropy ---------------------------------------------------------------------------------
def labels_for(shape, classes, ignore=None, frac=0.3):
    labels = RNG.integers(0, classes, size=shape).astype(I64)
    if ignore is not None:
        labels[RNG.random(shape) < frac] = ignore
    return labels


CASES = [  # (logits shape, attrs, label to plant as ignored)
    ((8, 5), {"reduction": "mean"}, None),
    ((8, 5), {"reduction": "sum"}, None),
    ((8, 5), {"reduction": "none"}, None),
    ((8, 5), {"reduction": "mean", "ignore_index": 2}, 2),
    ((4, 5, 3, 2), {"reduction": "mean", "ignore_index": 7}, 7),
    ((4, 5, 3), {"reduction": "none", "ignore_index": -100}, -100),
    ((4, 5, 3), {"reduction": "sum"}, None),
    ((6, 7), {"reduction": "mean"}, -1),  # ORT: no ignore_index attribute means -1 is ignored
    ((6, 7), {}, -1),
]


@pytest.mark.parametrize("shape,attrs,ignore", CASES, ids=str)
@pytest.mark.parametrize("weighted", [False, True])
def test_sce_loss(shape, attrs, ignore, weighted):
    n, c, rest = shape[0], shape[1], shape[2:]
    inputs = [rand(*shape, lo=-4, hi=4), labels_for((n, *rest), c, ignore)]
    if weighted:
        inputs.append(rand(c, lo=0.1, hi=2.0))
    # the reference evaluator ignores nothing without the attribute; ORT ignores -1 then
    against = ("ort",) if "ignore_index" not in attrs and ignore is not None else ("reference", "ort")
    check("SoftmaxCrossEntropyLoss", inputs, attrs, n_out=2, against=against)
    check("SoftmaxCrossEntropyLossInternal", inputs + ([] if weighted else [None]) + [np.array(ignore or -1, I64)],
          {k: v for k, v in attrs.items() if k != "ignore_index"}, n_out=2, domain=MS)


def test_sce_loss_without_log_prob_output_uses_scratch():
    x, labels = rand(8, 5), labels_for((8,), 5)
    node = make_node("SoftmaxCrossEntropyLoss", [x, labels], 1, {"reduction": "mean"})
    assert scratch_bytes(node, [TensorSpec(F, x.shape), TensorSpec(I64, labels.shape)], [None]) == x.nbytes
    want = ref_run("SoftmaxCrossEntropyLoss", [x, labels], 1, {"reduction": "mean"})
    assert_close(run_kernel("SoftmaxCrossEntropyLoss", [x, labels], want, node=node), want)


def test_sce_loss_all_ignored_mean_is_zero():
    x, labels = rand(4, 3), np.full(4, 1, I64)
    want = ort_run("SoftmaxCrossEntropyLoss", [x, labels], 2, {"ignore_index": 1})
    got = run_kernel("SoftmaxCrossEntropyLoss", [x, labels], want, {"ignore_index": 1})
    assert_close(got, want)
    assert got[0] == 0


def test_sce_label_out_of_range():
    with pytest.raises(IndexError):
        run_kernel("SoftmaxCrossEntropyLoss", [rand(3, 4), np.array([0, 4, 1], I64)], [(F, ()), (F, (3, 4))])


@pytest.mark.parametrize("shape,attrs,ignore", CASES, ids=str)
@pytest.mark.parametrize("weighted", [False, True])
def test_sce_loss_grad(shape, attrs, ignore, weighted):
    n, c, rest = shape[0], shape[1], shape[2:]
    labels = labels_for((n, *rest), c, ignore)
    lp = log_softmax(rand(*shape, lo=-4, hi=4), 1)
    dy = rand(n, *rest) if attrs.get("reduction") == "none" else np.array(1.7, F)
    inputs = [dy, lp, labels] + ([rand(c, lo=0.1, hi=2.0)] if weighted else [])
    check("SoftmaxCrossEntropyLossGrad", inputs, attrs, domain=MS, aliases=[(0, 1)])


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_sce_loss_internal_grad_with_ignore_input_and_bias(reduction):
    labels = labels_for((6, 3), 5, ignore=4)
    lp = log_softmax(rand(6, 5, 3), 1)
    dy = rand(6, 3) if reduction == "none" else np.array(0.5, F)
    inputs = [dy, lp, labels, rand(5, lo=0.1, hi=2.0), np.array(4, I64), rand(6, 5, 3)]
    check("SoftmaxCrossEntropyLossInternalGrad", inputs, {"reduction": reduction}, domain=MS, aliases=[(0, 1)])
    check("SoftmaxCrossEntropyLossInternalGrad", inputs[:3] + [None, np.array(4, I64)],
          {"reduction": reduction}, domain=MS, aliases=[(0, 1)])


# ---- declarations and memory -----------------------------------------------------------------------
def test_in_place_declarations():
    def ow(op, domain=MS):
        return may_overwrite(Node("n", op, domain, ["a", "b", "c"], ["y"]))

    assert ow("Softmax", "") == ow("LogSoftmax", "") == {0: (0,)}
    for op in ("SoftmaxGrad_13", "LogSoftmaxGrad_13", "SoftmaxGrad", "LogSoftmaxGrad"):
        assert ow(op) == {0: (0, 1)}, op
    assert ow("SoftmaxCrossEntropyLossGrad") == {0: (1,)}
    assert ow("SoftmaxCrossEntropyLoss", "") == {}


BIG = (256, 4096)  # 4 MiB of float32


@pytest.mark.parametrize("op,domain,make", [
    ("Softmax", "", lambda: [rand(*BIG)]),
    ("LogSoftmax", "", lambda: [rand(*BIG)]),
    ("SoftmaxGrad_13", MS, lambda: [rand(*BIG), rand(*BIG, lo=0, hi=1)]),
    ("LogSoftmaxGrad_13", MS, lambda: [rand(*BIG), rand(*BIG, lo=-9, hi=0)]),
    ("SoftmaxCrossEntropyLossGrad", MS, lambda: [np.array(1.0, F), rand(*BIG, lo=-9, hi=0),
                                                 labels_for(BIG[:1], BIG[1])]),
])
def test_no_tensor_sized_allocation(op, domain, make):
    xs = make()
    node = make_node(op, xs, domain=domain)
    outputs = [np.empty(BIG, F)]
    ctx = KernelContext(np, node, [TensorSpec(x.dtype, x.shape) for x in xs], [TensorSpec(F, BIG)])
    fn = find_kernel(node).fn
    fn(ctx, xs, outputs)
    assert peak_bytes(lambda: fn(ctx, xs, outputs)) < 4 * 1024 * 1024 // 8


def test_sce_loss_allocates_only_label_sized_temporaries():
    x, labels = rand(*BIG), labels_for(BIG[:1], BIG[1])
    node = make_node("SoftmaxCrossEntropyLoss", [x, labels], 2)
    outputs = [np.empty((), F), np.empty(BIG, F)]
    ctx = KernelContext(np, node, [TensorSpec(F, BIG), TensorSpec(I64, labels.shape)], [None, None])
    fn = find_kernel(node).fn
    fn(ctx, [x, labels], outputs)
    assert peak_bytes(lambda: fn(ctx, [x, labels], outputs)) < 4 * 1024 * 1024 // 8


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 2])
def test_negative_log_likelihood_loss(reduction, weighted, ignore):
    from tests.kernel_harness import check

    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    target = rng.integers(0, 5, size=(3, 4)).astype(np.int64)
    inputs = [x, target] + ([rng.uniform(0.5, 2, 5).astype(np.float32)] if weighted else [])
    attrs = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    check("NegativeLogLikelihoodLoss", inputs, attrs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("width", [1, 7, 8, 9, 64, 130])
def test_the_fused_softmax_loop_against_float64(width, split, monkeypatch):
    """The fused softmax loop (native.softmax_rows, by rows on the GEMM pool): against float64 for
    rows narrower and wider than its eight lanes, values from -80 to 80 and -inf entries; cut by
    rows across 3 threads it gives the whole loop's bits, and in place the bits out of place."""
    from onnxplan.kernels import gemm_calls, native, softmax_loss

    if native.softmax_rows() is None:
        pytest.skip("no C compiler: torch's softmax")
    rng = np.random.default_rng(width)
    x = (rng.standard_normal((37, width)) * 30).clip(-80, 80).astype(F)
    x[3, : max(1, width // 2)] = -np.inf
    x3 = x.reshape(37, width, 1)
    with np.errstate(invalid="ignore"):  # a row all -inf (width 1): NaN, as ORT's
        want = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        want /= want.sum(axis=1, keepdims=True)
    outs = []
    for least in (1 << 30, 16):  # whole, then cut by rows on the pool
        monkeypatch.setattr(gemm_calls, "POOLED_MIN_ELEMS", least)
        out = np.full_like(x, np.nan)
        call = softmax_loss._native_softmax(np, x3, out.reshape(x3.shape))
        assert call is not None and isinstance(call, gemm_calls.PooledCalls) == (least == 16)
        call()
        outs.append(out)
    np.testing.assert_allclose(outs[0], want, rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(outs[1], outs[0])
    inplace = x.copy()
    softmax_loss._native_softmax(np, inplace.reshape(x3.shape), inplace.reshape(x3.shape))()
    np.testing.assert_array_equal(inplace, outs[0])
