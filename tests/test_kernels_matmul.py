"""Matrix-product kernels against the ONNX reference evaluator and ONNX Runtime."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.kernel_harness import MS, arena_run, ort_run, peak_bytes, randn, ref_run, run_kernel

# ---- Gemm ---------------------------------------------------------------------------------

@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([0, 1], [0, 1])))
@pytest.mark.parametrize("c_shape", [None, (), (7,), (1, 7), (5, 1), (5, 7)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (1.5, 0.0)])
def test_gemm_matches_reference(trans_a, trans_b, c_shape, alpha, beta):
    rng = np.random.default_rng(0)
    a = randn(rng, *((3, 5) if trans_a else (5, 3)))
    b = randn(rng, *((7, 3) if trans_b else (3, 7)))
    inputs = [a, b] + ([] if c_shape is None else [randn(rng, *c_shape)])
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta}
    (expected,) = ref_run("Gemm", inputs, [("float32", (5, 7))], attrs)
    (got,) = run_kernel("Gemm", inputs, [("float32", (5, 7))], attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_gemm_scales_a_large_c_in_declared_scratch():
    rng = np.random.default_rng(1)
    a, b, c = randn(rng, 200, 30), randn(rng, 30, 100), randn(rng, 200, 100)
    attrs = {"alpha": 1.0, "beta": 0.25}
    (expected,) = ort_run("Gemm", [a, b, c], [("float32", (200, 100))], attrs)
    (got,) = run_kernel("Gemm", [a, b, c], [("float32", (200, 100))], attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# ---- MatMul -------------------------------------------------------------------------------

@pytest.mark.parametrize("a_shape,b_shape", [
    ((4, 5), (5, 6)), ((5,), (5, 6)), ((4, 5), (5,)), ((5,), (5,)),
    ((2, 3, 4, 5), (5, 6)),  # folded into one 2-D product
    ((3, 4, 5), (3, 5, 6)), ((1, 3, 4, 5), (2, 1, 5, 6)), ((4, 5), (2, 5, 6)), ((2, 4, 5), (5,)),
])
def test_matmul_matches_reference(a_shape, b_shape):
    rng = np.random.default_rng(2)
    a, b = randn(rng, *a_shape), randn(rng, *b_shape)
    out_shape = np.matmul(a, b).shape
    (expected,) = ref_run("MatMul", [a, b], [("float32", out_shape)])
    (got,) = run_kernel("MatMul", [a, b], [("float32", out_shape)])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_matmul_matches_ort_on_transformer_shapes():
    rng = np.random.default_rng(3)
    for a_shape, b_shape in [((8, 16, 64), (64, 256)), ((8, 4, 16, 16), (8, 4, 16, 16))]:
        a, b = randn(rng, *a_shape), randn(rng, *b_shape)
        out_shape = np.matmul(a, b).shape
        (expected,) = ort_run("MatMul", [a, b], [("float32", out_shape)])
        (got,) = run_kernel("MatMul", [a, b], [("float32", out_shape)])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# ---- FusedMatMul / TransposeMatMul -------------------------------------------------------

def _raw_shape(effective, trans, trans_batch):
    """The stored shape of an operand whose FusedMatMul view is `effective`."""
    shape = list(effective)
    if trans:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    if trans_batch:
        shape = [shape[-2], *shape[:-2], shape[-1]]
    return shape


@pytest.mark.parametrize("flags", list(itertools.product([0, 1], repeat=4)))
def test_fused_matmul_matches_ort_for_every_transpose_flag(flags):
    trans_a, trans_b, batch_a, batch_b = flags
    rng = np.random.default_rng(4)
    a = randn(rng, *_raw_shape((2, 3, 4, 5), trans_a, batch_a))
    b = randn(rng, *_raw_shape((2, 3, 5, 6), trans_b, batch_b))
    attrs = {"alpha": 0.5, "transA": trans_a, "transB": trans_b, "transBatchA": batch_a, "transBatchB": batch_b}
    (expected,) = ort_run("FusedMatMul", [a, b], [("float32", (2, 3, 4, 6))], attrs, MS)
    (got,) = run_kernel("FusedMatMul", [a, b], [("float32", (2, 3, 4, 6))], attrs, MS)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["FusedMatMul", "TransposeMatMul"])
@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([0, 1], [0, 1])))
def test_fused_matmul_2d_and_broadcast_batch(op, trans_a, trans_b):
    rng = np.random.default_rng(5)
    a = randn(rng, *_raw_shape((3, 64, 32), trans_a, 0))
    b = randn(rng, *_raw_shape((32, 48), trans_b, 0))
    attrs = {"transA": trans_a, "transB": trans_b} | ({"alpha": 2.0} if op == "FusedMatMul" else {})
    (expected,) = ort_run(op, [a, b], [("float32", (3, 64, 48))], attrs, MS)
    (got,) = run_kernel(op, [a, b], [("float32", (3, 64, 48))], attrs, MS)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


# ---- no hidden copies ---------------------------------------------------------------------

@pytest.mark.parametrize("op,domain,a_shape,b_shape,attrs", [
    ("Gemm", "", (256, 512), (256, 512), {"transA": 1, "transB": 0}),
    ("Gemm", "", (512, 256), (384, 256), {"transA": 0, "transB": 1}),
    ("Gemm", "", (256, 512), (384, 256), {"transA": 1, "transB": 1}),
    ("FusedMatMul", MS, (4, 128, 256), (4, 128, 192), {"transA": 1}),
    ("FusedMatMul", MS, (512, 256), (512, 192), {"transA": 1}),
    ("MatMul", "", (8, 64, 256), (256, 192), {}),
])
def test_matmul_kernels_allocate_no_temporaries(op, domain, a_shape, b_shape, attrs):
    rng = np.random.default_rng(6)
    a, b = randn(rng, *a_shape), randn(rng, *b_shape)
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    a_eff = a.swapaxes(-1, -2) if ta else a
    b_eff = b.swapaxes(-1, -2) if tb else b
    out_shape = np.matmul(a_eff, b_eff).shape
    run, outputs = arena_run(op, [a, b], [("float32", out_shape)], attrs, domain)
    run()  # the process's first product looks up the GEMM pool (kernels/gemm_calls.py) once
    assert peak_bytes(run) < 16 * 1024  # the output is >= 256 KiB
    np.testing.assert_allclose(outputs[0], np.matmul(a_eff, b_eff), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]), ("i,i", [(5,), (5,)]), ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]), ("ij", [(3, 4)]), ("ji", [(3, 4)]),
])
def test_einsum(equation, shapes):
    from onnxplan.ir.shape_rules import find_rule
    from onnxplan.ir.tensor import TensorSpec
    from tests.kernel_harness import check, make_node, rand

    inputs = [rand(*s) for s in shapes]
    check("Einsum", inputs, {"equation": equation}, rtol=1e-5, atol=1e-5)
    node = make_node("Einsum", inputs, 1, {"equation": equation})
    (spec,) = find_rule("", "Einsum", 17)(node, [TensorSpec("float32", s) for s in shapes], {})
    assert spec.shape == np.einsum(equation, *inputs).shape
