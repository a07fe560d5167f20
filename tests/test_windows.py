"""Window geometry (onnxplan/ir/windows.py): the shape rules' output sizes (from the input side)
and the kernels' pads (from both sides) are one arithmetic, so they agree on every window."""

from __future__ import annotations

import itertools

import pytest

from onnxplan.ir import windows


def test_same_splits_the_odd_element_as_onnx_says():
    # ONNX: SAME_UPPER puts the extra padding at the end, SAME_LOWER at the beginning
    assert windows.split_same(3, "SAME_UPPER") == (1, 2)
    assert windows.split_same(3, "SAME_LOWER") == (2, 1)
    assert windows.split_same(4, "SAME_LOWER") == (2, 2)
    win = windows.window({"auto_pad": b"SAME_UPPER"}, (5,), (5,), (4,))
    assert (win.pads_begin, win.pads_end) == ((1,), (2,))
    assert windows.same_pads({"auto_pad": "SAME_LOWER", "strides": [2]}, (7,), (4,)) == [2, 1]
    assert windows.same_pads({"auto_pad": "VALID"}, (7, 7), (3, 3)) == [0, 0, 0, 0]


def _floor_out(size: int, k: int, s: int, d: int, begin: int, end: int) -> int:
    return (size + begin + end - (d * (k - 1) + 1)) // s + 1


@pytest.mark.parametrize("mode", ["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"])
def test_conv_output_and_the_kernels_window_agree(mode):
    """For every small window: the kernel's window, made from the input and the shape rule's
    output, has pads that give that output back by ONNX's floor formula."""
    for size, k, s, d, b, e in itertools.product(range(1, 9), range(1, 5), range(1, 4), range(1, 3),
                                                 range(3), range(3)):
        attrs = {"strides": [s], "dilations": [d], "pads": [b, e], "auto_pad": mode}
        try:
            (out,) = windows.conv_out_dims(attrs, (size,), (k,))
        except windows.WindowError:
            assert mode in ("NOTSET", "VALID") and _floor_out(size, k, s, d, *((b, e) if mode == "NOTSET"
                                                                                else (0, 0))) <= 0
            continue
        win = windows.window(attrs, (size,), (out,), (k,))
        if mode.startswith("SAME"):
            assert out == -(-size // s)
            if win.pads_begin[0] + win.pads_end[0] > 0:  # a padded SAME window reaches exactly
                assert _floor_out(size, k, s, d, win.pads_begin[0], win.pads_end[0]) == out
        else:
            assert _floor_out(size, k, s, d, win.pads_begin[0], win.pads_end[0]) == out


def test_pool_same_matches_conv_same_and_ceil_mode_rounds_up():
    for size, k, s in itertools.product(range(1, 12), range(1, 5), range(1, 4)):
        for mode in ("SAME_UPPER", "SAME_LOWER"):
            attrs = {"strides": [s], "auto_pad": mode}
            assert windows.pool_out_dims(attrs, (size,), (k,)) == windows.conv_out_dims(attrs, (size,), (k,))
    assert windows.pool_out_dims({"strides": [2]}, (6,), (3,)) == [2]
    assert windows.pool_out_dims({"strides": [2]}, (6,), (3,), ceil_mode=True) == [3]


def test_conv_transpose_pads_and_output_agree():
    """ConvTranspose's output (shape rule) and pads (kernel): out = s (in - 1) + adj + reach - pads,
    where that reach covers the output (SAME on a kernel shorter than its stride: no padding, as ORT)."""
    for size, k, s, adj, mode in itertools.product(range(1, 7), range(1, 5), range(1, 4), range(2),
                                                   ("NOTSET", "SAME_UPPER", "SAME_LOWER")):
        if adj >= s:
            continue
        attrs = {"strides": [s], "output_padding": [adj], "auto_pad": mode, "pads": [1, 0]}
        (out,) = windows.conv_transpose_out_dims(attrs, (size,), (k,))
        begin, end = windows.transpose_pads(attrs, (size,), (k,))
        natural = s * (size - 1) + adj + k
        if natural < out:
            assert mode.startswith("SAME") and begin == end == [0], (size, k, s, adj, mode)
            continue
        assert out == natural - begin[0] - end[0], (size, k, s, adj, mode)
