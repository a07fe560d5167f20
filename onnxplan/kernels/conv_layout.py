"""How a convolution (and its gradient) walks the batch: the chunks of whole images or row bands,
where its buffers sit in its scratch (Layout), and the per-node memos of its window."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

from onnxplan.ir.windows import Window, extent, reads_padding, window
from onnxplan.kernels import scratch
from onnxplan.kernels.im2col import by_rows
from onnxplan.kernels.registry import KernelContext
from onnxplan.kernels.scratch import align

__all__ = ["NODE_MEMO_ENTRIES", "SMALL_DX", "Layout", "chunk_source", "conv_window", "depthwise", "layout",
           "node_memo", "one_copy"]

SMALL_DX = 1 << 15  # dY elements up to which a group-1 conv's dX is computed as a conv too


@dataclass(frozen=True)
class Layout:
    """How a (grad) convolution walks the batch, and where its buffers sit in its scratch.

    A chunk is either `nb` > 1 whole images, or one image's band of `band` rows of the first
    output axis; each chunk covers every group (one batched GEMM over the groups). Offsets are
    -1 for buffers the layout does not use.
    """

    n: int
    rows_out: int  # the first output axis's length
    nb: int  # images per chunk
    band: int  # output rows per chunk (rows_out unless nb == 1)
    col: int  # the columns (C * prod(kernel), nb * band * rest), rest = prod(out_dims[1:])
    rows: int  # output/dY rows in image-interleaved order (M, nb * L), only for nb > 1
    acc: int  # a (M, C/g * prod(kernel)) partial dW, when dW takes more than one chunk
    src: int  # X's zero-padded copy (nb, C, *extent) when the window reads padding
    nbytes: int

    def chunks(self):
        """(first image, images, first row, end row) of each chunk, in order."""
        for n0 in range(0, self.n, self.nb):
            for b0 in range(0, self.rows_out, self.band):
                yield n0, min(self.nb, self.n - n0), b0, min(b0 + self.band, self.rows_out)


def layout(x_shape, w_shape, y_dims, group: int, itemsize: int, need_cols: bool,
           need_acc: bool, win: Window | None = None) -> Layout:
    """layout_for at the current scratch.SCRATCH_TARGET (read at call time: tests lower it)."""
    return layout_for(scratch.SCRATCH_TARGET, tuple(x_shape), tuple(w_shape), tuple(y_dims), group, itemsize,
                      need_cols, need_acc, win)


@functools.lru_cache(maxsize=4096)
def layout_for(target: int, x_shape, w_shape, y_dims, group: int, itemsize: int, need_cols: bool,
               need_acc: bool, win: Window | None) -> Layout:
    """The chunking and scratch of a conv (the scratch rule and the kernel share it).

    Chunks aim at `target` bytes of columns, rows and padded source (scratch.SCRATCH_TARGET): several
    whole images when one image's fit, else bands of one image's output rows (at least one row).
    `win` (given when the columns are made from X) adds X's zero-padded copy when the window
    reads padding. ConvGrad adds a dW-sized partial sum when there is more than one chunk. A
    depthwise conv (see depthwise) always has its rows (channels-last) and a (taps, C) block.
    """
    n, c, m = x_shape[0], x_shape[1], w_shape[0]
    ck, ckg, rows_out = c * prod(w_shape[2:]), prod(w_shape[1:]), y_dims[0]
    rest = prod(y_dims[1:])
    if not need_cols:
        return Layout(n, rows_out, n, rows_out, -1, -1, -1, -1, 0)
    padded = win is not None and reads_padding(win)
    spans = extent(win) if padded else (0,)
    s0, reach0 = (win.strides[0], spans[0] - (rows_out - 1) * win.strides[0]) if padded and win else (0, 0)
    src_rest = c * prod(spans[1:]) if padded else 0  # padded elements per extent row

    def src_elems(nb: int, band: int) -> int:
        return nb * src_rest * ((band - 1) * s0 + reach0) if padded else 0

    channelwise = depthwise(x_shape, w_shape, group)
    per_image = ((ck + m) * rows_out * rest + src_elems(1, rows_out)) * itemsize
    nb = max(1, min(n, target // per_image))
    band = rows_out
    if nb == 1:
        per_row = (ck * rest + src_rest * s0) * itemsize
        band = max(1, min(rows_out, (target - src_rest * reach0 * itemsize) // per_row))
    col_bytes = align(ck * nb * band * rest * itemsize)
    rows_bytes = align(m * nb * band * rest * itemsize) if nb > 1 or channelwise else 0
    several = nb < n or band < rows_out
    acc_bytes = align(m * ckg * itemsize) if (need_acc and several) or channelwise else 0
    src_bytes = align(src_elems(nb, band) * itemsize)
    offset = col_bytes
    rows = offset if rows_bytes else -1
    offset += rows_bytes
    acc = offset if acc_bytes else -1
    offset += acc_bytes
    src = offset if src_bytes else -1
    return Layout(n, rows_out, nb, band, 0, rows, acc, src, offset + src_bytes)


# Per-node memos (conv_window, conv_transpose's _as_conv) hold at most this many entries each, the oldest evicted first.
NODE_MEMO_ENTRIES = 4096
WINDOWS: dict[tuple, tuple[dict, Window]] = {}


def node_memo(memo: dict, node_attrs: dict, key: tuple, make: Callable[[], Any]) -> Any:
    """make(), remembered in `memo` per attribute dict (by identity: a node's attributes do not
    change once it runs) and `key`; the entry holds the dict, so its id is not reused while the
    entry lives. At most NODE_MEMO_ENTRIES entries, the oldest evicted first."""
    key = (id(node_attrs), *key)
    hit = memo.get(key)
    if hit is not None and hit[0] is node_attrs:
        return hit[1]
    value = make()
    while len(memo) >= NODE_MEMO_ENTRIES:
        del memo[next(iter(memo))]
    memo[key] = (node_attrs, value)
    return value


def conv_window(node_attrs, x_shape, w_shape, y_shape) -> Window:
    """window() of a conv node, remembered per attribute dict and shapes (a step calls the same
    nodes again, and window() costs ~6 us)."""
    return node_memo(WINDOWS, node_attrs, (tuple(x_shape), tuple(w_shape), tuple(y_shape)),
                     lambda: window(node_attrs, x_shape[2:], y_shape[2:], w_shape[2:]))


def depthwise(x_shape, w_shape, group: int) -> bool:
    """One input and one output channel per group: Y[n, c] = sum over taps t of W[c, t] X[n, c] at
    t's positions, computed on channels-last columns (T, n, *out, C) by an elementwise product and
    a sum over the taps (a GEMM per channel would be a (1, T) @ (T, L) call each)."""
    return group > 1 and int(x_shape[1]) == group and int(w_shape[0]) == group


def one_copy(win: Window, x_shape, w_shape, y_shape, group: int) -> Window | None:
    """`win` when the columns are one strided copy from a padded source (grouped and small convs:
    a call per tap costs more than the copy; by_rows windows: a run per tap from a row-padded
    copy), else None (im2col copies tap by tap)."""
    return win if group > 1 or prod(y_shape) <= SMALL_DX or by_rows(win) else None


def chunk_source(ctx: KernelContext, lay: Layout, sub: Window, nb: int, c: int, dtype):
    """The chunk's padded-source scratch, or None when its window reads no padding."""
    if lay.src < 0 or not reads_padding(sub):
        return None
    return ctx.scratch_array(lay.src, (nb, c, *extent(sub)), dtype)
