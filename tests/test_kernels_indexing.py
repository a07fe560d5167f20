"""Pad, Tile, Trilu, Range, SliceGrad and the index kernels (GatherElements, GatherND, ScatterElements,
ScatterND, OneHot, TopK and ORT's gradients) against the ONNX reference evaluator and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernel_harness import MS, RNG, F, assert_close, check, ort_run, rand, run_kernel

I64 = np.int64


def ints(*values):
    return np.array(values, dtype=I64)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [(1, 0, 2, 3), (0, 2, 1, 1), (-1, 1, 2, -2), (2, 3, 2, 3)])
def test_pad(mode, pads):
    x = rand(4, 5)
    if mode == "reflect" and max(pads) >= 4:
        pads = tuple(min(p, 3) for p in pads)
    against = ("ort",) if min(pads) < 0 else ("reference", "ort")  # the reference cannot crop
    check("Pad", [x, ints(*pads)], {"mode": mode}, against=against)
    if mode == "constant":
        check("Pad", [x, ints(*pads), np.array(1.5, F)], {"mode": mode}, against=against)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_4d_and_axes(mode):
    check("Pad", [rand(2, 3, 4, 5), ints(0, 0, 1, 2, 0, 0, 2, 1)], {"mode": mode})
    # opset 18 adds the axes input: ORT and the reference at opset 17 do not take it, so the
    # equivalent full pads give the expected values
    (want,) = ort_run("Pad", [np.ones((2, 3, 4, 5), F), ints(0, 2, 0, 1, 0, 0, 0, 0)], 1, {"mode": mode})
    got = run_kernel("Pad", [np.ones((2, 3, 4, 5), F), ints(1, 2, 0, 0), None, ints(-1, 1)], [want],
                     {"mode": mode})
    assert_close(got, [want])


def test_tile_trilu_range():
    check("Tile", [rand(2, 3, 4), ints(2, 1, 3)])
    check("Tile", [np.arange(6, dtype=I64).reshape(2, 3), ints(1, 4)])
    for upper in (0, 1):
        for k in (-2, 0, 1, 5):
            check("Trilu", [rand(2, 4, 6), ints(k)], {"upper": upper}, aliases=[(0, 0)])
        check("Trilu", [rand(5, 3)], {"upper": upper})
    check("Range", [np.array(2, I64), np.array(17, I64), np.array(4, I64)])
    check("Range", [np.array(1.5, F), np.array(-3.0, F), np.array(-0.7, F)])
    check("Range", [np.array(0, np.int32), np.array(5, np.int32), np.array(1, np.int32)])


def test_trilu_in_the_microsoft_domain():
    check("Trilu", [rand(3, 5, 5), ints(1)], {"upper": 0}, domain=MS)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_and_scatter_elements(axis):
    data = rand(4, 5, 6)
    shape = list(data.shape)
    shape[axis] = 3
    idx = RNG.integers(-data.shape[axis], data.shape[axis], size=shape).astype(I64)
    both = ("ort",) if axis < 0 else ("reference", "ort")  # the reference mishandles a negative axis
    check("GatherElements", [data, idx], {"axis": axis}, against=both)
    small = idx[:, :4] if axis != 1 else idx[:3]  # indices shorter than data on another axis
    check("GatherElements", [data, small], {"axis": axis}, against=("ort",))  # the reference refuses it
    # unique targets per line for the plain scatter (duplicates have no defined order)
    perm = np.argsort(RNG.random(data.shape), axis=axis)
    uniq = np.take(perm, np.arange(3), axis=axis).astype(I64)
    updates = rand(*uniq.shape)
    check("ScatterElements", [data, uniq, updates], {"axis": axis}, aliases=[(0, 0)], against=both)
    for reduction in ("add", "mul"):
        check("ScatterElements", [data, idx, rand(*idx.shape)], {"axis": axis, "reduction": reduction},
              against=both)


def test_gather_elements_grad():
    dy = rand(4, 3, 6)
    idx = RNG.integers(-5, 5, size=(4, 3, 6)).astype(I64)
    check("GatherElementsGrad", [dy, ints(4, 5, 6), idx], {"axis": 1}, domain=MS)
    check("GatherElementsGrad", [dy, ints(4, 7, 6), idx], {"axis": -2}, domain=MS)


@pytest.mark.parametrize("batch_dims,idx", [
    (0, np.array([[0, 1], [2, 0], [1, 3]], I64)),
    (0, np.array([[[1], [0]], [[2], [-1]]], I64)),
    (1, np.array([[1], [0], [2]], I64)),
    (1, np.array([[[0, 1], [2, 2]], [[1, 0], [0, 3]], [[2, 1], [1, 1]]], I64)),
])
def test_gather_nd_and_grad(batch_dims, idx):
    data = rand(3, 4, 5) if batch_dims == 0 else rand(3, 3, 4, 5)
    attrs = {"batch_dims": batch_dims}
    check("GatherND", [data, idx], attrs)
    (y,) = ort_run("GatherND", [data, idx], 1, attrs)
    check("GatherNDGrad", [ints(*data.shape), idx, rand(*y.shape)], attrs, domain=MS)


def test_scatter_nd():
    data = rand(4, 5, 3)
    check("ScatterND", [data, np.array([[1], [3]], I64), rand(2, 5, 3)], aliases=[(0, 0)])
    check("ScatterND", [data, np.array([[0, 1], [2, -1], [3, 0]], I64), rand(3, 3)])
    check("ScatterND", [data, np.array([[0, 1], [0, 1]], I64), rand(2, 3)], {"reduction": "add"})
    check("ScatterND", [data, np.array([[1, 2, 0]], I64), rand(1)], {"reduction": "mul"})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    idx = np.array([[0, 3, -1], [4, 2, 7]], I64)
    check("OneHot", [idx, np.array(5, I64), np.array([0.5, 2.0], F)], {"axis": axis})
    check("OneHot", [idx.astype(F), np.array(6.0, F), np.array([0, 1], F)], {"axis": axis})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_top_k(largest, axis):
    x = RNG.integers(0, 5, size=(4, 7)).astype(F)  # ties: the lower index comes first
    check("TopK", [x, ints(3)], {"axis": axis, "largest": largest, "sorted": 1}, n_out=2)


def test_slice_grad():
    dy = rand(2, 3)
    check("SliceGrad", [dy, ints(2, 9), ints(1), ints(9), ints(1), ints(3)], domain=MS)
    check("SliceGrad", [rand(3, 2), ints(5, 4), ints(-1, 0), ints(-6, 4), ints(0, 1), ints(-2, 2)], domain=MS)


def test_shrunken_gather_zero_gradient_in_place_accumulator():
    check("ShrunkenGather", [rand(5, 3), ints(4, 0, -1)], domain=MS)
    check("ZeroGradient", [rand(4, 3), rand(4, 3)], domain=MS, aliases=[(0, 0)])
    for flag in (True, False):
        check("InPlaceAccumulator", [rand(4, 3), rand(4, 3), np.array([flag])], domain=MS,
              aliases=[(0, 0), (0, 1)])
    check("InPlaceAccumulator", [rand(4, 3), rand(4, 3)], domain=MS)


@pytest.mark.parametrize("op", ["NonZero", "Unique", "Compress"])
def test_data_dependent_ops_are_refused_at_plan_time(op):
    from onnxplan.ir.graph import Node
    from onnxplan.ir.shape_rules import ShapeInferenceError
    from onnxplan.ir.shapes import infer_shapes
    from onnxplan.ir.tensor import TensorSpec

    node = Node("nz", op, "", ["x"] + (["c"] if op == "Compress" else []), ["y"], {})
    known = {"x": TensorSpec("float32", (3, 4)), "c": TensorSpec("bool", (3,))}
    with pytest.raises(ShapeInferenceError, match=f"{op}'s output shape depends on the input values"):
        infer_shapes([node], known, {}, {"": 17})
