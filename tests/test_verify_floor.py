"""The rounding floor of a gradient-producing reduction (onnxplan.verification.step_check.
reduction_floor): it bounds what float32 rounding leaves in a sum that cancels to ~0, against the
same sum in float64, and stays far below the gradient tolerance where nothing cancels."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from onnxplan.verification.step_check import TOLERANCES, reduction_floor


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
