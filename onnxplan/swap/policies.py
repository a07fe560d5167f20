"""Swap policies: which gaps a policy swaps, when a swap-out completes and a swap-in is issued."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from onnxplan.errors import UsageError
from onnxplan.sizes import format_bytes
from onnxplan.swap.model import Gap, SwapModel

__all__ = [
    "SWAP_POLICIES",
    "OnDemand",
    "PolicyOptions",
    "Proactive",
    "Reduced",
    "SwapPolicy",
    "Timing",
    "Window",
    "just_in_time",
    "make_policy",
]


class PolicyOptions(TypedDict, total=False):
    """A policy's settings as the plan's SwapRecord holds them."""

    policy: str
    lookahead: int
    window_bytes: int | None


@dataclass(frozen=True)
class Timing:
    """Where a gap's swap nodes go in the base order.

    The SwapOut runs right before base EO `release` (the buffer's memory is free from there:
    its write must have completed); the SwapIn right before base EO `issue` (the buffer is
    taken from there; its read must complete before the next use). For a wrap gap `release`
    may be n (after the last node) and `issue` is in the same step, before the first use.
    """

    release: int
    issue: int

    def absent(self, gap: Gap, n: int) -> list[tuple[int, int]]:
        """Base-EO ranges [lo, hi) during which the buffer is out of memory."""
        if gap.wrap:
            return [r for r in ((self.release, n), (0, self.issue)) if r[1] > r[0]]
        return [(self.release, self.issue)] if self.issue > self.release else []


class SwapPolicy:
    """A named swap schedule. Subclasses set the timing of a gap; the rest is shared:

    - `per_buffer`: under a budget, the unit chosen is a whole buffer (every gap) instead of
      one gap;
    - `round_trips`: gaps with no EO inside are swapped too (out right after a use, in right
      before the next one: no memory saved, the transfers still cost);
    - `clean_drops`: a swap-out of bytes the store already holds (a weight not yet updated, an
      activation swapped in and not changed since) writes nothing, it only frees the memory;
    - `spends_slack`: under a budget, the gaps are chosen and placed with the timings of
      `timing` alone; `finalize` then gets the budget as its target, once they fit, to spend
      the memory left free (onnxplan.swap.adaptive).
    """

    name = "policy"
    per_buffer = False
    round_trips = False
    clean_drops = True
    spends_slack = False

    def timing(self, model: SwapModel, gap: Gap) -> Timing:
        raise NotImplementedError

    def finalize(self, model: SwapModel, timings: dict[Gap, Timing], profile: np.ndarray,
                 resident: int, target: int | None) -> dict[Gap, Timing]:
        """Adjust the timings once the gaps are chosen (default: unchanged)."""
        return timings

    def describe(self) -> str:
        return self.name

    def options(self) -> PolicyOptions:
        return {"policy": self.name}


def just_in_time(model: SwapModel, gap: Gap, delay: int = 0, lookahead: int = 0) -> Timing:
    n = model.n
    if gap.wrap:
        return Timing(min(gap.after + 1 + delay, n), max(gap.before - lookahead, 0))
    release = min(gap.after + 1 + delay, gap.before)
    return Timing(release, max(gap.before - lookahead, release))


class OnDemand(SwapPolicy):
    """NNTrainer Figure 7: a swapped buffer goes out right after each use and comes back right
    before the next, with no concern for EOs: every swap-out writes, round trips included."""

    name = "on-demand"
    per_buffer = True
    round_trips = True
    clean_drops = False

    def timing(self, model: SwapModel, gap: Gap) -> Timing:
        return just_in_time(model, gap)


class Reduced(SwapPolicy):
    """NNTrainer Figure 8a: on-demand timing, but conflicting requests merge (a gap with no EO
    inside moves nothing), values reused in place for their derivatives share one buffer and
    one swap record (the in-place pass merged them), and clean swap-outs write nothing."""

    name = "reduced"

    def timing(self, model: SwapModel, gap: Gap) -> Timing:
        return just_in_time(model, gap)


class Proactive(SwapPolicy):
    """NNTrainer Figure 8b: reduced, plus each swap-in is issued `lookahead` EOs before the use
    and each swap-out completes one EO after the last use before the gap (at EO n the I/O
    stream writes what EO n-1 used and reads what EO n + lookahead needs)."""

    name = "proactive"

    def __init__(self, lookahead: int = 1) -> None:
        if lookahead < 0:
            raise UsageError(f"invalid --lookahead {lookahead}: must be >= 0")
        self.lookahead = lookahead

    def timing(self, model: SwapModel, gap: Gap) -> Timing:
        return just_in_time(model, gap, delay=1, lookahead=self.lookahead)

    def describe(self) -> str:
        return f"proactive (lookahead {self.lookahead})"

    def options(self) -> PolicyOptions:
        return {"policy": self.name, "lookahead": self.lookahead}


class Window(SwapPolicy):
    """The out-of-core paper's schedule (Hayakawa and Narihira, section 3) over the variable
    sequence (every buffer each node touches, in EO order, with its bytes):

    - a swap-in is issued at the first node whose window (the variable sequence from that
      node's first variable on, up to `window_bytes`) reaches the use;
    - a gap whose next use is already in the window at the previous use is not swapped;
    - a swap-out is issued right after the last use and completes as late as possible: once
      `window_bytes` of the sequence have run since the use, or earlier when the budget needs
      its memory (completing earlier swap-outs as needed), never later than the swap-in.
    """

    name = "window"

    def __init__(self, window_bytes: int | None = None) -> None:
        if window_bytes is not None and window_bytes <= 0:
            raise UsageError(f"invalid --window-bytes {window_bytes}: must be > 0")
        self.window_bytes = window_bytes
        self._prefix: tuple[SwapModel, tuple[list[int], list[int]]] | None = None

    def window(self, model: SwapModel) -> int:
        """The window in bytes; by default the largest single working set."""
        if self.window_bytes is not None:
            return self.window_bytes
        if getattr(self, "_largest", (None,))[0] is not model:
            self._largest = (model, max((model.working_set(t) for t in range(model.n)), default=0))
        return self._largest[1]

    def _sums(self, model: SwapModel) -> list[int]:
        """Prefix sums of the variable sequence's bytes."""
        return self._prefixes(model)[0]

    def _prefixes(self, model: SwapModel) -> tuple[list[int], list[int]]:
        """(prefix sums, the prefix sum at each EO's first variable), cached per model."""
        if self._prefix is None or self._prefix[0] is not model:
            sums = [0]
            for _, _, b in model.entries:
                sums.append(sums[-1] + b)
            self._prefix = (model, (sums, [sums[model.entry_start[i]] for i in range(model.n)]))
        return self._prefix[1]

    def timing(self, model: SwapModel, gap: Gap) -> Timing:
        sums, starts = self._prefixes(model)
        w = self.window(model)
        p = model.entry_index(gap.before, gap.root)
        # first EO i whose window [start(i), ...] reaches entry p: sums[p+1] - sums[start(i)] <= w
        i = bisect.bisect_left(starts, sums[p + 1] - w)
        if gap.wrap:  # the sequence goes on into the next step
            if sums[-1] - sums[model.entry_start[gap.after]] + sums[p + 1] <= w:
                return Timing(model.n, 0)  # next step's use is in the window: stays resident
            return Timing(min(gap.after + 1, model.n), min(i, gap.before))
        release = gap.after + 1
        return Timing(release, max(min(i, gap.before), release))

    def finalize(self, model: SwapModel, timings: dict[Gap, Timing], profile: np.ndarray,
                 resident: int, target: int | None) -> dict[Gap, Timing]:
        sums = self._sums(model)
        w = self.window(model)
        prof = profile.copy()
        out = dict(timings)
        padded = {r: g.padded for r, g in model.groups.items()}
        for gap in sorted(timings, key=lambda g: (timings[g].release, g.root, g.index)):
            t = timings[gap]
            start = sums[model.entry_start[min(gap.after + 1, model.n)]] if gap.after + 1 < model.n else None
            release = t.release
            last_ok = (t.issue - 1) if not gap.wrap else model.n
            while release < last_ok and release < model.n and start is not None:
                if sums[model.entry_start[release]] - start >= w:
                    break  # the write has had a window's worth of work to overlap
                if target is not None and prof[release] + padded[gap.root] + resident > target:
                    break  # the budget needs the memory now
                prof[release] += padded[gap.root]
                release += 1
            out[gap] = Timing(release, t.issue)
        return out

    def describe(self) -> str:
        w = "largest working set" if self.window_bytes is None else format_bytes(self.window_bytes)
        return f"window ({w})"

    def options(self) -> PolicyOptions:
        return {"policy": self.name, "window_bytes": self.window_bytes}


SWAP_POLICIES = ("on-demand", "reduced", "proactive", "adaptive", "window")


def make_policy(name: str, lookahead: int = 1, window_bytes: int | None = None,
                swap_dir: str | None = None) -> SwapPolicy:
    """The policy called `name` (one of SWAP_POLICIES); `swap_dir`: the folder of the store a
    policy that prices transfers (adaptive) prices them at (None: the default folder)."""
    if name == "on-demand":
        return OnDemand()
    if name == "reduced":
        return Reduced()
    if name == "proactive":
        return Proactive(lookahead)
    if name == "adaptive":
        from onnxplan.swap.adaptive import (
            Adaptive,  # it simulates the swap-out writes of onnxplan.swap.insert
        )

        return Adaptive(swap_dir=swap_dir)
    if name == "window":
        return Window(window_bytes)
    raise UsageError(f"unknown swap policy {name!r}; known: none, auto, {', '.join(SWAP_POLICIES)}")
