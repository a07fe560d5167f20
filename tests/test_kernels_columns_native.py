"""im2col and col2im's accumulation by the fused C loops (onnxplan.kernels.native.im2col and
col2im_add). im2col: numpy's strided copy word for word (NaN payloads included), by the tap table
and row by row. col2im: numpy's tap-by-tap adds bit for bit (-0.0 and infinities included; NaN
where numpy gives NaN, of either sign: C may take either NaN operand of an add). Over strides,
pads, dilations, bands of output rows and the parts a split hands each thread; the loops seen to
run; what they do not take (not float32, rows not contiguous) stays on numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from onnxplan import settings
from onnxplan.ir import windows
from onnxplan.kernels import im2col, native

pytestmark = pytest.mark.skipif(native.col2im_add() is None, reason="no C compiler: the numpy path only")

GEOMETRIES = [  # (h, w), kernel, strides, pads, dilations
    *itertools.product([(5, 7), (8, 8), (4, 4), (1, 6)], [(3, 3)], [(1, 1), (2, 2)], [(1, 1)], [(1, 1)]),
    *itertools.product([(5, 7), (8, 8)], [(3, 3)], [(1, 1), (2, 2)], [(0, 0)], [(1, 1)]),
    ((9, 8), (2, 3), (1, 2), (2, 1), (2, 1)),  # pads wider than the kernel's reach on one axis
    ((6, 6), (3, 3), (1, 1), (2, 2), (2, 2)),  # dilated, outputs as wide as the input
    ((7, 5), (1, 1), (1, 1), (0, 0), (1, 1)),
    ((10, 10), (5, 5), (3, 3), (2, 2), (1, 1)),
]


def _window(hw, kernel, strides, pads, dilations) -> windows.Window:
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    out = [(i + 2 * p - r) // s + 1 for i, p, r, s in zip(hw, pads, reach, strides)]
    attrs = {"strides": list(strides), "pads": [*pads, *pads], "dilations": list(dilations)}
    return windows.window(attrs, hw, out, kernel)


def _specials(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    flat = a.reshape(-1)
    for value in (-0.0, np.nan, np.inf, -np.inf):
        flat[rng.integers(0, flat.size, max(1, flat.size // 50))] = value
    return a


def _assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Every float's bits, a NaN's sign and payload aside."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def _numpy_and_loop(loop_name: str, run, fresh) -> tuple[np.ndarray, np.ndarray, int]:
    """run(out) on numpy's path and on the C loop `native.<loop_name>`, each into its own
    fresh() output: (numpy's, the loop's, how often the loop ran)."""
    ran = 0
    loop = getattr(native, loop_name)()

    def counted(*args):
        nonlocal ran
        ran += 1
        loop(*args)

    by_numpy, by_loop = fresh(), fresh()
    with settings.override(native_kernels=False), np.errstate(invalid="ignore"):  # inf - inf
        run(by_numpy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native, loop_name, lambda: counted)
        run(by_loop)
    return by_numpy, by_loop, ran


def _both(win, col, dx) -> tuple[np.ndarray, np.ndarray, int]:
    """dx after col2im_add on numpy's path and on the loop's; how often the loop ran."""
    return _numpy_and_loop("col2im_add", lambda out: im2col.col2im_add(np, win, col, out), dx.copy)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("band", [False, True], ids=["whole", "band"])
def test_the_loop_adds_numpys_bits(geometry, band):
    rng = np.random.default_rng(7)
    win = _window(*geometry)
    if band and win.out_dims[0] > 1:
        win = win.band(1, win.out_dims[0])
    n, c = 3, 4
    col = _specials(rng.standard_normal((c, *win.kernel, n, *win.out_dims)).astype(np.float32), rng)
    dx = _specials(rng.standard_normal((n, c, *win.in_dims)).astype(np.float32), rng)
    by_numpy, by_loop, ran = _both(win, col, dx)
    assert ran == 1
    _assert_same_bits(by_loop, by_numpy)


@pytest.mark.parametrize("images", [4, 1], ids=["by-images", "one-image-by-channels"])
def test_each_threads_part_is_the_whole_ones_bits(images, split):
    """Cut across 3 threads (a part's images, or one image's channels: strided views of the
    columns), the loop runs once a part and adds the bits of numpy's whole."""
    rng = np.random.default_rng(11)
    win = _window((8, 8), (3, 3), (1, 1), (1, 1), (1, 1))
    col = rng.standard_normal((6, 3, 3, images, 8, 8)).astype(np.float32)
    dx = rng.standard_normal((images, 6, 8, 8)).astype(np.float32)
    assert len(im2col.image_parts(np, images, 6, col.size)) == 3
    by_numpy, by_loop, ran = _both(win, col, dx)
    assert ran == 3
    _assert_same_bits(by_loop, by_numpy)


def test_what_the_loop_does_not_take_stays_on_numpy():
    win = _window((6, 6), (3, 3), (1, 1), (1, 1), (1, 1))
    col = np.ones((2, 3, 3, 2, 6, 6), np.float32)
    dx = np.zeros((2, 2, 6, 6), np.float32)
    assert im2col._native_geometry(np, win, dx, col) is not None
    assert im2col._native_geometry(np, win, dx.astype(np.float64), col.astype(np.float64)) is None
    wide = np.zeros((2, 2, 6, 12), np.float32)[..., ::2]  # rows of every other element
    assert im2col._native_geometry(np, win, wide, col) is None
    assert im2col._native_geometry(np, win, dx, np.ones((2, 3, 3, 2, 6, 12), np.float32)[..., ::2]) is None
    f64 = np.zeros((2, 2, 6, 6))
    _, by_loop, ran = _both(win, col.astype(np.float64), f64)
    assert ran == 0 and by_loop.sum() > 0


@pytest.mark.parametrize("geometry", GEOMETRIES[:4], ids=str)
def test_negative_zeros_stay_negative(geometry):
    """-0.0 columns added into -0.0: numpy keeps -0.0 everywhere; so must the loop's masked
    outputs (a tap's outputs that wrap around a row edge add -0.0, never +0.0)."""
    win = _window(*geometry)
    col = np.full((2, *win.kernel, 3, *win.out_dims), -0.0, np.float32)
    dx = np.full((3, 2, *win.in_dims), -0.0, np.float32)
    by_numpy, by_loop, ran = _both(win, col, dx)
    assert ran == 1 and np.signbit(by_numpy).all()
    _assert_same_bits(by_loop, by_numpy)


def _im2col_both(win, x, src=None) -> tuple[np.ndarray, np.ndarray, int]:
    """col from numpy's strided copies and from the loop's (NaN-filled first); how often the loop ran."""
    shape = (x.shape[1], *win.kernel, x.shape[0], *win.out_dims)
    return _numpy_and_loop("im2col", lambda out: im2col.im2col(np, win, x, out, src),
                           lambda: np.full(shape, np.nan, np.float32))


def _payloads(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """x with NaNs of several payloads and signs, infinities and -0.0 among its values."""
    words = x.reshape(-1).view(np.uint32)
    for word in (0x7FC00001, 0xFFC12345, 0x7F800001, 0x7F800000, 0xFF800000, 0x80000000):
        words[rng.integers(0, words.size, max(1, words.size // 60))] = word
    return x


def test_the_loop_takes_short_runs_numpy_long_ones():
    assert im2col._short_runs(_window((8, 8), (3, 3), (2, 2), (1, 1), (1, 1)))  # strided
    assert im2col._short_runs(_window((3, 3), (3, 3), (1, 1), (1, 1), (1, 1)))  # rows of 3
    assert not im2col._short_runs(_window((8, 8), (3, 3), (1, 1), (1, 1), (1, 1)))  # rows of 8
    assert not im2col._short_runs(_window((3, 3), (1, 1), (1, 1), (0, 0), (1, 1)))  # pointwise: one run
    assert im2col._short_runs(_window((1, 1), (1, 1), (1, 1), (1, 1), (1, 1)))  # padded 1 x 1 on one pixel: rows of 3


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("band", [False, True], ids=["whole", "band"])
def test_im2col_by_the_loop_moves_numpys_words(geometry, band):
    rng = np.random.default_rng(5)
    win = _window(*geometry)
    if band and win.out_dims[0] > 1:
        win = win.band(1, win.out_dims[0])
    x = _payloads(rng.standard_normal((3, 4, *win.in_dims)).astype(np.float32), rng)
    by_numpy, by_loop, ran = _im2col_both(win, x)
    assert ran == im2col._short_runs(win)  # numpy's copy of long runs stays: it is faster there
    np.testing.assert_array_equal(by_loop.view(np.uint32), by_numpy.view(np.uint32))


@pytest.mark.parametrize("hw,images", [((6, 7), 2), ((66, 65), 4)], ids=["tap-table", "rows"])
def test_im2col_by_table_and_by_rows_alike(hw, images):
    """A strided window small enough for the tap table, and one whose table would pass
    IM2COL_TABLE entries (9 x 4 images x 33 x 33 outputs): the rows; both numpy's words."""
    rng = np.random.default_rng(9)
    win = _window(hw, (3, 3), (2, 2), (1, 1), (1, 1))
    x = _payloads(rng.standard_normal((images, 3, *hw)).astype(np.float32), rng)
    by_numpy, by_loop, ran = _im2col_both(win, x)
    assert ran == 1 and (9 * images * win.out_dims[0] * win.out_dims[1] > 16384) == (hw == (66, 65))
    np.testing.assert_array_equal(by_loop.view(np.uint32), by_numpy.view(np.uint32))


@pytest.mark.parametrize("images", [4, 1], ids=["by-images", "one-image-by-channels"])
def test_im2col_each_threads_part_is_the_whole_ones_words(images, split):
    rng = np.random.default_rng(13)
    win = _window((7, 7), (3, 3), (2, 2), (1, 1), (1, 1))
    x = rng.standard_normal((images, 6, 7, 7)).astype(np.float32)
    assert len(im2col.image_parts(np, images, 6, 6 * 9 * images * 16)) == 3
    by_numpy, by_loop, ran = _im2col_both(win, x)
    assert ran == 3
    np.testing.assert_array_equal(by_loop.view(np.uint32), by_numpy.view(np.uint32))


def test_by_rows_windows_keep_numpys_copy_a_tap():
    """A unit-stride window as wide as its input with a padded source: the one-copy-a-tap path
    (faster there than the loop), not the loop."""
    rng = np.random.default_rng(17)
    win = _window((8, 8), (3, 3), (1, 1), (1, 1), (1, 1))
    assert im2col.by_rows(win)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    src = np.empty(2 * 3 * (10 * 8 + 2), np.float32)
    by_numpy, by_loop, ran = _im2col_both(win, x, src)
    assert ran == 0
    np.testing.assert_array_equal(by_loop, by_numpy)


def test_col2im_of_a_large_map_row_by_row():
    """A unit-stride window over a map whose masks would pass COL2IM_MASKS words (3 x 80 x 80):
    row by row, numpy's bits."""
    rng = np.random.default_rng(19)
    win = _window((80, 80), (3, 3), (1, 1), (1, 1), (1, 1))
    col = _specials(rng.standard_normal((2, 3, 3, 1, 80, 80)).astype(np.float32), rng)
    dx = _specials(rng.standard_normal((1, 2, 80, 80)).astype(np.float32), rng)
    by_numpy, by_loop, ran = _both(win, col, dx)
    assert ran == 1
    _assert_same_bits(by_loop, by_numpy)
