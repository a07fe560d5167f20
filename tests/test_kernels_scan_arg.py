"""ArgMax/ArgMin, CumSum and the remaining Reduce* ops against the ONNX reference evaluator and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernel_harness import RNG, check, rand


def _ties(*shape):
    """Small integers as float32: many ties, so first versus last index matters."""
    return RNG.integers(0, 4, size=shape).astype(np.float32)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reduce(op, axis, keepdims, last):
    attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": last}
    check(op, [_ties(3, 5, 4)], attrs)
    check(op, [RNG.integers(-3, 3, size=(2, 7)).astype(np.int32)], {**attrs, "axis": min(axis, 1)})


def test_arg_reduce_in_slabs():
    """More than a block's worth: the kernel reduces slab by slab."""
    check("ArgMax", [_ties(40, 300, 3)], {"axis": 1, "select_last_index": 1})
    check("ArgMin", [_ties(3, 20000)], {"axis": 0, "keepdims": 0})


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cum_sum(exclusive, reverse, axis):
    attrs = {"exclusive": exclusive, "reverse": reverse}
    check("CumSum", [rand(3, 4, 5), np.array(axis, np.int64)], attrs)
    check("CumSum", [RNG.integers(0, 5, size=(4, 6)).astype(np.int64), np.array(min(axis, 1), np.int32)], attrs)


@pytest.mark.parametrize("op", ["ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"])
@pytest.mark.parametrize("attrs", [{"axes": [1]}, {"axes": [0, 2], "keepdims": 0}, {}, {"axes": [-1]}])
def test_other_reductions(op, attrs):
    x = rand(3, 4, 5, lo=0.1, hi=3) if op == "ReduceLogSum" else rand(3, 4, 5)
    check(op, [x], attrs, rtol=1e-5, atol=1e-5)


def test_other_reductions_in_slabs():
    check("ReduceLogSumExp", [rand(64, 300, lo=-50, hi=50)], {"axes": [1]}, rtol=1e-5, atol=1e-5)
    check("ReduceL2", [rand(64, 300)], {"axes": [1], "keepdims": 0}, rtol=1e-5, atol=1e-5)
