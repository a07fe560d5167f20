"""The adaptive swap policy: reduced's gaps, each transfer given as much lead as the budget leaves.

Proactive prefetches a fixed count of EOs ahead. An EO is one node here, and many nodes are
short, so one EO of lead hides little, while every EO of lead holds the buffer in memory and
raises the floor. Adaptive chooses the gaps with on-demand timing (its floor is reduced's) and
then spends the memory the budget leaves free on lead, where the transfers would stall:

- a simulation of one step: the nodes run one after the other (seconds from the roofline of
  onnxplan.checkpoint.costs), and one I/O worker runs the transfers first in, first out at
  STORE_BANDWIDTH, as the executor's swap runtime does (a write starts right after the last
  use before the gap and must be done at its swap-out; a read starts at its swap-in and must
  be done before its first reader; every transfer is done by the end of the step);
- the transfer that stalls the most gets more lead: a read is issued earlier, a write
  completes later, by as many EOs as the simulated compute needs to cover its stall, each EO
  only where the live bytes stay within the target;
- repeated until no transfer stalls, or none that stalls can get more lead.

Without a budget there is no free memory to spend: reduced's timings.
"""

from __future__ import annotations

import numpy as np

from onnxplan.checkpoint.costs import TimeModel
from onnxplan.swap.insert import decide_writes
from onnxplan.swap.model import Gap, SwapModel
from onnxplan.swap.policies import SwapPolicy, Timing, just_in_time

__all__ = ["STORE_BANDWIDTH", "Adaptive", "simulate_stalls"]

# bytes/s of the swap file with its page cache dropped (reads measured 130-500 MB/s on this
# project's machine, a shared virtual disk); low on purpose: a lead too long costs memory the
# budget has free anyway, a lead too short stalls the step
STORE_BANDWIDTH = 2.5e8
MAX_MOVES = 4000


def simulate_stalls(model: SwapModel, timings: dict[Gap, Timing], writes: dict[Gap, bool],
                    seconds: np.ndarray, bandwidth: float = STORE_BANDWIDTH) -> dict[tuple[Gap, str], float]:
    """Seconds each transfer stalls the step ((gap, "read" | "write") -> seconds, stalls only),
    the nodes taking `seconds` each in base EO order and one FIFO worker moving the bytes."""
    n = model.n
    reads_at: dict[int, list[Gap]] = {}
    read_waits: dict[int, list[Gap]] = {}
    writes_after: dict[int, list[Gap]] = {}
    write_waits: dict[int, list[Gap]] = {}
    for gap, t in timings.items():
        reads_at.setdefault(t.issue, []).append(gap)
        read_waits.setdefault(gap.before, []).append(gap)
        if writes[gap]:
            writes_after.setdefault(gap.after, []).append(gap)
            write_waits.setdefault(t.release, []).append(gap)
    ends: dict[tuple[Gap, str], float] = {}
    now = free = 0.0

    def put(job: tuple[Gap, str]) -> None:
        nonlocal free
        free = max(now, free) + model.groups[job[0].root].nbytes / bandwidth
        ends[job] = free

    stalls: dict[tuple[Gap, str], float] = {}

    def wait(job: tuple[Gap, str]) -> None:
        nonlocal now
        end = ends.get(job)
        if end is not None and end > now:
            stalls[job] = stalls.get(job, 0.0) + end - now
            now = end

    for gap in sorted(writes_after.get(-1, ()), key=_key):
        put((gap, "write"))
    for t in range(n + 1):
        for gap in sorted(write_waits.get(t, ()), key=_key):
            wait((gap, "write"))
        for gap in sorted(reads_at.get(t, ()), key=_key):
            put((gap, "read"))
        if t == n:
            for job in sorted(ends, key=ends.get):
                wait(job)
            break
        for gap in sorted(read_waits.get(t, ()), key=_key):
            wait((gap, "read"))
        now += seconds[t]
        for gap in sorted(writes_after.get(t, ()), key=_key):
            put((gap, "write"))
    return stalls


def _key(gap: Gap) -> tuple[str, int]:
    return (gap.root, gap.index)


def _absent(t: Timing, gap: Gap, n: int) -> int:
    return sum(hi - lo for lo, hi in t.absent(gap, n))


class Adaptive(SwapPolicy):
    """Reduced's gaps (on-demand timing, clean swap-outs write nothing); then each read is
    issued earlier and each write completed later where the simulated step stalls on it, as
    far as the target leaves memory free (see onnxplan.swap.adaptive)."""

    name = "adaptive"
    spends_slack = True

    def __init__(self, bandwidth: float = STORE_BANDWIDTH) -> None:
        self.bandwidth = bandwidth

    def timing(self, model: SwapModel, gap: Gap) -> Timing:
        return just_in_time(model, gap)

    def finalize(self, model: SwapModel, timings: dict[Gap, Timing], profile: np.ndarray,
                 resident: int, target: int | None) -> dict[Gap, Timing]:
        if target is None or not timings:
            return timings
        nodes = {nd.name: nd for nd in model.graph.nodes}
        times = TimeModel()
        seconds = np.array([times.node_seconds(model.graph, nodes[name]) for name in model.order])
        writes = {d.gap: d.write for d in decide_writes(model, list(timings), timings, self.clean_drops)}
        room = target - resident - profile  # free bytes at each base EO
        out = dict(timings)
        blocked: set[tuple[Gap, str]] = set()
        for _ in range(MAX_MOVES):
            stalls = simulate_stalls(model, out, writes, seconds, self.bandwidth)
            moved = False
            for job, stall in sorted(stalls.items(), key=lambda kv: (-kv[1], _key(kv[0][0]), kv[0][1])):
                if job in blocked:
                    continue
                if self._lead(model, out, job, stall, seconds, room):
                    moved = True
                    break
                blocked.add(job)
            if not moved:
                break
        return out

    def _lead(self, model: SwapModel, out: dict[Gap, Timing], job: tuple[Gap, str], stall: float,
              seconds: np.ndarray, room: np.ndarray) -> bool:
        """Give `job` more lead, EO by EO, until its stall is covered; False: not one EO."""
        gap, kind = job
        b = model.groups[gap.root].padded
        n = model.n
        t = out[gap]
        covered = 0.0
        while covered < stall and _absent(t, gap, n) > 1:
            eo = t.issue - 1 if kind == "read" else t.release
            if eo < 0 or eo >= n or room[eo] < b:
                break
            room[eo] -= b
            covered += seconds[eo]
            t = Timing(t.release, t.issue - 1) if kind == "read" else Timing(t.release + 1, t.issue)
        if t == out[gap]:
            return False
        out[gap] = t
        return True

    def options(self) -> dict:
        return {"policy": self.name}
