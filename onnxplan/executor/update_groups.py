"""Optimizer updates in groups: a run of consecutive update nodes shared out across the threads.

A plan may put many optimizer updates one after another (GPT b16's plan ends with its 38
AdamWUpdate nodes in a row). Each is too small to cut across threads at a profit (12-30 us
against a hand-off of ~10-30 us: kernels/parallel.py), but the run of them is not: like a
multi-tensor ("foreach") optimizer, the run goes to parallel.run as one task per node, and the
calling thread and the kernel workers claim the nodes one at a time, each running its node
whole, so the threads stay busy until the run is done with one hand-off for all of them.

The rule, decided once when the executor binds (never per step), on the memory the plan gave
(interop.touch: a node's read and written byte ranges of the arena and the state region): a
group is a run of two or more nodes that are consecutive in the plan's order, each an optimizer
update (a kernel declared `updates_state`), none drawing at random, no two of which conflict
(neither writes a byte the other reads or writes), touching GROUP_MIN_BYTES or more together.
Nothing moves across a node outside the group, and no byte changes hands inside it, so every
node computes the bits it computes in the plan's order whichever thread runs it and in whatever
order; nothing is allocated (each node works in its planned bytes: the arena and the planned peak
are unchanged). The executor asks for groups where nothing else runs beside the kernels (no swap,
split pieces, wrapped kernels, arena check or GPU) and runs them at 2+ compute threads only.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxplan.executor.interop import Touch

__all__ = ["GROUP_MIN_BYTES", "group_schedule"]

GROUP_MIN_BYTES = 1 << 20  # groups touching fewer bytes run node by node (a hand-off costs more)


def group_schedule(touches: Sequence[Touch], updates: Sequence[bool], random: Sequence[bool], *,
                   least: int | None = None) -> list[tuple[int, ...]]:
    """The calls in order, as (i,) or a group (i, i + 1, ..., k) of the module's rule; `least`:
    GROUP_MIN_BYTES (read at call time) where not given."""
    least = GROUP_MIN_BYTES if least is None else least
    out: list[tuple[int, ...]] = []
    i, n = 0, len(touches)
    while i < n:
        j = i + 1
        if updates[i] and not random[i]:
            while j < n and updates[j] and not random[j] and not any(
                    touches[j].conflicts(touches[k]) for k in range(i, j)):
                j += 1
        run = tuple(range(i, j))
        if len(run) > 1 and sum(touches[k].nbytes for k in run) >= least:
            out.append(run)
        else:
            out.extend((k,) for k in run)
        i = j
    return out
