"""The order ILP on graphs too large to solve whole: re-order one window of EOs at a time.

OLLA's lifetime program (`orders/ilp.py`) has a variable per node per step of its
ASAP..ALAP range; a training step of thousands of nodes gives millions. Instead, keep a
valid order and re-solve the order of the `width` consecutive nodes around the EO where it
peaks, every other node fixed. Only buffers the window touches can move; a buffer touched
before the window (or a step input) is live when the window starts, one touched after it
(or a step output) is live when it ends, and a buffer live across the window untouched adds
the same bytes to each of its steps. The steps outside the window keep their live bytes
exactly, so a window whose sub-peak drops lowers that part of the profile and never raises
another: the order's peak never grows. A window is kept when it lowers the peak or the
number of EOs at the peak (a step of many similar layers peaks in each of them: one window
cannot lower the maximum, each can remove its share). Repeat around the peak until the time
runs out, or until every window at a peak EO is proven optimal (a local optimum: no window
can lower the peak alone).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from onnxplan.orders.memory_model import MemoryModel, buffer_spans, check_order, live_bytes_of_order

__all__ = ["WindowResult", "improve_by_windows", "sub_model"]


def sub_model(mm: MemoryModel, order: Sequence[str], start: int, stop: int) -> tuple[MemoryModel, int]:
    """The memory model of the nodes order[start:stop] with every other node fixed, and the
    bytes live across the whole window that no window node touches (a constant at each of
    its steps): global live bytes at window step t = sub-model live bytes at t + constant."""
    window = order[start:stop]
    inside = set(window)
    spans = buffer_spans(mm, order)
    touched = {b for n in window for b in (*mm.creates[n], *mm.reads[n])}
    across = 0
    for b, (lo, hi) in spans.items():
        if b in touched:
            continue
        if lo <= start and hi >= stop - 1:  # live at every step of the window
            across += mm.size[b]
        elif lo < stop and hi >= start:  # only an unread step input (live at EO 0) in a window at 0
            touched.add(b)
    inputs = frozenset(b for b in touched if spans[b][0] < start or b in mm.inputs)
    outputs = frozenset(b for b in touched if spans[b][1] >= stop or b in mm.outputs)
    sub = MemoryModel(
        nodes=tuple(window),
        preds={n: tuple(p for p in mm.preds[n] if p in inside) for n in window},
        creates={n: mm.creates[n] for n in window},
        reads={n: mm.reads[n] for n in window},
        size={b: mm.size[b] for b in touched},
        inputs=inputs,
        outputs=outputs,
    )
    return sub, across


@dataclass(frozen=True)
class WindowResult:
    order: tuple[str, ...]
    peak_bytes: int
    windows: int  # windows solved
    improved: int  # windows that lowered the peak
    local_optimum: bool  # every window at a peak EO solved to optimality without a gain
    note: str


def improve_by_windows(mm: MemoryModel, seed: Sequence[str], *, time_limit: float,
                       solve: Callable[..., tuple], width: int = 120,
                       window_seconds: float = 2.0) -> WindowResult:
    """Lower `seed`'s peak by re-solving windows of at most `width` nodes around its peak.

    `solve(sub_mm, sub_seed, time_limit=...)` is orders.ilp.solve_order (returns order,
    optimal, bound, note). Windows centred on each EO at the peak are tried in turn, then
    the same windows shifted by a third of their width; an improvement (a lower peak, or as
    high at fewer EOs) starts over at the new peak. A window too large for its time (solve
    keeps the seed and says so) is halved, and so are all windows once those at the peak
    are tried without an optimality proof.
    """
    deadline = time.perf_counter() + time_limit
    order = tuple(seed)
    check_order(mm, order)
    n = len(order)
    live = live_bytes_of_order(mm, order)
    peak = max(live, default=0)
    start_peak, windows, improved = peak, 0, 0
    width = max(2, min(width, n))
    done: set[tuple[int, int]] = set()  # windows proven not to lower the current peak
    local_optimum, unproven = n == 0, False
    while n and time.perf_counter() < deadline:
        candidates = []
        for c in (eo for eo, x in enumerate(live) if x == peak):
            for shift in (0, -width // 3, width // 3):
                a = min(max(0, c + shift - width // 2), n - width)
                if (a, a + width) not in done and (a, a + width) not in candidates:
                    candidates.append((a, a + width))
        if not candidates:
            if unproven and width > 16:  # windows at the peak too hard in their time: smaller ones
                width //= 2
                done.clear()
                unproven = False
                continue
            local_optimum = not unproven
            break
        a, b = candidates[0]
        sub, _ = sub_model(mm, order, a, b)
        remaining = deadline - time.perf_counter()
        sub_order, optimal, bound, note = solve(sub, order[a:b], time_limit=max(0.1, min(window_seconds, remaining)))
        windows += 1
        if bound is None and "too large" in note and width > 8:
            width //= 2
            done.clear()
            continue
        new = (*order[:a], *sub_order, *order[b:])
        new_live = live_bytes_of_order(mm, new)
        new_peak = max(new_live, default=0)
        if (new_peak, new_live.count(new_peak)) < (peak, live.count(peak)):
            order, live, peak = new, new_live, new_peak
            improved += 1
            done.clear()
            unproven = False
        elif optimal or bound is not None and bound >= max(live_bytes_of_order(sub, order[a:b]), default=0):
            done.add((a, b))
        elif time.perf_counter() >= deadline:
            break
        else:  # not proven within its slice of time: give it no second try this round
            done.add((a, b))
            unproven = True
    check_order(mm, order)
    why = ("local optimum: no window at the peak lowers it" if local_optimum else
           "time limit" if time.perf_counter() >= deadline else "windows at the peak not proven optimal in their time")
    note = (f"windowed: {windows} window(s) of <= {width} nodes around the peak, {improved} improved it "
            f"({start_peak} -> {peak} B); stopped at the {why}")
    return WindowResult(order, peak, windows, improved, local_optimum, note)
