"""Kernels that sort or normalise across an axis keep their own temporaries block-sized: a call
on an 8 MiB tensor allocates far less than the tensor (numpy reports its buffers to tracemalloc)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from onnxplan.ir.graph import Node
from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.indexing import top_k
from onnxplan.kernels.norm import lrn, mean_variance_normalization
from onnxplan.kernels.registry import KernelContext

LIMIT = 1 << 20  # bytes a call may allocate beside its outputs (the tensors are 8 MiB)


def _peak(fn, node, inputs, outputs) -> int:
    ctx = KernelContext(np, node, [TensorSpec(str(x.dtype), x.shape) for x in inputs],
                        [TensorSpec(str(y.dtype), y.shape) for y in outputs])
    tracemalloc.start()
    try:
        fn(ctx, inputs, outputs)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


CASES = {
    "TopK": (top_k, {"axis": 1, "largest": 1}, (64, 32768), lambda x: [np.empty((64, 5), np.float32),
                                                                        np.empty((64, 5), np.int64)]),
    "LRN": (lrn, {"size": 5}, (8, 64, 64, 64), lambda x: [np.empty_like(x)]),
    "MeanVarianceNormalization": (mean_variance_normalization, {}, (8, 64, 64, 64), lambda x: [np.empty_like(x)]),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_no_tensor_sized_temporary(op):
    fn, attrs, shape, outs = CASES[op]
    rng = np.random.default_rng(17)
    x = rng.standard_normal(shape, dtype=np.float32)
    node = Node(op, op, "", ["x"], ["y", "i"][: len(outs(x))], dict(attrs))
    outputs = outs(x)
    if op == "TopK":
        node.inputs.append("k")
        k = np.array([5], np.int64)
        peak = _peak(fn, node, [x, k], outputs)
        order = np.argsort(-x.astype(np.float64), axis=1, kind="stable")[:, :5]  # the reference
        assert np.array_equal(outputs[1], order) and np.array_equal(outputs[0], np.take_along_axis(x, order, 1))
    else:
        peak = _peak(fn, node, [x], outputs)
    assert peak < LIMIT, f"{op} allocated {peak} bytes on a {x.nbytes}-byte input"
