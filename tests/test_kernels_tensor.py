"""Tensor-shape, gather and reduction kernels against the ONNX reference evaluator and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxplan.ir.graph import Node
from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.registry import KernelContext, find_kernel, may_overwrite
from onnxplan.kernels.tensor_ops import slice_indices
from tests.kernel_harness import (
    MS,
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


def ints(*values):
    return np.array(values, dtype=I64)


# ---- views and copies ------------------------------------------------------------------------------
@pytest.mark.parametrize("op,extra,attrs", [
    ("Identity", [], {}),
    ("Reshape", [ints(4, -1)], {}),
    ("Flatten", [], {"axis": 2}),
    ("Squeeze", [ints(1)], {}),
    ("Unsqueeze", [ints(0, 3)], {}),
])
def test_view_ops(op, extra, attrs):
    x = rand(2, 1, 3, 4)
    want = ref_run(op, [x, *extra], 1, attrs)
    assert_close(run_kernel(op, [x, *extra], want, attrs), want)
    # the executor may bind the output to the input's memory: then the kernel is a no-op
    x2 = x.copy()
    out = x2.reshape(want[0].shape)
    node = make_node(op, [x2, *extra], 1, attrs)
    find_kernel(node).fn(KernelContext(np, node, [], []), [x2, *extra], [out])
    np.testing.assert_array_equal(out, want[0])


@pytest.mark.parametrize("to,src", [
    (TensorProto.INT64, np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 3.0], F)),
    (TensorProto.BOOL, np.array([-2.0, 0.0, 0.5, np.inf], F)),
    (TensorProto.FLOAT, np.array([-3, 0, 7], I64)),
    (TensorProto.FLOAT16, rand(3, 4)),
    (TensorProto.INT32, np.array([True, False])),
])
def test_cast(to, src):
    check("Cast", [src], {"to": to})


def test_transpose_expand():
    check("Transpose", [rand(2, 3, 4, 5)], {"perm": [0, 2, 3, 1]})
    check("Transpose", [rand(2, 3, 4)])
    check("Expand", [rand(3, 1), ints(2, 3, 4)])
    check("Expand", [rand(4), ints(2, 1, 1)])


def test_concat_and_concat_training():
    xs = [rand(2, 3, 4), rand(2, 1, 4), rand(2, 5, 4)]
    check("Concat", xs, {"axis": 1})
    check("Concat", [rand(2, 3), rand(2, 2)], {"axis": -1})
    check("ConcatTraining", xs, {"axis": 1}, n_out=2, domain=MS)
    check("ConcatTraining", xs, {"axis": -2}, n_out=1, domain=MS)


def test_split_and_split_training():
    x = rand(3, 10, 2)
    check("Split", [x, ints(3, 7)], {"axis": 1}, n_out=2)
    check("Split", [x], {"axis": 1}, n_out=5)
    check("Split", [x], {"axis": 0}, n_out=3)
    check("SplitTraining", [x, ints(2, 2, 6)], {"axis": -2}, n_out=3, domain=MS)


SLICES = [
    (ints(1), ints(3), None, None),
    (ints(0, 1), ints(-1, 1000), ints(0, 2), None),
    (ints(-1), ints(-1000), ints(1), ints(-1)),  # backwards through index 0
    (ints(5, -2), ints(0, 1), ints(2, 0), ints(-2, -1)),
    (ints(-100), ints(100), ints(-1), ints(3)),
    (ints(2), ints(2), None, None),  # empty
    (ints(np.iinfo(I64).max), ints(np.iinfo(I64).min), ints(1), ints(-1)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    x = rand(4, 5, 6)
    inputs = [x, starts, ends] + ([axes] if axes is not None else []) + ([steps] if steps is not None else [])
    check("Slice", inputs)


def test_slice_indices_clamp():
    assert slice_indices((5,), [-1], [-6], [0], [-1]) == (slice(4, None, -1),)
    assert slice_indices((5,), [7], [-7], [0], [-1]) == (slice(4, None, -1),)
    assert slice_indices((5,), [-7], [7], [0], [2]) == (slice(0, 5, 2),)


# ---- gather ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis,indices", [
    (0, ints(0, 3, -1, 3)),
    (1, np.array([[0, -2], [1, 1]], np.int32)),
    (-1, np.array(2, I64)),
    (2, ints()),
])
def test_gather(axis, indices):
    check("Gather", [rand(4, 3, 5), indices], {"axis": axis})


def test_gather_rejects_out_of_range():
    with pytest.raises(IndexError):
        run_kernel("Gather", [rand(4, 3), ints(0, 4)], [(F, (2, 3))], {"axis": 0})
    with pytest.raises(IndexError):
        run_kernel("Gather", [rand(4, 3), ints(-5)], [(F, (1, 3))], {"axis": 0})


@pytest.mark.parametrize("shape,axis,indices", [
    ((6, 4), 0, ints(0, 5, 5, -1, 2, 0)),  # repeated indices accumulate
    ((3, 5, 2), 1, np.array([[4, 0], [-1, 4]], np.int32)),
    ((3, 5), -1, np.array(2, I64)),
])
def test_gather_grad(shape, axis, indices):
    ax = axis % len(shape)
    dy_shape = shape[:ax] + indices.shape + shape[ax + 1:]
    check("GatherGrad", [np.array(shape, I64), indices, rand(*dy_shape)], {"axis": axis}, domain=MS)


@pytest.mark.parametrize("rows,width,entries,repeat", [
    (1000, 128, 1024, 0),  # a transformer's embedding gradient: a few entries a row
    (50, 128, 1024, 0),  # ~20 entries a row: many rounds
    (1000, 16, 300, 150),  # a row repeated 150 times (a padding token): the rest goes to add.at
    (3, 20, 5000, 0),  # rounds of fewer rows than SCATTER_ROUND_MIN from the start
    (40, 131, 700, 0),  # rows of eight-float lanes and a tail (the C loop)
])
@pytest.mark.parametrize("loop", [True, False], ids=["c-loop", "numpy"])
def test_scatter_add_rows_is_add_at_bitwise(rows, width, entries, repeat, loop, monkeypatch):
    """GatherGrad's row scatter (the fused C loop of kernels/native.py where compiled, else
    kernels/_xp._scatter_add_rows, in rounds) adds every row's entries in the order numpy's add.at
    does: the same bits, zeros' signs included. The values span many magnitudes, so another
    order of the additions changes bits (checked: a sorted add.reduceat differs)."""
    from onnxplan.kernels import _xp, native

    calls = []
    if loop:
        real = native.scatter_add_rows()
        if real is None:
            pytest.skip("no C compiler: the numpy path only")
        monkeypatch.setattr(native, "scatter_add_rows", lambda: lambda *a: calls.append(1) or real(*a))
    else:
        monkeypatch.setattr(native, "scatter_add_rows", lambda: None)
    rng = np.random.default_rng(rows + entries)
    index = rng.integers(0, rows, entries)
    index[:repeat] = 1
    values = (rng.standard_normal((entries, width)) * np.exp(3 * rng.standard_normal((entries, width)))).astype(F)
    values[::7, ::5] = -0.0
    want = np.zeros((rows, width), F)
    np.add.at(want, index, values)
    got = np.zeros((1, rows, width), F)
    _xp.scatter_add(np, got, index, values[None])
    np.testing.assert_array_equal(want.view(np.int32), got[0].view(np.int32))
    assert calls == ([1] if loop else [])
    order = np.argsort(index, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(index[order]) != 0])
    other = np.zeros((rows, width), F)
    other[index[order][starts]] = np.add.reduceat(values[order], starts, axis=0)
    assert not np.array_equal(want, other)


# ---- shape-valued ops --------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"start": -2, "end": -1}, {"end": 10}, {"start": 3, "end": 1}])
def test_shape(attrs):
    check("Shape", [rand(2, 3, 4)], attrs)


def test_size_and_constant_of_shape():
    check("Size", [rand(2, 3, 4)])
    check("Size", [np.array(1.0, F)])
    check("ConstantOfShape", [ints(2, 3)])
    check("ConstantOfShape", [ints(2, 3)], {"value": helper.make_tensor("value", TensorProto.INT64, [1], [7])})
    node = Node("c", "ConstantOfShape", "", ["s"], ["y"], {"value": np.array([2.5], F)})  # as the loader gives it
    out = run_kernel("ConstantOfShape", [ints(3)], [(F, (3,))], node=node)
    np.testing.assert_array_equal(out[0], np.full(3, 2.5, F))


# ---- reductions ------------------------------------------------------------------------------------
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [ints(1), ints(0, 2), ints(-1), ints(), None])
def test_reduce_sum(axes, keepdims):
    x = rand(3, 4, 5)
    inputs = [x] if axes is None else [x, axes]
    check("ReduceSum", inputs, {"keepdims": keepdims})
    # ORT 1.19 fails ReduceSum with no axes input and noop_with_empty_axes=1 (the spec: identity)
    check("ReduceSum", inputs, {"keepdims": keepdims, "noop_with_empty_axes": 1},
          against=("reference",) if axes is None else ("reference", "ort"))
    if axes is not None:  # ReduceSumTraining requires the axes input
        check("ReduceSumTraining", inputs, {"keepdims": keepdims, "noop_with_empty_axes": 1}, domain=MS)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("attrs", [{"axes": [1], "keepdims": 0}, {"axes": [0, -1]}, {"keepdims": 0}, {}])
def test_reduce_axes_attribute(op, attrs):
    check(op, [rand(3, 4, 5, lo=0.5, hi=1.5)], attrs)


def test_reduce_mean_large_axis():
    check("ReduceMean", [rand(2, 20000)], {"axes": [1], "keepdims": 1}, rtol=1e-5, atol=1e-6)


# ---- declarations and memory -----------------------------------------------------------------------
def test_no_in_place_claims_for_data_movement():
    for op in ("Transpose", "Concat", "Gather", "Slice", "Expand", "Cast", "ReduceSum"):
        assert may_overwrite(Node("n", op, "", ["a"], ["y"])) == {}, op
    assert may_overwrite(Node("n", "GatherGrad", MS, ["a"], ["y"])) == {}


BIG = (1024, 1024)


@pytest.mark.parametrize("op,domain,inputs,out_shape,attrs", [
    ("Transpose", "", lambda: [rand(*BIG)], BIG, {}),
    ("Concat", "", lambda: [rand(512, 1024), rand(512, 1024)], BIG, {"axis": 0}),
    ("Slice", "", lambda: [rand(*BIG), ints(1), ints(-1), ints(1)], (1024, 1022), {}),
    ("Gather", "", lambda: [rand(*BIG), np.arange(1024)[::-1].copy()], BIG, {"axis": 0}),
    ("GatherGrad", MS, lambda: [np.array(BIG, I64), np.arange(1024) % 7, rand(*BIG)], BIG, {"axis": 0}),
    ("ReduceSum", "", lambda: [rand(*BIG), ints(0)], (1024,), {"keepdims": 0}),
    ("ReduceMean", "", lambda: [rand(*BIG)], (1, 1024), {"axes": [0]}),
    ("Expand", "", lambda: [rand(1024), ints(1024, 1024)], BIG, {}),
    ("Cast", "", lambda: [rand(*BIG)], BIG, {"to": TensorProto.FLOAT}),
])
def test_no_tensor_sized_allocation(op, domain, inputs, out_shape, attrs):
    xs = inputs()
    node = make_node(op, xs, 1, attrs, domain)
    outputs = [np.empty(out_shape, F)]
    ctx = KernelContext(np, node, [TensorSpec(x.dtype, x.shape) for x in xs], [TensorSpec(F, out_shape)])
    fn = find_kernel(node).fn
    fn(ctx, xs, outputs)
    assert peak_bytes(lambda: fn(ctx, xs, outputs)) < 4 * 1024 * 1024 // 8
    if op in ("Transpose", "Slice", "Gather", "Concat"):
        assert_close(outputs, ref_run(op, xs, 1, attrs))
    if op == "GatherGrad":  # ~150 float32 additions per row, in another order than ORT's
        assert_close(outputs, ort_run(op, xs, 1, attrs, MS), atol=1e-4)
