"""Greedy by size (Pisarchyk & Lee; TFLite): largest first, into the tightest gap over its life."""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from onnxplan.offsets.buffers import ALIGNMENT, Buffer, OffsetPlan, unique_buffers

__all__ = ["greedy_size_offsets"]

_SHIFT = 32  # a placed span is packed as low << 32 | high (in ALIGNMENT units) in an int64
_RECENT = 64  # placed spans kept unsorted before merging into the address-sorted arrays


def greedy_size_offsets(
    buffers: Iterable[Buffer], *, time_limit: float | None = None
) -> OffsetPlan:
    """Greedy by size for offset calculation.

    Buffers go in order of size descending (then longer lifetime, then name). Each one looks
    at the address spans of already placed buffers whose lifetimes overlap its own, in
    address order, and takes the smallest gap between them that fits (the lowest on ties);
    with no such gap it goes right above the highest of them. Sizes count in ALIGNMENT units.

    The published scan is O(n * m), m the placed buffers overlapping a lifetime; it is kept,
    in numpy: placed spans stay sorted by address (the latest few in a small batch merged
    in), so each query is a mask and a few vector passes, with no sort. The tests compare
    it with the plain quadratic version.
    """
    start = time.perf_counter()
    bufs = unique_buffers(buffers)
    offsets = {b.name: 0 for b in bufs if not b.nbytes}
    order = sorted(
        (b for b in bufs if b.nbytes), key=lambda b: (-b.padded, b.first - b.last, b.name)
    )
    total = sum(b.padded // ALIGNMENT for b in order)
    # Packed spans fit an int64 while every address is below 2**31 units (128 GiB); past that
    # they are Python ints in object arrays: slower, same answers, no overflow.
    shift, dtype = (_SHIFT, np.int64) if total < 1 << (_SHIFT - 1) else (total.bit_length() + 1, object)
    placed = _PlacedSpans(len(order), shift, dtype)
    arena = 0
    for b in order:
        size = b.padded // ALIGNMENT
        spans = placed.overlapping(b.first, b.last)
        low = _tightest_gap(spans, size, shift) if len(spans) else 0
        placed.add(b.first, b.last, low, low + size)
        offsets[b.name] = low * ALIGNMENT
        arena = max(arena, (low + size) * ALIGNMENT)
    return OffsetPlan("greedy-size", offsets, arena, time.perf_counter() - start)


def _tightest_gap(spans: np.ndarray, size: int, shift: int = _SHIFT) -> int:
    """Lowest address of the smallest gap >= size between packed, sorted spans, else the top.

    A gap before span i is lows[i] minus the highest end among spans 0..i-1; it is at most
    lows[i] - highs[i-1], so only the few i where that already fits need the running max,
    taken over the stretches between them (np.maximum.accumulate over all is slow).
    """
    lows = spans >> shift
    highs = spans & ((1 << shift) - 1)
    no_gap = 1 << (2 * shift - 2)  # more than any gap (1 << 62 in an int64)
    fits = np.flatnonzero(lows[1:] - highs[:-1] >= size) + 1
    candidates = np.empty(len(fits) + 1, dtype=np.int64)
    candidates[0] = 0
    candidates[1:] = fits
    stretch_max = np.maximum.reduceat(highs, candidates)
    reach = np.empty_like(stretch_max)  # highest end before each candidate
    reach[0] = 0
    np.maximum.accumulate(stretch_max[:-1], out=reach[1:])
    gaps = lows[candidates] - reach
    gaps[gaps < size] = no_gap
    i = int(gaps.argmin())
    if gaps[i] == no_gap:
        return int(max(reach[-1], stretch_max[-1]))
    return int(reach[i])


class _PlacedSpans:
    """Placed (lifetime, address span) pairs; answers which spans overlap a lifetime."""

    def __init__(self, capacity: int, shift: int = _SHIFT, dtype: type = np.int64) -> None:
        self.shift = shift
        self.count = 0  # sorted prefix length
        self.spans: np.ndarray = np.empty(capacity, dtype=dtype)
        self.firsts = np.empty(capacity, dtype=np.int32)
        self.lasts = np.empty(capacity, dtype=np.int32)
        self.mask = np.empty(capacity, dtype=bool)
        self.scratch = np.empty(capacity, dtype=bool)
        self.recent = 0
        self.recent_spans: np.ndarray = np.empty(_RECENT, dtype=dtype)
        self.recent_firsts = np.empty(_RECENT, dtype=np.int32)
        self.recent_lasts = np.empty(_RECENT, dtype=np.int32)

    def overlapping(self, first: int, last: int) -> np.ndarray:
        """Packed spans of placed buffers live at some EO of [first, last], sorted."""
        k = self.count
        mask, scratch = self.mask[:k], self.scratch[:k]
        np.less_equal(self.firsts[:k], last, out=mask)
        np.greater_equal(self.lasts[:k], first, out=scratch)
        np.logical_and(mask, scratch, out=mask)
        hits = self.spans[:k][mask]
        r = self.recent
        if r:
            new = self.recent_spans[:r][
                (self.recent_firsts[:r] <= last) & (self.recent_lasts[:r] >= first)
            ]
            if len(new):
                new.sort()
                hits = np.insert(hits, np.searchsorted(hits, new), new)
        return hits

    def add(self, first: int, last: int, low: int, high: int) -> None:
        r = self.recent
        self.recent_spans[r] = (low << self.shift) | high
        self.recent_firsts[r], self.recent_lasts[r] = first, last
        self.recent = r + 1
        if self.recent == _RECENT:
            self._merge_recent()

    def _merge_recent(self) -> None:
        k, r = self.count, self.recent
        order = np.argsort(self.recent_spans[:r], kind="stable")
        new = self.recent_spans[:r][order]
        at = np.searchsorted(self.spans[:k], new) + np.arange(r)
        old = np.ones(k + r, dtype=bool)
        old[at] = False
        for sorted_arr, recent_arr in (
            (self.spans, self.recent_spans),
            (self.firsts, self.recent_firsts),
            (self.lasts, self.recent_lasts),
        ):
            sorted_arr[: k + r][old] = sorted_arr[:k].copy()
            sorted_arr[at] = recent_arr[:r][order]
        self.count, self.recent = k + r, 0
        self._coalesce()

    def _coalesce(self) -> None:
        """Join address-neighbours with the same lifetime that touch: same answers, fewer spans.

        Buffers live all step (parameters, optimizer state) pile up side by side; as one span
        per run they stop dominating every query.
        """
        k = self.count
        spans, firsts, lasts = self.spans[:k], self.firsts[:k], self.lasts[:k]
        lows, highs = spans >> self.shift, spans & ((1 << self.shift) - 1)
        joins = (firsts[1:] == firsts[:-1]) & (lasts[1:] == lasts[:-1]) & (lows[1:] <= highs[:-1])
        if not joins.any():
            return
        starts = np.flatnonzero(np.concatenate(([True], ~joins)))
        merged = (lows[starts] << self.shift) | np.maximum.reduceat(highs, starts)
        order = np.argsort(merged, kind="stable")  # a longer run may now sort after a neighbour
        m = len(starts)
        self.firsts[:m], self.lasts[:m] = firsts[starts][order], lasts[starts][order]
        self.spans[:m] = merged[order]
        self.count = m
