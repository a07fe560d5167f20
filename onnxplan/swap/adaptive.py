"""The adaptive swap policy: reduced's gaps, each transfer given as much lead as the budget leaves.

Proactive prefetches a fixed count of EOs ahead. An EO is one node here, and many nodes are
short, so one EO of lead hides little, while every EO of lead holds the buffer in memory and
raises the floor. Adaptive chooses the gaps with on-demand timing (its floor is reduced's) and
then spends the memory the budget leaves free on lead, where the transfers would stall:

- a simulation of one step: the nodes run one after the other (seconds from the roofline of
  onnxplan.checkpoint.costs), and one I/O worker runs the transfers first in, first out at
  the swap store's measured bandwidth (onnxplan.swap.pricing), as the executor's swap runtime does (a write starts right after the last
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
from onnxplan.swap.policies import PolicyOptions, SwapPolicy, Timing, just_in_time
from onnxplan.swap.pricing import Transfer, io_stalls, store_bandwidth

__all__ = ["Adaptive", "simulate_stalls"]

MAX_MOVES = 4000


def simulate_stalls(model: SwapModel, timings: dict[Gap, Timing], writes: dict[Gap, bool],
                    seconds: np.ndarray, bandwidth: float) -> dict[tuple[Gap, str], float]:
    """Seconds each transfer stalls the step ((gap, "read" | "write") -> seconds, stalls only),
    the nodes taking `seconds` each in base EO order and one FIFO worker moving the bytes
    (onnxplan.swap.pricing.io_stalls: a write issued right after the last use before the gap,
    done at its swap-out; a read issued at its swap-in, done before its first reader)."""
    jobs: list[tuple[tuple[Gap, str], Transfer]] = []
    for gap in sorted(timings, key=_key):
        t, nbytes = timings[gap], model.groups[gap.root].nbytes
        if writes[gap]:
            jobs.append(((gap, "write"), Transfer(nbytes, gap.after + 1, t.release, write=True)))
        jobs.append(((gap, "read"), Transfer(nbytes, t.issue, gap.before)))
    jobs.sort(key=lambda job: job[1].issue)  # stable: by gap within a boundary
    stalls = io_stalls(seconds, [tr for _, tr in jobs], bandwidth)
    return {job: s for (job, _), s in zip(jobs, stalls) if s > 0}


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

    def __init__(self, bandwidth: float | None = None, swap_dir: str | None = None) -> None:
        self.bandwidth = bandwidth  # bytes/s of the swap store; None: onnxplan.swap.pricing.store_bandwidth(swap_dir)
        self.swap_dir = swap_dir

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
        bandwidth = self.bandwidth or store_bandwidth(self.swap_dir)
        out = dict(timings)
        blocked: set[tuple[Gap, str]] = set()
        for _ in range(MAX_MOVES):
            stalls = simulate_stalls(model, out, writes, seconds, bandwidth)
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

    def options(self) -> PolicyOptions:
        return {"policy": self.name}
