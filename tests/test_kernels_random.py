"""Random ops against ONNX Runtime and the ONNX reference evaluator: the deterministic cases
exactly (inference mode, ratio 0), the random ones through the keep-mask ONNX Runtime drew
(given to our kernel, y and dX must equal ORT's), the mask/scale relation, bit packing."""

from __future__ import annotations

import numpy as np
import pytest

import onnxplan.kernels.random as krandom
from onnxplan.ir.graph import Node
from onnxplan.ir.shapes import infer_shapes
from onnxplan.ir.tensor import TensorSpec
from tests.kernel_harness import MS, F, assert_close, ort_run, ref_run, run_kernel


@pytest.fixture
def given(monkeypatch):
    """Our kernels draw from a fresh Randomness whose `given` the test fills (node name "n")."""
    r = krandom.Randomness(7)
    monkeypatch.setattr(krandom, "_FALLBACK", r)
    return r


def _x(seed=0, shape=(3, 4, 5)):
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(F)


@pytest.mark.parametrize("ratio,mode", [(0.5, False), (0.0, True), (0.3, None)])
def test_dropout_deterministic_cases(ratio, mode):
    x = _x()
    inputs = [x, np.array(ratio, F)] + ([] if mode is None else [np.array(mode)])
    want = ref_run("Dropout", inputs, 2)
    ort_y, ort_mask = ort_run("Dropout", inputs, 2)
    y, mask = run_kernel("Dropout", inputs, [x, ("bool", x.shape)])
    np.testing.assert_array_equal(y, want[0])
    np.testing.assert_array_equal(y, ort_y)
    np.testing.assert_array_equal(mask, ort_mask)
    assert mask.all()


def test_dropout_training_with_ort_mask(given):
    x = _x(1, (64, 33))
    inputs = [x, np.array(0.3, F), np.array(True)]
    ort_y, ort_mask = ort_run("Dropout", inputs, 2)
    assert 0.5 < ort_mask.mean() < 0.9  # ORT really drew a mask
    np.testing.assert_allclose(ort_y, x * ort_mask / F(0.7), rtol=1e-6)  # the mask/scale relation
    given.given["n"] = ort_mask
    y, mask = run_kernel("Dropout", inputs, [x, ("bool", x.shape)])
    np.testing.assert_array_equal(mask, ort_mask)
    assert_close([y], [ort_y])


def test_dropout_seeded_draw_is_reproducible_and_has_the_ratio(given):
    x = np.ones((200, 100), F)
    inputs = [x, np.array(0.25, F), np.array(True)]
    y1, m1 = run_kernel("Dropout", inputs, [x, ("bool", x.shape)])
    given.reset()
    _, m2 = run_kernel("Dropout", inputs, [x, ("bool", x.shape)])
    np.testing.assert_array_equal(m1, m2)
    assert abs(m1.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y1, m1 / F(0.75), rtol=1e-7)


@pytest.mark.parametrize("mode", [True, False])
def test_dropout_grad_against_ort(mode):
    rng = np.random.default_rng(3)
    dy, mask = _x(4, (6, 7)), rng.random((6, 7)) > 0.4
    inputs = [dy, mask, np.array(0.4, F), np.array(mode)]
    want = ort_run("DropoutGrad", inputs, 1, domain=MS)
    got = run_kernel("DropoutGrad", inputs, [dy], domain=MS)
    assert_close(got, want)
    got_inplace = run_kernel("DropoutGrad", inputs, [dy], domain=MS, alias=(0, 0))
    assert_close(got_inplace, want)


def test_bitmask_packing_round_trip():
    keep = np.random.default_rng(5).random(77) > 0.5
    words = krandom.pack_bitmask(keep)
    assert words.dtype == np.uint32 and words.shape == (3,)
    np.testing.assert_array_equal(krandom.unpack_bitmask(np, words, 77), keep)
    assert int(words[0]) & 1 == int(keep[0]) and (int(words[1]) >> 3) & 1 == int(keep[35])


def test_bitmask_dropout_matches_dropout_with_the_same_mask(given):
    x = _x(6, (5, 13))
    keep = np.random.default_rng(8).random(x.shape) > 0.2
    inputs = [x, np.array(0.2, F), np.array(True)]
    given.given["n"] = keep
    y, _ = run_kernel("Dropout", inputs, [x, ("bool", x.shape)])
    given.given["n"] = krandom.pack_bitmask(keep)
    yb, words = run_kernel("BitmaskDropout", inputs, 2, domain=MS,
                           outputs=[np.full_like(x, np.nan), np.zeros(3, np.uint32)])
    np.testing.assert_array_equal(yb, y)
    np.testing.assert_array_equal(words, krandom.pack_bitmask(keep))
    dy = _x(9, x.shape)
    dx = run_kernel("DropoutGrad", [dy, keep, np.array(0.2, F), np.array(True)], [dy], domain=MS)
    dxb = run_kernel("BitmaskDropoutGrad", [dy, words, np.array(0.2, F), np.array(True)], [dy], domain=MS)
    np.testing.assert_array_equal(dxb[0], dx[0])


@pytest.mark.parametrize("op", ["RandomUniformLike", "RandomNormalLike"])
def test_random_like_rule_seed_and_given(op, given):
    x = np.zeros((4, 6), F)
    node = Node("n", op, "", ["x"], ["y"], {"dtype": 11})  # float64
    specs, _ = infer_shapes([node], {"x": TensorSpec("float32", (4, 6))}, {}, {"": 17})
    assert specs["y"] == TensorSpec("float64", (4, 6))
    (a,) = run_kernel(op, [x], [("float64", (4, 6))], {"dtype": 11})
    given.reset()
    (b,) = run_kernel(op, [x], [("float64", (4, 6))], {"dtype": 11})
    np.testing.assert_array_equal(a, b)
    if op == "RandomUniformLike":
        assert (a >= 0).all() and (a < 1).all()
    drawn = np.arange(24, dtype=np.float64).reshape(4, 6)
    given.given["n"] = drawn
    (c,) = run_kernel(op, [x], [("float64", (4, 6))], {"dtype": 11})
    np.testing.assert_array_equal(c, drawn)


def test_keep_threshold_is_orts_rule_on_32_bit_uniforms():
    """keep when u / 2**32 >= ratio, u a raw uint32: the threshold is ceil(ratio * 2**32)."""
    assert krandom._keep_threshold(0.0) == 0 and krandom._keep_threshold(0.25) == 2 ** 30
    t = krandom._keep_threshold(0.1)
    assert t / 2 ** 32 >= 0.1 > (t - 1) / 2 ** 32
    assert krandom._keep_threshold(1 - 2 ** -40) == 2 ** 32  # rounds to 1: nothing kept


def test_a_keep_mask_drawn_in_blocks_is_the_one_drawn_at_once(monkeypatch):
    """The keep-mask is drawn a block of raw words at a time (no word array of the tensor's size):
    the same stream, so the same mask as one draw, for any block size (even) and an odd size."""
    node = Node("n", "Dropout", "", ["x"], ["y", "mask"])
    ctx = type("Ctx", (), {"node": node, "random": None})()
    masks = []
    for block in (1 << 20, 6, 2):
        monkeypatch.setattr(krandom, "DRAW_BLOCK", block)
        monkeypatch.setattr(krandom, "_FALLBACK", krandom.Randomness(3))
        masks.append(krandom._keep_mask(ctx, (7, 13), 0.3, packed=False))
    gen = np.random.default_rng(3)
    words = gen.bit_generator.random_raw(-(-91 // 2)).view(np.uint32)[:91]
    once = (words >= np.uint32(krandom._keep_threshold(0.3))).reshape(7, 13)
    for m in masks:
        np.testing.assert_array_equal(m, once)


def test_the_executor_keeps_only_the_draws_a_recomputed_copy_reads():
    """A draw kept through the step is host memory outside the plan: kept only for the random
    nodes that have a recomputed copy (NAME@rcK) later in the step; every draw without `keep`."""
    r = krandom.Randomness(0)
    r.keep = krandom.recompute_draws(["drop", "drop2", "drop@rc1", "mm"])
    assert r.keep == frozenset({"drop"})
    for name in ("drop", "drop2"):
        r.draw(name, lambda gen, _into: gen.random(4))
    assert set(r.drawn) == {"drop"}
    again = r.draw("drop@rc1", lambda gen, _into: gen.random(4))
    np.testing.assert_array_equal(again, r.drawn["drop"])  # the copy reads the original's draw
    r.keep = None
    r.draw("drop2", lambda gen, _into: gen.random(4))
    assert set(r.drawn) == {"drop", "drop2"}


@pytest.mark.parametrize("kept", [False, True])
def test_a_mask_not_kept_is_drawn_straight_into_the_output(monkeypatch, kept):
    """A draw not kept through the step goes straight into the node's bool mask output: the same
    mask as one draw, and no host mask of the tensor's size beside the output (host memory outside
    the plan: tracemalloc's peak stays under the mask's bytes); a kept draw has its own array."""
    import tracemalloc

    size = 1 << 20
    node = Node("n", "Dropout", "", ["x"], ["y", "mask"])
    r = krandom.Randomness(5)
    r.keep = frozenset({"n"}) if kept else frozenset()
    ctx = type("Ctx", (), {"node": node, "random": r})()
    out = np.zeros(size, bool)
    tracemalloc.start()
    try:
        got = krandom._keep_mask(ctx, (size,), 0.3, packed=False, into=out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    gen = np.random.default_rng(5)
    once = gen.bit_generator.random_raw(size // 2).view(np.uint32) >= np.uint32(krandom._keep_threshold(0.3))
    np.testing.assert_array_equal(got, once)
    assert np.shares_memory(got, out) is not kept
    assert (peak >= size) is kept
    if not kept:
        np.testing.assert_array_equal(out, once)


def test_dropout_kernel_with_its_mask_drawn_in_place(given):
    """The Dropout kernel whose draw is not kept: its mask output is the draw, y = x * mask / (1 - ratio)."""
    given.keep = frozenset()
    x = _x(2, (64, 33))
    inputs = [x, np.array(0.4, F), np.array(True)]
    y, mask = run_kernel("Dropout", inputs, [x, ("bool", x.shape)])
    given.reset()
    given.keep = None
    y2, mask2 = run_kernel("Dropout", inputs, [x, ("bool", x.shape)])  # kept: its own host array, copied
    np.testing.assert_array_equal(mask, mask2)
    np.testing.assert_array_equal(y, y2)
    assert 0.5 < mask.mean() < 0.7
    np.testing.assert_allclose(y, x * mask / F(0.6), rtol=1e-6)
