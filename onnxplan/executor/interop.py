"""Two nodes at once (inter-op concurrency): which nodes of a bound step may run together.

At 2+ compute threads most of a small model's step is nodes of 0.04-0.2 ms (a bias Add, a
Transpose, ReduceSum over the batch, one AdamW update a parameter) that are too small to cut
across threads at a profit (kernels/parallel.py: a hand-off costs ~0.03 ms). Two of them that do
not depend on each other can run at once instead: one on the calling thread, the other on a
kernel worker (parallel.run, so the calling thread runs both when no worker is free).

The rule, decided once when the executor binds (never per step), on the memory the plan gave:
a node touches the bytes of its inputs and scratch (read) and of its outputs and the state it
writes back (written), each an exact byte range of the arena or the state region. Node B may
run alongside an earlier node A (the pair runs before the nodes between them) when

- neither draws at random (the draws follow the plan's order);
- B's written ranges meet none of the ranges A or any node between A and B touches, and B's
  read ranges meet none of their written ranges (the same test with the roles swapped: A's
  writes meet none of B's ranges). Then no byte B reads or writes changes hands between them,
  so B computes the same bits earlier, and its output's bytes hold nothing live before it
  (a live buffer is touched by its producer or a reader between A and B, or it is disjoint from
  B's output in the plan as made);
- B is at most WINDOW nodes after A, and in mode "all" both touch PAIR_MIN_BYTES or more (a
  Python hand-off costs ~0.03 ms on the 2-core VM: reports/threads.md, session 12).

In mode "all" a pair runs through parallel.run: the calling thread claims A, a kernel worker B,
and the thread done first runs the unclaimed pieces of the other's own split (parallel._help),
so a node that cuts itself in pieces keeps both threads busy inside a pair too.

Two modes (ONNXPLAN_INTEROP, onnxplan.settings). "all" ("1"): any two nodes of PAIR_MIN_BYTES
or more, on the Python pool; on the 2-core VM the pairs found in the zoo's plans are few and
small (transformer b16: at most ~1.6 ms of a ~20 ms step could overlap even with free
hand-offs; at PAIR_MIN_BYTES, 18 pairs of GEMMs that split themselves anyway), and paired rounds
under load measured no gain (reports/threads.md, session 13). "products", the default: only two
bound matrix products pair, of any size, each pair one job on the GEMM pool with each product cut
as it is alone (kernels.matmul.ProductPair: the same bits): transformer b16's step 0.985x, mlp
b64's 0.98x (in-process A/B, session 28). More products would pair but for the plan: a linear
layer's input gradient is often placed on the bytes its weight gradient's input frees (the two
follow each other in the order), so the two must run in turn (GPT b16: 7 pairs; its ff layers'
gradients do not pair).

Nothing is allocated: both nodes work in their planned bytes, so the arena and its planned peak
are unchanged (the kernels allocate no tensor-sized memory: tests/test_temporaries.py). Each
node runs its own kernel on its own bytes: the same bits as the sequential step. Plans with
swaps or split pieces, wrapped kernels (verification), the arena check and a GPU stay sequential
(the executor never asks for pairs there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

__all__ = ["PAIR_MIN_BYTES", "WINDOW", "Touch", "pair_schedule", "touch"]

WINDOW = 8  # how far ahead a partner is looked for
PAIR_MIN_BYTES = 1 << 20  # nodes touching fewer bytes run alone (a hand-off costs more than they take)

Range = tuple[int, int]


@dataclass(frozen=True)
class Touch:
    """The byte ranges [lo, hi) of host memory one node reads and writes."""

    reads: tuple[Range, ...]
    writes: tuple[Range, ...]
    nbytes: int  # the bytes it touches, every range once (how large the node is)

    def conflicts(self, other: Touch) -> bool:
        """Whether either writes a byte the other reads or writes."""
        return _meets(self.writes, other.reads + other.writes) or _meets(other.writes, self.reads)


def _meets(a: Sequence[Range], b: Sequence[Range]) -> bool:
    return any(lo < hi2 and lo2 < hi for lo, hi in a for lo2, hi2 in b)


def _base_range(a: Any) -> Range | None:
    """The whole contiguous block `a` views (its bytes from its first to its last element)."""
    if not isinstance(a, np.ndarray) or a.size == 0:
        return None
    lo, hi = byte_bounds(a)
    return int(lo), int(hi)


def touch(inputs: Sequence[Any], outputs: Sequence[Any], scratch: Any,
          writeback: Sequence[tuple[Any, Any]]) -> Touch:
    """What a node touches: its inputs and scratch read (scratch also written), its outputs and
    the destinations of its write-backs written, the sources of its write-backs read."""
    reads = [_base_range(a) for a in inputs] + [_base_range(src) for _, src in writeback]
    writes = [_base_range(a) for a in outputs] + [_base_range(dst) for dst, _ in writeback]
    writes.append(_base_range(scratch))
    reads_, writes_ = tuple(r for r in reads if r), tuple(r for r in writes if r)
    return Touch(reads_, writes_, sum(hi - lo for lo, hi in set(reads_ + writes_)))


def pair_schedule(touches: Sequence[Touch], random: Sequence[bool], *, window: int = WINDOW,
                  least: int | None = None) -> list[tuple[int, ...]]:
    """The calls in order, as (i,) or (i, j) (j run alongside i, hoisted over the calls between
    them): greedy, each call paired with the first later one the module's rule allows; nodes
    that draw at random (`random`), or touch fewer than `least` bytes (PAIR_MIN_BYTES, read at
    call time), run alone. A caller pairing only some kinds of node marks the others random."""
    least = PAIR_MIN_BYTES if least is None else least
    n = len(touches)
    taken = [False] * n
    out: list[tuple[int, ...]] = []
    for i in range(n):
        if taken[i]:
            continue
        taken[i] = True
        j = _partner(touches, random, taken, i, window, least) if _movable(touches[i], random[i], least) else None
        if j is None:
            out.append((i,))
        else:
            taken[j] = True
            out.append((i, j))
    return out


def _movable(t: Touch, random: bool, least: int) -> bool:
    return not random and t.nbytes >= least


def _partner(touches: Sequence[Touch], random: Sequence[bool], taken: list[bool], i: int,
             window: int, least: int) -> int | None:
    """The first j after i (within the window, not yet scheduled) that may run alongside i."""
    for j in range(i + 1, min(len(touches), i + 1 + window)):
        if taken[j] or not _movable(touches[j], random[j], least):
            continue
        tj = touches[j]
        if not tj.conflicts(touches[i]) and not any(
                not taken[k] and tj.conflicts(touches[k]) for k in range(i + 1, j)):
            return j
    return None


def pair_runner(run: Callable[[Sequence[Callable[[], None]]], None],
                first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    """One call that runs `first` and `second` at once through `run` (parallel.run's claims)."""
    both = (first, second)
    return lambda: run(both)


def job_runner(together: Callable[[], bool], first: Callable[[], None],
               second: Callable[[], None]) -> Callable[[], None]:
    """One call that runs a pair as one job (`together()`: kernels.matmul.ProductPair), or, where
    the job cannot be had (it returns False), `first` then `second`."""
    def run() -> None:
        if not together():
            first()
            second()

    return run
