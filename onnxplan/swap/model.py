"""What swap planning sees: buffer groups, the EOs that touch them, and the gaps between touches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxplan.ir.graph import StepGraph, ValueClass
from onnxplan.offsets.buffers import align
from onnxplan.passes.lifetimes import Lifetimes
from onnxplan.step_analysis import StepAnalysis, step_analysis

__all__ = ["SWAPPABLE_PERSISTENT", "SWAP_MIN_BYTES", "Gap", "Group", "SwapModel", "swap_model"]

SWAP_MIN_BYTES = 1024  # smaller buffers stay in memory: a transfer costs more than it saves
SWAPPABLE_PERSISTENT = frozenset({ValueClass.PARAMETER, ValueClass.OPTIMIZER_STATE})


@dataclass(frozen=True)
class Group:
    """One buffer (an alias group of values) as swap planning sees it, in base EOs.

    `touches` are the EOs of the nodes that read or write one of its values (-1: a step
    input, written before EO 0); `writes` the touches that change its bytes (a read-only
    view does not). A transient group lives [first, last]; a persistent one (parameters,
    optimizer state) is resident all step unless it is evicted, when its home between
    steps becomes the swap store.
    """

    root: str
    members: tuple[str, ...]
    nbytes: int
    vclass: str
    persistent: bool
    touches: tuple[int, ...]
    writes: frozenset[int]
    first: int
    last: int
    why_not: str = ""  # empty: swappable

    @property
    def padded(self) -> int:
        return align(self.nbytes)

    @property
    def swappable(self) -> bool:
        return not self.why_not


@dataclass(frozen=True)
class Gap:
    """The idle time of a group between two touches: after EO `after`, before EO `before`.

    A persistent group also has a `wrap` gap from its last touch to its first one of the
    next step: evicting it makes the swap store its home between steps."""

    root: str
    index: int  # i: between touches[i] and touches[i + 1]; -1 for the wrap gap
    after: int
    before: int

    @property
    def wrap(self) -> bool:
        return self.index < 0

    @property
    def length(self) -> int:
        """Compute EOs strictly inside the gap (for a wrap gap: inside the step)."""
        return self.before - self.after - 1 if not self.wrap else -1


@dataclass
class SwapModel:
    """The base (swap-free) order of a step, its groups, and the live bytes at each EO."""

    graph: StepGraph
    order: tuple[str, ...]
    groups: dict[str, Group]
    base_profile: np.ndarray  # aligned transient bytes live at each base EO (scratch included)
    resident_bytes: int  # persistent bytes while nothing is evicted
    entries: list[tuple[int, str, int]]  # variable sequence: (EO, group root, aligned bytes)
    entry_start: list[int]  # index of each EO's first entry (len n + 1)

    @property
    def n(self) -> int:
        return len(self.order)

    def gaps(self, root: str) -> list[Gap]:
        """Every gap of a group, in time order; a persistent group's wrap gap last."""
        g = self.groups[root]
        t = g.touches
        out = [Gap(root, i, t[i], t[i + 1]) for i in range(len(t) - 1)]
        if g.persistent and t:
            out.append(Gap(root, -1, t[-1], t[0]))
        return out

    def entry_index(self, eo: int, root: str) -> int:
        """Position of (eo, root) in the variable sequence."""
        for k in range(self.entry_start[eo], self.entry_start[eo + 1]):
            if self.entries[k][1] == root:
                return k
        raise KeyError((eo, root))

    def working_set(self, eo: int) -> int:
        """Aligned bytes the node at `eo` touches (its single working set)."""
        return sum(b for _, _, b in self.entries[self.entry_start[eo]:self.entry_start[eo + 1]])


def swap_model(g: StepGraph, order: tuple[str, ...] | list[str], lt: Lifetimes,
               min_bytes: int = SWAP_MIN_BYTES) -> SwapModel:
    """The groups of `g` under `order` (swap-free), with lifetimes `lt` from the same order."""
    order = tuple(order)
    n = len(order)
    a = step_analysis(g)
    roots, members, nodes = a.roots, a.members, a.nodes
    touches: dict[str, set[int]] = {}
    writes: dict[str, set[int]] = {}
    entries: list[tuple[int, str, int]] = []
    entry_start = []
    for t, name in enumerate(order):
        node = nodes[name]
        entry_start.append(len(entries))
        seen: set[str] = set()
        for v in [*node.inputs, *node.outputs]:
            if v and g.values[v].nbytes and roots[v] not in seen:
                seen.add(roots[v])
                entries.append((t, roots[v], align(_group_bytes(g, members[roots[v]]))))
        for i in node.inputs:
            if i:
                touches.setdefault(roots[i], set()).add(t)
        for o in node.outputs:
            if o:
                r = roots[o]
                touches.setdefault(r, set()).add(t)
                if node.aliases.get(o, ("", ""))[1] != "rv":
                    writes.setdefault(r, set()).add(t)
    entry_start.append(len(entries))
    for v in g.inputs:
        if v in roots:
            touches.setdefault(roots[v], set()).add(-1)
            writes.setdefault(roots[v], set()).add(-1)

    used = a.consumers.keys() | a.producer.keys()
    spans = {b.name: b for b in lt.buffers}
    outputs = {roots[o] for o in g.outputs if o in roots}
    blocked = _state_copies(a)
    groups: dict[str, Group] = {}
    for r, vs in members.items():
        if r not in touches:
            continue
        vals = [g.values[v] for v in vs]
        persistent = any(v.persistent for v in vals)
        nbytes = _group_bytes(g, vs)
        if persistent:
            first, last = 0, n - 1
        elif r in spans:
            first, last = spans[r].first, spans[r].last
        else:
            continue
        why = ""
        if nbytes < max(min_bytes, 1):
            why = f"smaller than {min_bytes} B"
        elif len({v.nbytes for v in vals if v.name in used}) > 1:
            why = "values of different sizes share the buffer"
        elif persistent and not all(v.vclass in SWAPPABLE_PERSISTENT for v in vals):
            why = "constant"
        elif persistent and r in blocked:
            why = "state copied back after the step (no in-place update)"
        elif not persistent and r in outputs:
            why = "a step output"
        elif not persistent and len(touches[r]) < 2:
            why = "used once"
        root_class = g.values[r].vclass.value
        groups[r] = Group(r, tuple(sorted(vs)), nbytes, root_class, persistent,
                          tuple(sorted(touches[r])), frozenset(writes.get(r, ())), first, last, why)

    profile = np.zeros(n, dtype=np.int64)
    for b in lt.buffers:
        if b.nbytes:
            profile[b.first:b.last + 1] += b.padded
    return SwapModel(g, order, groups, profile, lt.persistent_bytes, entries, entry_start)


def _group_bytes(g: StepGraph, vs: tuple[str, ...] | list[str]) -> int:
    return max(g.values[v].nbytes for v in vs)


def _state_copies(a: StepAnalysis) -> set[str]:
    """Persistent groups updated by a node into another buffer (copied back after the step):
    the executor owns those copies, so they stay resident."""
    return {a.roots[v] for u in a.state_updates if not a.in_place(u) for v in (u.state, u.updated)}
