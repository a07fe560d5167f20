"""What to swap: greedy on bytes x idle span among the gaps that cover the peak EO."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnxplan.swap.model import Gap, SwapModel
from onnxplan.swap.policies import SwapPolicy, Timing

__all__ = ["Selection", "Unit", "select_all", "select_greedy"]


@dataclass(frozen=True)
class Unit:
    """What the greedy takes in one move: one gap, or a whole buffer (per-buffer policies).
    Taking an inner gap of a persistent value takes its wrap gap too (it is evicted)."""

    root: str
    gaps: tuple[Gap, ...]
    ranges: tuple[tuple[int, int], ...]  # base EOs it frees, [lo, hi)
    score: int  # bytes x idle EOs


@dataclass
class Selection:
    """The chosen gaps with their timings, and the live bytes they leave at each base EO."""

    model: SwapModel
    policy: SwapPolicy
    timings: dict[Gap, Timing]  # every candidate gap's timing
    chosen: dict[str, set[Gap]] = field(default_factory=dict)
    profile: np.ndarray = field(init=False)  # transient + evicted-persistent bytes per base EO
    resident: int = 0  # persistent bytes still outside the arena
    stuck: bool = False  # the peak EO had nothing left to swap

    def __post_init__(self) -> None:
        self.profile = self.model.base_profile.copy()
        self.resident = self.model.resident_bytes
        self._contrib: dict[str, np.ndarray] = {}

    @property
    def estimate(self) -> int:
        """Live-bytes estimate of the peak (persistent resident + most bytes live at an EO)."""
        return int(self.profile.max(initial=0)) + self.resident

    @property
    def peak_eo(self) -> int:
        return int(np.argmax(self.profile)) if len(self.profile) else 0

    def gaps(self) -> list[Gap]:
        return [g for r in sorted(self.chosen) for g in sorted(self.chosen[r], key=_time_key)]

    def take(self, unit: Unit) -> None:
        group = self.model.groups[unit.root]
        chosen = self.chosen.setdefault(unit.root, set())
        evicting = group.persistent and not any(g.wrap for g in chosen)
        chosen.update(unit.gaps)
        old = self._contrib.get(unit.root)
        if old is None:
            old = np.zeros(self.model.n, dtype=np.int64)
            if not group.persistent:
                old[group.first:group.last + 1] = group.padded
        new = self._contribution(unit.root)
        self.profile += new - old
        self._contrib[unit.root] = new
        if evicting:
            self.resident -= group.nbytes

    def _contribution(self, root: str) -> np.ndarray:
        group = self.model.groups[root]
        n = self.model.n
        c = np.zeros(n, dtype=np.int64)
        if group.persistent:
            c[:] = group.padded
        else:
            c[group.first:group.last + 1] = group.padded
        for gap in self.chosen[root]:
            for lo, hi in self.timings[gap].absent(gap, n):
                c[lo:hi] = 0
        return c


def _time_key(gap: Gap) -> tuple[int, int]:
    return (1, 0) if gap.wrap else (0, gap.index)


def _unit(root: str, nbytes: int, gaps: list[Gap], timings: dict[Gap, Timing], n: int) -> Unit:
    ranges = tuple(r for g in gaps for r in timings[g].absent(g, n))
    return Unit(root, tuple(gaps), ranges, nbytes * sum(hi - lo for lo, hi in ranges))


def _units(model: SwapModel, policy: SwapPolicy, timings: dict[Gap, Timing]) -> list[Unit]:
    units = []
    n = model.n
    for root, group in sorted(model.groups.items()):
        if not group.swappable:
            continue
        gaps = model.gaps(root)
        for gap in gaps:
            timings[gap] = policy.timing(model, gap)
        wrap = [g for g in gaps if g.wrap]
        if policy.per_buffer:
            u = _unit(root, group.nbytes, [g for g in gaps if policy.round_trips or timings[g].absent(g, n)],
                      timings, n)
            if u.gaps and (u.ranges or policy.round_trips):
                units.append(u)
            continue
        for gap in gaps:
            if not timings[gap].absent(gap, n):
                continue
            gs = [gap, *wrap] if group.persistent and not gap.wrap else [gap]
            units.append(_unit(root, group.nbytes, gs, timings, n))
    units.sort(key=lambda u: (-u.score, u.root, u.gaps[0].index))
    return units


def select_all(model: SwapModel, policy: SwapPolicy) -> Selection:
    """Swap every gap the policy would swap (no budget: the least memory the policy reaches)."""
    sel = Selection(model, policy, {})
    for u in _units(model, policy, sel.timings):
        sel.take(u)
    return sel


def select_greedy(model: SwapModel, policy: SwapPolicy, target: int,
                  sel: Selection | None = None) -> Selection:
    """Take units until the live-bytes estimate is at most `target`: at each move, the unit
    with the most bytes x idle EOs among those that free the current peak EO. Continues a
    previous selection when given (re-planning with a tighter target)."""
    if sel is None:
        sel = Selection(model, policy, {})
    units = _units(model, policy, sel.timings)
    taken = {(u.root, u.gaps) for u in units
             if all(g in sel.chosen.get(u.root, ()) for g in u.gaps)}
    while sel.estimate > target:
        peak = sel.peak_eo
        best = None
        for u in units:
            if (u.root, u.gaps) in taken:
                continue
            have = sel.chosen.get(u.root, set())
            if any(lo <= peak < hi for g in u.gaps if g not in have
                   for lo, hi in sel.timings[g].absent(g, model.n)):
                best = u
                break  # units are sorted by score
        if best is None:
            sel.stuck = True
            break
        taken.add((best.root, best.gaps))
        sel.take(best)
    return sel
