"""The kernels cut across the compute threads by ONNXPLAN_SPLIT_KERNELS (a convolution's chunk by
images, MaxPool with Indices by images, LayerNorm and its gradient by rows and columns, softmax and its gradient by rows, GELU,
its gradient and ReLU's by aligned ranges, ReLU by rows, BatchNorm and its gradient by channels,
SoftmaxCrossEntropyLossGrad by rows; a batched product by batches): bit for bit their one-thread result, at 1 and 2
threads, on sizes above the split threshold (lowered: pieces of 64 elements) and below it."""

from __future__ import annotations

import numpy as np
import pytest

from onnxplan import settings, threads
from onnxplan.kernels import gemm_calls, matmul, parallel, scratch
from tests.kernel_harness import MS, RNG, call_kernel, make_node

F = np.float32


def _case(name: str) -> tuple:
    """(op, domain, inputs, output shapes (None: omitted), attrs) of a named case."""
    r = lambda *shape: RNG.standard_normal(shape).astype(F)  # noqa: E731
    x, dy = r(6, 7, 40), r(6, 7, 40)
    mean, inv = r(6, 7, 1), (np.abs(r(6, 7, 1)) + 0.5).astype(F)
    image, w = r(4, 3, 34, 34), r(5, 3, 3, 3)
    conv = {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}
    odd = 64 * 41 + 13  # ranges cut at multiples of 64, a tail of 13
    relu_x = r(odd)
    relu_x[[5, 2000]] = np.nan, -0.0  # NaN stays NaN, -0 gives numpy's 0
    bn_x, positive = r(4, 6, 5, 7), (np.abs(r(6)) + 0.5).astype(F)
    big_x, big_pos, ln_x = r(2, 8, 40, 40), (np.abs(r(8)) + 0.5).astype(F), r(4, 64, 80)
    def log_probs(*shape):  # a log-softmax along axis 1
        z = r(*shape)
        return (z - np.log(np.exp(z).sum(axis=1, keepdims=True))).astype(F)

    cases = {
        "conv": ("Conv", "", [image, w, r(5)], [(4, 5, 34, 34)], conv),
        "conv_stride": ("Conv", "", [r(5, 3, 70, 66), w], [(5, 5, 35, 33)], {**conv, "strides": [2, 2]}),
        "conv_grad": ("ConvGrad", MS, [r(4, 5, 34, 34), image, w], [(4, 3, 34, 34), (5, 3, 3, 3), (5,)], conv),
        "conv_grad_dw": ("ConvGrad", MS, [r(5, 5, 35, 33), r(5, 3, 70, 66), w], [None, (5, 3, 3, 3), (5,)],
                         {**conv, "strides": [2, 2]}),
        "layer_norm": ("LayerNormalization", "", [x, r(40), r(40)], [(6, 7, 40), (6, 7, 1), (6, 7, 1)],
                       {"axis": -1}),
        "rms_norm": ("SimplifiedLayerNormalization", "", [x, r(40)], [(6, 7, 40), (6, 7, 1)], {"axis": -1}),
        "layer_norm_grad": ("LayerNormalizationGrad", MS, [dy, x, r(40), mean, inv], [(6, 7, 40), (40,), (40,)],
                            {"axis": -1}),
        "layer_norm_grad_no_dx": ("LayerNormalizationGrad", MS, [dy, x, r(40), mean, inv], [None, (40,), (40,)],
                                  {"axis": -1}),
        "rms_norm_grad": ("SimplifiedLayerNormalizationGrad", MS, [dy, x, r(40), inv], [(6, 7, 40), (40,)],
                          {"axis": -1}),
        "softmax": ("Softmax", "", [x], [(6, 7, 40)], {"axis": -1}),
        "log_softmax": ("LogSoftmax", "", [x], [(6, 7, 40)], {"axis": -1}),
        "softmax_grad": ("SoftmaxGrad_13", MS, [dy, r(6, 7, 40)], [(6, 7, 40)], {"axis": -1}),
        "gelu": ("Gelu", MS, [r(odd)], [(odd,)], {}),
        "fast_gelu": ("FastGelu", MS, [r(odd)], [(odd,)], {}),
        "gelu_grad": ("GeluGrad", MS, [r(odd), r(odd)], [(odd,)], {}),
        "fast_gelu_grad": ("FastGeluGrad", MS, [r(odd), r(odd)], [(odd,)], {}),
        "relu": ("Relu", "", [relu_x], [(odd,)], {}),
        "relu_grad": ("ReluGrad", MS, [r(odd), r(odd)], [(odd,)], {}),
        "silu": ("QuickGelu", MS, [r(odd)], [(odd,)], {"alpha": 1.0}),
        "silu_grad": ("QuickGeluGrad", MS, [r(odd), r(odd)], [(odd,)], {"alpha": 1.0}),
        "batch_norm": ("BatchNormInternal", MS, [bn_x, r(6), r(6), r(6), positive], [bn_x.shape] + [(6,)] * 4,
                       {"epsilon": 1e-5, "momentum": 0.9}),
        "batch_norm_grad": ("BatchNormalizationGrad", MS, [r(*bn_x.shape), bn_x, r(6), r(6), positive],
                            [bn_x.shape, (6,), (6,)], {}),
        # from norm.TORCH_ELEMS elements the tensor-sized passes are torch's, on the parts' strided views
        "batch_norm_torch": ("BatchNormInternal", MS, [big_x, r(8), r(8), r(8), big_pos], [big_x.shape] + [(8,)] * 4,
                             {"epsilon": 1e-5, "momentum": 0.9}),
        "batch_norm_grad_torch": ("BatchNormalizationGrad", MS, [r(*big_x.shape), big_x, r(8), r(8), big_pos],
                                  [big_x.shape, (8,), (8,)], {}),
        "layer_norm_torch": ("LayerNormalization", "", [ln_x, r(80), r(80)], [ln_x.shape, (4, 64, 1), (4, 64, 1)],
                             {"axis": -1}),
        "layer_norm_grad_torch": ("LayerNormalizationGrad", MS, [r(*ln_x.shape), ln_x, r(80), r(4, 64, 1),
                                                                 (np.abs(r(4, 64, 1)) + 0.5).astype(F)],
                                  [ln_x.shape, (80,), (80,)], {"axis": -1}),
        "sce_grad": ("SoftmaxCrossEntropyLossGrad", MS, [np.array(0.7, F), log_probs(6, 40),
                                                          np.array([3, 0, 39, 7, 7, 1], np.int64)],
                     [(6, 40)], {"reduction": "mean"}),
        "sce_grad_none_3d": ("SoftmaxCrossEntropyLossGrad", MS, [r(4, 7), log_probs(4, 10, 7),
                                                                  RNG.integers(-1, 10, (4, 7))],
                             [(4, 10, 7)], {"reduction": "none", "ignore_index": -1}),
        "batch_norm_grad_no_dx": ("BatchNormalizationGrad", MS, [r(*bn_x.shape), bn_x, r(6), r(6), positive],
                                  [None, (6,), (6,)], {}),
    }
    return cases[name]


CASES = ["conv", "conv_stride", "conv_grad", "conv_grad_dw", "layer_norm", "rms_norm", "layer_norm_grad",
         "layer_norm_grad_no_dx", "rms_norm_grad", "softmax", "log_softmax", "softmax_grad", "gelu", "fast_gelu",
         "gelu_grad", "fast_gelu_grad", "relu", "relu_grad", "silu", "silu_grad", "batch_norm", "batch_norm_grad", "batch_norm_grad_no_dx",
         "batch_norm_torch", "batch_norm_grad_torch", "layer_norm_torch", "layer_norm_grad_torch", "sce_grad",
         "sce_grad_none_3d"]


def _run(op: str, domain: str, inputs: list, outs: list, attrs: dict, n: int, split: bool) -> tuple[list, int]:
    """Our kernel at `n` threads, the split on or off: (outputs, most pieces of one parallel.run
    or of one GEMM-pool job: a fused loop's rows, gemm_calls.PooledCalls)."""
    most = [1]
    run, pool_run = parallel.run, gemm_calls.GemmPool.run

    def counting(tasks):
        most[0] = max(most[0], len(tasks))
        run(tasks)

    def counting_pool(self, table, workers, *args, **kwargs):
        most[0] = max(most[0], len(table))
        return pool_run(self, table, workers, *args, **kwargs)

    before = threads.current().threads
    node = make_node(op, inputs, [None if s is None else (F, s) for s in outs], attrs, domain)
    got = [None if s is None else np.full(s, np.nan, F) for s in outs]
    try:
        threads.use_threads(n)
        parallel.run = counting  # type: ignore[assignment]
        gemm_calls.GemmPool.run = counting_pool  # type: ignore[method-assign]
        with settings.override(split_kernels=split):
            call_kernel(node, [a.copy() for a in inputs], got)
    finally:
        parallel.run = run  # type: ignore[assignment]
        gemm_calls.GemmPool.run = pool_run  # type: ignore[method-assign]
        threads.use_threads(before)
    return got, most[0]


# A Conv of long maps (conv.DIRECT_LENGTH positions and more) runs one task an image
# (conv._direct_by_slots): 4 images, 4 tasks.
IMAGE_TASKS = {"conv": 4}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("small", [True, False], ids=["split", "whole"])
def test_a_split_kernel_is_bitwise_its_one_thread_result(name, n, small, monkeypatch):
    """At `n` threads with pieces from 64 elements (`split`: every case is cut at 2 threads) or at
    the real threshold (`whole`: these sizes are not cut), the outputs equal the kernel's on
    one thread with the split off, bit for bit."""
    op, domain, inputs, outs, attrs = _case(name)
    want, _ = _run(op, domain, inputs, outs, attrs, 1, split=False)
    if small:
        monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
        monkeypatch.setattr(gemm_calls, "POOLED_MIN_ELEMS", 64)  # the fused loops' rows on the GEMM pool
        # split_matmul's cuts by rows or columns may round otherwise than one BLAS call (kernels/
        # matmul.py; reports/threads.md, session 10): GEMMs stay whole here, the convolutions' own
        # cut by images (one BLAS call per image either way) is what is checked
        monkeypatch.setattr(matmul, "GEMM_MACS_PER_ELEM", 1 << 40)
        monkeypatch.setattr(matmul, "GEMM_MACS_PER_ELEM_SPLIT", 1 << 40)
        monkeypatch.setattr(matmul, "GEMM_MACS_PER_ELEM_BATCHES", 1 << 40)
        monkeypatch.setattr(matmul, "GEMM_MACS_PER_ELEM_NATIVE", 1 << 40)
    got, pieces = _run(op, domain, inputs, outs, attrs, n, split=True)
    assert pieces == (IMAGE_TASKS.get(name, 2) if small and n == 2 else 1)
    for a, b in zip(want, got):
        if a is not None:
            np.testing.assert_array_equal(a, b)


def test_split_off_runs_whole(monkeypatch):
    """ONNXPLAN_SPLIT_KERNELS=0: the same kernels at 2 threads with small pieces run in one piece
    (the switch the paired benchmark turns, benchmarks/kernel_threads.py)."""
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    for name in ("layer_norm_grad", "softmax", "gelu", "relu_grad"):
        op, domain, inputs, outs, attrs = _case(name)
        _, pieces = _run(op, domain, inputs, outs, attrs, 2, split=False)
        assert pieces == 1, name


@pytest.mark.parametrize("a_shape, b_shape, on, off, pool", [
    ((1024, 128), (128, 128), (2, False), (1, False), (2, False)),  # transformer b16's projections, 16.8 M
    ((16, 4, 64, 64), (16, 4, 64, 32), (2, True), (1, False), (2, True)),  # its attention products, 8.4 M
    ((64, 784), (784, 256), (1, False), (1, False), (2, False)),  # mlp b64's first layer, 12.8 M
    ((64, 256), (256, 128), (1, False), (1, False), (2, False)),  # its second, 2.1 M: on the pool only
    ((64, 128), (128, 128), (1, False), (1, False), (1, False)),  # 1 M: whole everywhere
])
def test_products_split_with_the_switch(a_shape, b_shape, on, off, pool):
    """At 2 threads with ONNXPLAN_SPLIT_KERNELS on, a product splits in two from MIN_ELEMS x
    GEMM_MACS_PER_ELEM_SPLIT multiply-adds a piece, or x GEMM_MACS_PER_ELEM_BATCHES by batches,
    on the GEMM pool from MIN_ELEMS x GEMM_MACS_PER_ELEM_NATIVE either way; with it off from
    MIN_ELEMS x GEMM_MACS_PER_ELEM (as before). (pieces, by batches)"""
    a, b = np.ones(a_shape, F), np.ones(b_shape, F)
    before = threads.current().threads
    try:
        threads.use_threads(2)
        for split, want in ((True, on), (False, off)):
            with settings.override(split_kernels=split):
                assert matmul._product_parts(a, b, np.empty(np.matmul(a, b).shape, F)) == want, split
        assert matmul._product_parts(a, b, np.empty(np.matmul(a, b).shape, F), native=True) == pool
    finally:
        threads.use_threads(before)


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "transposed"])
@pytest.mark.parametrize("gemm_pool", [True, False], ids=["gemm-pool", "python-pool"])
def test_a_batched_product_cut_by_batches_is_bitwise_whole(n, transposed, gemm_pool, monkeypatch):
    """Cut by its batch axis (attention's 4-D products, FusedMatMul's transposed operand a
    strided view), a batched product makes each batch's matrix in one BLAS call as the whole
    product does: bit for bit the same at 1 and 2 threads, with pieces forced, on the GEMM pool
    (one call per matrix) and on the Python pool (pieces of batches)."""
    a = RNG.standard_normal((8, 4, 24, 24)).astype(F)
    a = np.swapaxes(a, -1, -2) if transposed else a
    b = RNG.standard_normal((8, 4, 24, 16)).astype(F)
    want = np.matmul(a, b)
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    monkeypatch.setattr(matmul, "GEMM_MACS_PER_ELEM_BATCHES", 1)
    monkeypatch.setattr(matmul, "GEMM_MACS_PER_ELEM_NATIVE", 1)
    if not gemm_pool:
        monkeypatch.setattr(gemm_calls, "pool", lambda: None)
    elif gemm_calls.pool() is None:
        pytest.skip("no GEMM pool (no C compiler or no ILP64 OpenBLAS)")
    most, calls = [1], []
    run, pool_run = parallel.run, gemm_calls.GemmPool.run
    before = threads.current().threads

    def counting(tasks):
        most[0] = max(most[0], len(tasks))
        run(tasks)

    def pool_counting(self, table, workers, **kw):
        calls.append(len(table))
        return pool_run(self, table, workers, **kw)

    try:
        threads.use_threads(n)
        monkeypatch.setattr(parallel, "run", counting)
        monkeypatch.setattr(gemm_calls.GemmPool, "run", pool_counting)
        got = np.full(want.shape, np.nan, F)
        matmul.split_matmul(np, a, b, got)
    finally:
        threads.use_threads(before)
    if gemm_pool:
        assert calls == ([] if n == 1 else [8 * 4]) and most[0] == 1
    else:
        assert most[0] == n and calls == []
    np.testing.assert_array_equal(want, got)


def test_a_transformers_layer_norm_stays_whole():
    """LayerNormalization(Grad) of transformer b16's 16 x 64 x 128 is not cut at 2 threads (cut
    in two, it took longer than whole on an idle machine: kernels/norm.py, LN_PASSES); four
    times its rows are."""
    from onnxplan.kernels import norm

    before = threads.current().threads
    try:
        threads.use_threads(2)
        assert len(norm.row_parts(np, 16 * 64, 128)) == 1
        assert len(norm.row_parts(np, 4 * 16 * 64, 128)) == 2
    finally:
        threads.use_threads(before)


def _bn_grad_case(c: int) -> tuple:
    x = RNG.standard_normal((16, c, 5, 7)).astype(F)
    pos = (np.abs(RNG.standard_normal(c)) + 0.5).astype(F)
    ins = [RNG.standard_normal(x.shape).astype(F), x, RNG.standard_normal(c).astype(F),
           RNG.standard_normal(c).astype(F), pos]
    return ("BatchNormalizationGrad", MS, ins, [x.shape, (c,), (c,)], {})


@pytest.fixture
def bn_numpy_path():
    """BatchNorm's numpy path (the fused loops, kernels/batch_norm_loops.py, sum each channel
    alone: any cut gives their bits, tests/test_kernels_bn_loops.py)."""
    with settings.override(native_kernels=False):
        yield


@pytest.mark.parametrize("c", [3, 5, 17])
def test_batch_norm_parts_keep_two_channels(c, monkeypatch, bn_numpy_path):
    """A part of one channel would sum its dbias and dscale as one strided run (numpy: pairwise),
    not image by image as the whole kernel does; parts keep two channels or more: the same bits
    for odd channel counts (3 channels at 2 threads: one part)."""
    op, domain, inputs, outs, attrs = _bn_grad_case(c)
    want, _ = _run(op, domain, inputs, outs, attrs, 1, split=False)
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    got, pieces = _run(op, domain, inputs, outs, attrs, 2, split=True)
    assert pieces == (1 if c < 4 else 2)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_a_one_channel_part_changes_the_bits(monkeypatch, bn_numpy_path):
    """The check above can fail: with one-channel parts allowed, 3 channels cut [0:1], [1:3] differ."""
    from onnxplan.kernels import batch_norm

    op, domain, inputs, outs, attrs = _bn_grad_case(3)
    want, _ = _run(op, domain, inputs, outs, attrs, 1, split=False)
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    monkeypatch.setattr(batch_norm, "BN_PART_MIN", 1)
    got, pieces = _run(op, domain, inputs, outs, attrs, 2, split=True)
    assert pieces == 2
    assert not all(np.array_equal(a, b) for a, b in zip(want, got))


@pytest.mark.parametrize("m", [3, 5])
def test_layer_norm_grad_column_parts_keep_two_columns(m, monkeypatch):
    """LayerNormGrad's first pass by columns: a one-column part would sum its rows pairwise."""
    x, dy = RNG.standard_normal((64, m)).astype(F), RNG.standard_normal((64, m)).astype(F)
    mean, inv = RNG.standard_normal((64, 1)).astype(F), (np.abs(RNG.standard_normal((64, 1))) + 0.5).astype(F)
    case = ("LayerNormalizationGrad", MS, [dy, x, RNG.standard_normal(m).astype(F), mean, inv],
            [(64, m), (m,), (m,)], {"axis": -1})
    want, _ = _run(*case, 1, split=False)
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    got, _ = _run(*case, 2, split=True)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_conv_by_image_slots_is_bitwise_its_one_thread_result(n, monkeypatch):
    """A long-map Conv whose scratch holds 2 images (forced) over 7 images: at 2 and 3 threads one
    task an image through the 2 image slots (3 threads: one waits for a slot), at 1 thread the
    chunks of 2; the outputs equal one thread's, bit for bit."""
    from dataclasses import replace

    from onnxplan.kernels import conv, im2col

    real = conv.layout
    monkeypatch.setattr(conv, "layout", lambda *a, **k: replace(real(*a, **k), nb=2))
    slots = []
    then = im2col.im2col_slots_then
    monkeypatch.setattr(conv, "im2col_slots_then",
                        lambda xp, win, x, col, *a: slots.append(col.shape[3]) or then(xp, win, x, col, *a))
    r = lambda *shape: RNG.standard_normal(shape).astype(F)  # noqa: E731
    inputs, outs, attrs = [r(7, 3, 34, 34), r(5, 3, 3, 3), r(5)], [(7, 5, 34, 34)], {"pads": [1, 1, 1, 1]}
    want, _ = _run("Conv", "", inputs, outs, attrs, 1, split=True)
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    slots.clear()
    got, pieces = _run("Conv", "", inputs, outs, attrs, n, split=True)
    assert slots == [2] and pieces == (7 if n > 1 else 1)
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("n", [1, 2])
def test_max_pool_with_indices_split_by_images_is_bitwise_whole(n, monkeypatch):
    """MaxPool with Indices (a training graph's) cut by images across the threads, each part through
    its block of the chunk's mask scratch (chunks of 2 images here): values and indices equal the
    one-thread run's, ties and padding included."""
    x = np.round(RNG.standard_normal((5, 3, 13, 12)) * 2).astype(F)  # rounded: ties between taps
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    shape = (5, 3, 7, 6)

    def pool(threads_: int) -> tuple[list, int]:
        most = [1]
        run = parallel.run

        def counting(tasks):
            most[0] = max(most[0], len(tasks))
            run(tasks)

        node = make_node("MaxPool", [x], [(F, shape), (np.int64, shape)], attrs)
        got = [np.full(shape, np.nan, F), np.full(shape, -7, np.int64)]
        before = threads.current().threads
        try:
            threads.use_threads(threads_)
            parallel.run = counting  # type: ignore[assignment]
            call_kernel(node, [x], got)
        finally:
            parallel.run = run  # type: ignore[assignment]
            threads.use_threads(before)
        return got, most[0]

    monkeypatch.setattr(scratch, "SCRATCH_TARGET", 2 * 3 * 7 * 6)  # the mask of 2 images a chunk
    want, _ = pool(1)
    monkeypatch.setattr(parallel, "MIN_ELEMS", 64)
    got, pieces = pool(n)
    assert pieces == n
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
