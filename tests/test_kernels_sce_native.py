"""SoftmaxCrossEntropyLoss and its gradient by the fused C loops (onnxplan.kernels.native.sce):
against the numpy path (native kernels off), ONNX's reference evaluator and ONNX Runtime within
the kernel tests' tolerances, at 1 and 2 threads (rows cut across them, the same bits), the loops
seen to run; labels out of range raise IndexError as on the numpy path; the split pass's row
chunks agree with the whole node bit for bit; what the loops do not take stays on numpy."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan import settings, threads
from onnxplan.kernels import native, parallel
from tests import kernel_harness
from tests.kernel_harness import (
    MS,
    assert_close,
    count_loop_calls,
    make_node,
    ort_run,
    ref_run,
    run_kernel,
    seed_for,
)

pytestmark = pytest.mark.skipif(native.sce() is None, reason="no C compiler: the numpy path only")

F, I64 = np.float32, np.int64
LOSS, GRAD = "SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad"


@pytest.fixture
def loops(monkeypatch):
    """Counts of the fused loops' calls ({"loss": n, "grad": n}) while the test runs."""
    return count_loop_calls(monkeypatch, "sce", ("loss", "grad"))


def _labels(rng, shape, classes, ignore=None, frac=0.3):
    labels = rng.integers(0, classes, size=shape).astype(I64)
    if ignore is not None:
        labels[rng.random(shape) < frac] = ignore
    return labels


def _log_probs(rng, shape):
    x = rng.uniform(-4, 4, shape)
    z = x - x.max(axis=1, keepdims=True)
    return (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).astype(F)


def _numpy(*args, **kwargs) -> list:
    with settings.override(native_kernels=False):
        assert native.sce() is None
        return run_kernel(*args, **kwargs)


CASES = [  # (scores shape, attrs, label planted as ignored)
    ((8, 5), {"reduction": "mean"}, None),
    ((8, 5), {"reduction": "sum"}, None),
    ((8, 5), {"reduction": "none"}, None),
    ((8, 5), {"reduction": "mean", "ignore_index": 2}, 2),
    ((64, 10), {"reduction": "mean", "ignore_index": -1}, -1),  # mlp's
    ((3, 2011), {"reduction": "sum", "ignore_index": 5}, 5),  # wide rows: eight lanes and a tail
    ((4, 5, 3, 2), {"reduction": "mean", "ignore_index": 7}, 7),
    ((4, 5, 3), {"reduction": "none", "ignore_index": -100}, -100),
    ((5, 13, 9), {"reduction": "sum", "ignore_index": 0}, 0),  # d = 9: eight columns and one
    ((3, 6, 17), {"reduction": "none"}, None),
]


@pytest.mark.parametrize("shape,attrs,ignore", CASES, ids=str)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("log_prob_out", [True, False], ids=["log_prob", "no-log_prob"])
def test_the_fused_loss_matches_numpy_the_reference_and_ort(shape, attrs, ignore, weighted, log_prob_out, loops,
                                                            n_threads):
    rng = np.random.default_rng(seed_for(f"loss {shape} {weighted}"))
    n, c, rest = shape[0], shape[1], shape[2:]
    inputs = [rng.uniform(-4, 4, shape).astype(F), _labels(rng, (n, *rest), c, ignore)]
    if weighted:
        inputs.append(rng.uniform(0.1, 2.0, c).astype(F))
    n_out = 2 if log_prob_out else 1
    want = ref_run(LOSS, inputs, n_out, attrs)
    got = run_kernel(LOSS, inputs, want, attrs)
    assert loops["loss"] >= 1
    assert_close(got, want)
    assert_close(got, ort_run(LOSS, inputs, n_out, attrs))
    assert_close(got, _numpy(LOSS, inputs, want, attrs))


@pytest.mark.parametrize("shape,attrs,ignore", CASES, ids=str)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_the_fused_gradient_matches_numpy_and_ort(shape, attrs, ignore, weighted, loops, n_threads):
    rng = np.random.default_rng(seed_for(f"grad {shape} {weighted}"))
    n, c, rest = shape[0], shape[1], shape[2:]
    dy = rng.uniform(-2, 2, (n, *rest)).astype(F) if attrs["reduction"] == "none" else np.array(1.7, F)
    inputs = [dy, _log_probs(rng, shape), _labels(rng, (n, *rest), c, ignore)]
    if weighted:
        inputs.append(rng.uniform(0.1, 2.0, c).astype(F))
    want = ort_run(GRAD, inputs, 1, attrs, MS)
    got = run_kernel(GRAD, inputs, want, attrs, MS)
    assert loops["grad"] >= 1
    assert_close(got, want)
    assert_close(got, _numpy(GRAD, inputs, want, attrs, MS))
    in_place = run_kernel(GRAD, inputs, want, attrs, MS, alias=(0, 1))  # dlogits written over log_prob
    np.testing.assert_array_equal(in_place[0], got[0])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_the_internal_forms_with_an_ignore_input_and_a_bias(reduction, loops, n_threads):
    rng = np.random.default_rng(7)
    scores, labels, weight = rng.uniform(-4, 4, (6, 5, 3)).astype(F), _labels(rng, (6, 3), 5, 4), rng.uniform(0.1, 2, 5)
    ignore = np.array(4, I64)
    fwd = [scores, labels, weight.astype(F), ignore]
    want = ort_run("SoftmaxCrossEntropyLossInternal", fwd, 2, {"reduction": reduction}, MS)
    got = run_kernel("SoftmaxCrossEntropyLossInternal", fwd, want, {"reduction": reduction}, MS)
    assert_close(got, want)
    dy = rng.uniform(-1, 1, (6, 3)).astype(F) if reduction == "none" else np.array(0.5, F)
    for bwd in ([dy, got[1], labels, weight.astype(F), ignore, rng.uniform(-1, 1, (6, 5, 3)).astype(F)],
                [dy, got[1], labels, None, ignore]):
        want = ort_run("SoftmaxCrossEntropyLossInternalGrad", bwd, 1, {"reduction": reduction}, MS)
        grad = run_kernel("SoftmaxCrossEntropyLossInternalGrad", bwd, want, {"reduction": reduction}, MS)
        assert_close(grad, want)
        assert_close(grad, _numpy("SoftmaxCrossEntropyLossInternalGrad", bwd, want, {"reduction": reduction}, MS))
    assert loops["loss"] >= 1 and loops["grad"] >= 2


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_all_ignored_gives_a_zero_mean_and_gradient(weighted, loops, n_threads):
    rng = np.random.default_rng(3)
    scores, labels = rng.uniform(-4, 4, (9, 4)).astype(F), np.full(9, 1, I64)
    extra = [rng.uniform(0.1, 2, 4).astype(F)] if weighted else []
    attrs = {"ignore_index": 1}
    want = ort_run(LOSS, [scores, labels, *extra], 2, attrs)
    got = run_kernel(LOSS, [scores, labels, *extra], want, attrs)
    assert got[0] == 0 and want[0] == 0
    assert_close(got, want)
    grad = run_kernel(GRAD, [np.array(1.0, F), got[1], labels, *extra], [(F, (9, 4))], attrs, MS)
    assert not grad[0].any()
    assert loops["loss"] >= 1 and loops["grad"] >= 1


@pytest.mark.parametrize("bad", [4, -2], ids=["too-big", "negative"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_a_label_out_of_range_raises_index_error(bad, reduction, loops, n_threads):
    rng = np.random.default_rng(5)
    scores, labels = rng.uniform(-1, 1, (40, 4)).astype(F), rng.integers(0, 4, 40).astype(I64)
    labels[31] = bad
    attrs = {"reduction": reduction}
    with pytest.raises(IndexError, match="out of range"):
        run_kernel(LOSS, [scores, labels], [(F, (40,) if reduction == "none" else ()), (F, (40, 4))], attrs)
    dy = np.ones(40, F) if reduction == "none" else np.array(1.0, F)
    with pytest.raises(IndexError, match="out of range"):
        run_kernel(GRAD, [dy, _log_probs(rng, (40, 4)), labels], [(F, (40, 4))], attrs, MS)
    with pytest.raises(IndexError, match="out of range"):
        run_kernel("SoftmaxCrossEntropyLossInternal", [scores, labels, None, np.array(-1, I64)],
                   [(F, (40,) if reduction == "none" else ()), (F, (40, 4))], attrs, MS)
    assert loops["loss"] >= 2 and loops["grad"] >= 1


@pytest.mark.parametrize("shape", [(256, 37), (6, 7, 40)], ids=str)
def test_the_rows_cut_across_threads_give_the_one_thread_bits(shape, loops, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    rng = np.random.default_rng(11)
    n, c, rest = shape[0], shape[1], shape[2:]
    scores, labels = rng.uniform(-6, 6, shape).astype(F), _labels(rng, (n, *rest), c, -1)
    weight = rng.uniform(0.1, 2, c).astype(F)
    results, before, splits = [], threads.current().threads, parallel.splits
    try:
        for count in (1, 2):
            threads.use_threads(count)
            fwd = run_kernel(LOSS, [scores, labels, weight], [(F, ()), (F, shape)], {"reduction": "mean"})
            grad = run_kernel(GRAD, [np.array(0.3, F), fwd[1], labels, weight], [(F, shape)], {"reduction": "mean"}, MS)
            results.append(fwd + grad)
    finally:
        threads.use_threads(before)
    assert parallel.splits >= splits + 2  # the loss's log-softmax and the gradient each cut at 2 threads
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_the_split_passes_row_chunks_are_the_whole_nodes_rows(reduction, loops, monkeypatch):
    """onnxplan.SoftmaxCrossEntropyLoss(Grad)Rows on rows [start, stop) with the whole labels (and
    dY): the chunk's log_prob and dlogits the whole node's rows bit for bit, the shares summing to
    the loss (none: the whole's rows of it)."""
    monkeypatch.setattr(parallel, "MIN_ELEMS", 1 << 30)  # one call a node
    rng = np.random.default_rng(13)
    scores, labels, weight = rng.uniform(-5, 5, (12, 9)).astype(F), _labels(rng, 12, 9, -100), rng.uniform(0.5, 2, 9)
    attrs = {"reduction": reduction, "ignore_index": -100}
    ins, per_sample = [scores, labels, weight.astype(F)], reduction == "none"
    dy = rng.uniform(-2, 2, 12).astype(F) if per_sample else np.array(1.3, F)
    loss, log_prob = run_kernel(LOSS, ins, [(F, (12,) if per_sample else ()), (F, (12, 9))], attrs)
    dlogits = run_kernel(GRAD, [dy, log_prob, *ins[1:]], [(F, (12, 9))], attrs, MS)[0]
    total = 0.0
    for lo, hi in [(0, 5), (5, 12)]:
        chunk = {**attrs, "start": lo, "stop": hi}
        share, lp = run_kernel("SoftmaxCrossEntropyLossRows", [scores[lo:hi], *ins[1:]],
                               [(F, (hi - lo,) if per_sample else ()), (F, (hi - lo, 9))], chunk, "onnxplan")
        np.testing.assert_array_equal(lp, log_prob[lo:hi])
        rows = run_kernel("SoftmaxCrossEntropyLossGradRows", [dy, lp, *ins[1:]], [(F, (hi - lo, 9))], chunk,
                          "onnxplan")[0]
        np.testing.assert_array_equal(rows, dlogits[lo:hi])
        if per_sample:
            np.testing.assert_array_equal(share, loss[lo:hi])
        else:
            total += float(share)
    if not per_sample:
        np.testing.assert_allclose(total, float(loss), rtol=1e-6)
    assert loops["loss"] == 3 and loops["grad"] == 3


def test_the_plain_kernel_computes_the_bound_ones_bits(loops, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_ELEMS", 1 << 30)  # one call a node
    rng = np.random.default_rng(17)
    scores, labels = rng.uniform(-4, 4, (16, 6)).astype(F), _labels(rng, 16, 6, -1)
    got = {}
    for path in ("bound", "plain"):
        monkeypatch.setattr(kernel_harness, "KERNEL_PATH", path)
        fwd = run_kernel(LOSS, [scores, labels], [(F, ()), (F, (16, 6))], {})
        got[path] = fwd + run_kernel(GRAD, [np.array(1.0, F), fwd[1], labels], [(F, (16, 6))], {}, MS)
    for a, b in zip(got["bound"], got["plain"]):
        np.testing.assert_array_equal(a, b)
    assert loops["loss"] == 2 and loops["grad"] == 2


@pytest.mark.parametrize("case", ["float64", "int32-labels", "float64-weight", "strided-scores"])
def test_what_the_loops_do_not_take_stays_on_numpy(case, loops):
    rng = np.random.default_rng(19)
    scores, labels, weight = rng.uniform(-4, 4, (8, 5)).astype(F), _labels(rng, 8, 5), rng.uniform(0.5, 2, 5).astype(F)
    if case == "float64":
        scores = scores.astype(np.float64)
    elif case == "int32-labels":
        labels = labels.astype(np.int32)
    elif case == "float64-weight":
        weight = weight.astype(np.float64)
    else:
        scores = np.repeat(scores, 2, axis=1)[:, ::2]
    ins = [scores, labels, weight]
    node = make_node(LOSS, ins, [(scores.dtype, ()), (scores.dtype, scores.shape)], {"reduction": "mean"})
    want = ref_run(LOSS, ins, 2, {"reduction": "mean"}) if case != "float64-weight" else None
    got = run_kernel(LOSS, ins, [(scores.dtype, ()), (scores.dtype, scores.shape)], node=node)
    if want is not None:
        assert_close(got, want)
    assert loops["loss"] == 0


def test_no_native_kernels_means_no_loops():
    with settings.override(native_kernels=False):
        assert native.sce() is None
    assert native.sce() is not None


def test_the_loops_exp_is_within_an_ulp_of_exp():
    """The gradient of one row labelled at column 0 (sum, dY 1) is exp(log_prob) elsewhere: within
    one float32 ulp of exp correctly rounded over the float range the loops take, 0 below it
    (-87.34: no subnormals), NaN kept."""
    rng = np.random.default_rng(23)
    lp = np.concatenate([[0.0], rng.uniform(-87.33, 0.5, 200_000), rng.uniform(-0.35, 0.35, 50_000),
                         [0.0, -1e-30, -87.3, -0.34657359, 0.34657359, 1.0, 20.5]]).astype(F)[None]
    got = run_kernel(GRAD, [np.array(1.0, F), lp, np.array([0], I64)], [(F, lp.shape)], {"reduction": "sum"}, MS)[0]
    want = np.exp(lp.astype(np.float64)).astype(F)
    assert np.abs(got[0, 1:].view(np.int32) - want[0, 1:].view(np.int32)).max() <= 1
    edges = np.array([[0.0, -87.5, -100.0, -np.inf, np.nan, 88.0]], F)
    got = run_kernel(GRAD, [np.array(1.0, F), edges, np.array([0], I64)], [(F, edges.shape)], {"reduction": "sum"}, MS)[0]
    np.testing.assert_array_equal(got[0, 1:4], 0)
    assert np.isnan(got[0, 4]) and got[0, 5] == np.float32(np.exp(88.0))


@pytest.mark.parametrize("shape", [(4, 2011), (3, 50257), (2, 300, 11)], ids=str)
def test_the_log_softmax_is_close_to_float64(shape):
    """log_prob within a few float32 ulps of the magnitudes involved (the row's log-sum-exp) of the
    log-softmax in float64, wide rows included."""
    rng = np.random.default_rng(29)
    x = rng.uniform(-10, 10, shape).astype(F)
    labels = rng.integers(0, shape[1], (shape[0], *shape[2:])).astype(I64)
    lp = run_kernel(LOSS, [x, labels], [(F, ()), (F, shape)], {})[1]
    z = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    want = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(lp, want, rtol=0, atol=8 * np.finfo(F).eps * float(np.abs(want).max()))
