"""Window geometry of Conv, ConvTranspose and the pools, one home for the shape rules, the kernels,
the import path (forward/pads.py) and verification.

A window over the spatial axes: output o of axis a, tap k reads input o * strides[a] - pads_begin[a]
+ k * dilations[a]. Its attributes are read here once (strides, dilations, pads, auto_pad; an absent
or empty list means the default), and the arithmetic is ONNX Runtime 1.19's: output sizes from
the input side (the shape rules: `conv_out_dims`, `pool_out_dims`, `conv_transpose_out_dims`),
pads from both sides (the kernels: `window`, `transpose_pads`), and auto_pad SAME_UPPER /
SAME_LOWER split with `split_same` (the odd element at the end for SAME_UPPER, at the
beginning for SAME_LOWER).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from onnxplan.ir.attrs import attr_str

__all__ = [
    "SAME",
    "Tap",
    "Window",
    "WindowError",
    "auto_pad",
    "ceil_window_past_input",
    "conv_out_dims",
    "conv_transpose_out_dims",
    "extent",
    "pool_out_dims",
    "reads_padding",
    "same_out_dims",
    "same_pads",
    "split_same",
    "transpose_pads",
    "unit_stride_in_dims",
    "window",
    "window_ints",
]

SAME = ("SAME_UPPER", "SAME_LOWER")


class WindowError(ValueError):
    """A window that does not fit its input (the shape rules report it as the node's error)."""


def window_ints(attrs: Mapping[str, Any], name: str, n: int, default: int) -> tuple[int, ...]:
    """An int-list window attribute (strides, dilations, pads, output_padding), or `n` times
    `default` when it is absent or empty."""
    value = attrs.get(name)
    if value is None:
        return (default,) * n
    flat = np.asarray(value).reshape(-1)
    return tuple(int(v) for v in flat) if flat.size else (default,) * n


def auto_pad(attrs: Mapping[str, Any]) -> str:
    return attr_str(attrs.get("auto_pad"), "NOTSET")


def split_same(total: int, mode: str) -> tuple[int, int]:
    """(head, tail) of a SAME total padding: the odd element at the end for SAME_UPPER, at the
    beginning for SAME_LOWER."""
    head = total // 2 if mode == "SAME_UPPER" else total - total // 2
    return head, total - head


def same_out_dims(spatial: Sequence[int], strides: Sequence[int]) -> list[int]:
    """ONNX's SAME output: ceil(in / stride) per axis."""
    return [-(-int(i) // int(s)) for i, s in zip(spatial, strides)]


def _reach(k: int, d: int) -> int:
    """Input positions a kernel of k taps at dilation d spans."""
    return (k - 1) * d + 1


@dataclass(frozen=True)
class Tap:
    """One kernel position: the outputs it reaches inside the input, and the input it reads."""

    index: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]  # per spatial axis: [lo, hi) of output positions
    in_slices: tuple[slice, ...]  # per spatial axis: the input positions read, strided

    @property
    def empty(self) -> bool:
        return any(hi <= lo for lo, hi in self.spans)

    @property
    def out_slices(self) -> tuple[slice, ...]:
        return tuple(slice(lo, hi) for lo, hi in self.spans)


@dataclass(frozen=True)
class Window:
    """A sliding window over the spatial axes: output o of axis a, tap k reads input
    o * strides[a] - pads_begin[a] + k * dilations[a]."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    in_dims: tuple[int, ...]
    out_dims: tuple[int, ...]

    def span(self, axis: int, k: int) -> tuple[int, int, int]:
        """(lo, hi, first input) of the outputs whose tap k on `axis` lands inside the input."""
        s, size, n_out = self.strides[axis], self.in_dims[axis], self.out_dims[axis]
        off = k * self.dilations[axis] - self.pads_begin[axis]
        lo = 0 if off >= 0 else (-off + s - 1) // s
        hi = min(n_out, (size - 1 - off) // s + 1) if size - 1 - off >= 0 else 0
        lo = min(lo, n_out)
        return lo, max(lo, hi), lo * s + off

    def taps(self) -> tuple[Tap, ...]:
        """Every kernel position in row-major order (the order ORT visits a window in); made
        once per window (a step calls the same layers again)."""
        return _taps_of(self, False)

    def live_taps(self) -> tuple[Tap, ...]:
        """The taps that read some input, in taps()'s order: a window far larger than its input
        (an exported adaptive pool: kernel 320 on 8 positions) has few, and only they are visited."""
        return _taps_of(self, True)

    def _taps(self, live: bool) -> Iterator[Tap]:
        axes = range(len(self.kernel))
        per_axis = [[(k, self.span(a, k)) for k in range(self.kernel[a])] for a in axes]
        if live:
            per_axis = [[(k, sp) for k, sp in ks if sp[1] > sp[0]] for ks in per_axis]
        for combo in itertools.product(*per_axis):
            spans, slices = [], []
            for a, (_k, (lo, hi, start)) in zip(axes, combo):
                spans.append((lo, hi))
                step = self.strides[a]
                slices.append(slice(start, start + max(hi - lo - 1, 0) * step + 1, step))
            yield Tap(tuple(k for k, _sp in combo), tuple(spans), tuple(slices))

    def band(self, lo: int, hi: int) -> Window:
        """The window of output rows [lo, hi) of the first spatial axis alone."""
        if (lo, hi) == (0, self.out_dims[0]):
            return self
        return _band_of(self, lo, hi)

    def _band(self, lo: int, hi: int) -> Window:
        pads = (self.pads_begin[0] - lo * self.strides[0], *self.pads_begin[1:])
        return replace(self, pads_begin=pads, out_dims=(hi - lo, *self.out_dims[1:]))

    @property
    def pointwise(self) -> bool:
        """A 1x1 window with unit strides and no padding: the input is its own column matrix."""
        return (all(k == 1 for k in self.kernel) and all(s == 1 for s in self.strides)
                and not any(self.pads_begin) and not any(self.pads_end))


@functools.lru_cache(maxsize=4096)
def _band_of(win: Window, lo: int, hi: int) -> Window:
    return win._band(lo, hi)


@functools.lru_cache(maxsize=4096)
def _taps_of(win: Window, live: bool) -> tuple[Tap, ...]:
    return tuple(win._taps(live))


@functools.lru_cache(maxsize=4096)
def extent(win: Window) -> tuple[int, ...]:
    """Per spatial axis: the input positions the window spans, from its first tap to its last."""
    return tuple(max(o - 1, 0) * s + _reach(k, d) for o, s, k, d in
                 zip(win.out_dims, win.strides, win.kernel, win.dilations))


@functools.lru_cache(maxsize=4096)
def reads_padding(win: Window) -> bool:
    """True when some tap reads padding (outside the input)."""
    return any(p > 0 or e - p > i for p, e, i in zip(win.pads_begin, extent(win), win.in_dims))


def window(attrs: Mapping[str, Any], in_dims: Sequence[int], out_dims: Sequence[int],
           kernel_shape: Sequence[int]) -> Window:
    """The window of a Conv/pool node (auto_pad resolved) mapping `in_dims` onto `out_dims`."""
    n = len(in_dims)
    kernel = tuple(int(k) for k in kernel_shape)
    strides = window_ints(attrs, "strides", n, 1)
    dilations = window_ints(attrs, "dilations", n, 1)
    mode = auto_pad(attrs)
    if mode in SAME:
        heads_tails = [split_same(max(0, (o - 1) * s + _reach(k, d) - i), mode)
                       for i, o, k, s, d in zip(in_dims, out_dims, kernel, strides, dilations)]
        begin = tuple(h for h, _t in heads_tails)
        end = tuple(t for _h, t in heads_tails)
    elif mode == "VALID":
        begin = end = (0,) * n
    else:
        pads = window_ints(attrs, "pads", 2 * n, 0)
        begin, end = pads[:n], pads[n:]
    return Window(kernel, strides, dilations, tuple(begin), tuple(end),
                  tuple(int(d) for d in in_dims), tuple(int(d) for d in out_dims))


def same_pads(attrs: Mapping[str, Any], spatial: Sequence[int], kernel: Sequence[int]) -> list[int]:
    """The explicit pads (begin..., end...) auto_pad means on a static input (SAME: the output
    ceil(in / stride); VALID: zeros)."""
    strides = window_ints(attrs, "strides", len(spatial), 1)
    win = window(attrs, spatial, same_out_dims(spatial, strides), kernel)
    return [*win.pads_begin, *win.pads_end]


def _pads_of(attrs: Mapping[str, Any], n: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(strides, dilations, pads begin + end) as written on the node."""
    return (window_ints(attrs, "strides", n, 1), window_ints(attrs, "dilations", n, 1),
            window_ints(attrs, "pads", 2 * n, 0))


def pool_out_dims(attrs: Mapping[str, Any], spatial: Sequence[int], kernel: Sequence[int],
                  ceil_mode: bool = False) -> list[int]:
    """Output spatial dims of a pooling window (ONNX Runtime's PoolAttributes arithmetic: its SAME
    padding ignores the dilations)."""
    n = len(spatial)
    strides, dilations, pads = _pads_of(attrs, n)
    mode = auto_pad(attrs)
    out = []
    for i, size in enumerate(spatial):
        k, s, d = kernel[i], strides[i], dilations[i]
        head, tail = pads[i], pads[i + n]
        if mode == "VALID":
            head = tail = 0
        elif mode in SAME:
            head, tail = split_same((same_out_dims([size], [s])[0] - 1) * s + k - size, mode)
        numerator = size + head + tail - d * (k - 1) - 1
        # ONNX Runtime 1.19 does not drop a ceil-mode window that starts in the right padding.
        dim = (-(-numerator // s) if ceil_mode else numerator // s) + 1
        if dim < 0:
            raise WindowError(f"window {k} (stride {s}) does not fit an input of size {size}")
        out.append(dim)
    return out


def ceil_window_past_input(attrs: Mapping[str, Any], spatial: Sequence[int], dims: Sequence[int]) -> int | None:
    """The first spatial axis whose last ceil-mode window starts past the input and its end
    padding (ONNX drops such a window, ONNX Runtime 1.19 keeps it), or None."""
    n = len(dims)
    strides, _dilations, pads = _pads_of(attrs, n)
    for i, (d, size) in enumerate(zip(dims, spatial)):
        if (d - 1) * strides[i] - pads[i] >= size + pads[n + i]:
            return i
    return None


def conv_out_dims(attrs: Mapping[str, Any], spatial: Sequence[int], kernel: Sequence[int]) -> list[int]:
    """Output spatial dims of Conv (ONNX Runtime's ConvAttributes arithmetic)."""
    n = len(spatial)
    strides, dilations, pads = _pads_of(attrs, n)
    mode = auto_pad(attrs)
    out = []
    for i, size in enumerate(spatial):
        if mode in SAME:
            out.append(same_out_dims([size], [strides[i]])[0])
            continue
        head, tail = (0, 0) if mode == "VALID" else (pads[i], pads[i + n])
        dim = (size + head + tail - _reach(kernel[i], dilations[i])) // strides[i] + 1
        if dim <= 0:
            raise WindowError(f"kernel {kernel[i]} does not fit an input of size {size}")
        out.append(dim)
    return out


def conv_transpose_out_dims(attrs: Mapping[str, Any], spatial: Sequence[int], kernel: Sequence[int]) -> list[int]:
    """Output spatial dims of ConvTranspose: output_shape when given, else ONNX's formula."""
    n = len(spatial)
    explicit = attrs.get("output_shape")
    if explicit is not None and len(explicit):
        return [int(v) for v in np.asarray(explicit).reshape(-1)][-n:]
    strides, dilations, pads = _pads_of(attrs, n)
    out_pad = window_ints(attrs, "output_padding", n, 0)
    mode = auto_pad(attrs)
    out = []
    for i, size in enumerate(spatial):
        if mode in SAME:
            out.append(size * strides[i])
            continue
        head, tail = (0, 0) if mode == "VALID" else (pads[i], pads[i + n])
        out.append(strides[i] * (size - 1) + out_pad[i] + _reach(kernel[i], dilations[i]) - head - tail)
    return out


def transpose_pads(attrs: Mapping[str, Any], x_dims: Sequence[int],
                   kernel_shape: Sequence[int]) -> tuple[list[int], list[int]]:
    """(pads_begin, pads_end) of a ConvTranspose, as ONNX Runtime resolves them: explicit pads,
    or a total from output_shape / auto_pad SAME_* (out = in * stride) split between the ends."""
    n = len(x_dims)
    strides, dilations, pads = _pads_of(attrs, n)
    adj = window_ints(attrs, "output_padding", n, 0)
    mode = auto_pad(attrs)
    shape = [int(v) for v in attrs.get("output_shape") or []]
    if not shape and mode not in SAME:
        if mode == "VALID":
            return [0] * n, [0] * n
        return list(pads[:n]), list(pads[n:])
    begin, end = [], []
    for i in range(n):
        out = shape[-n:][i] if shape else x_dims[i] * strides[i]
        total = max(0, (x_dims[i] - 1) * strides[i] + adj[i] + _reach(kernel_shape[i], dilations[i]) - out)
        head, tail = split_same(total, mode)  # ORT 1.19's split (NOTSET with output_shape: as SAME_LOWER)
        begin.append(head)
        end.append(tail)
    return begin, end


def unit_stride_in_dims(attrs: Mapping[str, Any], out_dims: Sequence[int], kernel: Sequence[int]) -> list[int]:
    """The input spatial dims a window with unit strides and explicit pads maps onto `out_dims`."""
    n = len(out_dims)
    _strides, dilations, pads = _pads_of(attrs, n)
    return [y - 1 + _reach(kernel[i], dilations[i]) - pads[i] - pads[i + n] for i, y in enumerate(out_dims)]
