"""What an execution-order policy sees: nodes, dependencies, the buffers each node touches."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from onnxplan.errors import ModelError
from onnxplan.ir.graph import StepGraph, ValueClass
from onnxplan.offsets.buffers import align
from onnxplan.passes.lifetimes import SCRATCH_PREFIX
from onnxplan.step_analysis import StepAnalysis, step_analysis

__all__ = [
    "MemoryModel",
    "OrderResult",
    "buffer_spans",
    "check_order",
    "is_valid_order",
    "live_bytes_of_order",
    "memory_model",
    "peak_of_order",
]


@dataclass(frozen=True)
class MemoryModel:
    """Nodes, their dependencies and the transient buffers each creates and reads.

    A buffer lives from the first node that touches it (creates or reads it) to the last,
    inclusive. Buffers in `inputs` (the step's fed data) live from EO 0 instead: the
    executor writes them before the first node runs. Buffers in `outputs` (the loss) live
    to the last EO. Persistent values (parameters, optimizer state, constants) are not
    buffers here: no order changes their bytes.
    """

    nodes: tuple[str, ...]  # file order: a valid topological order
    preds: dict[str, tuple[str, ...]]  # node -> nodes it must follow
    creates: dict[str, tuple[str, ...]]  # node -> buffers it writes first
    reads: dict[str, tuple[str, ...]]  # node -> buffers it reads (incl. in-place writes)
    size: dict[str, int]  # buffer -> bytes, aligned (kernel scratch: `scratch:NODE`)
    inputs: frozenset[str] = field(default_factory=frozenset)  # live from EO 0
    outputs: frozenset[str] = field(default_factory=frozenset)  # live to the last EO

    def touchers(self) -> dict[str, list[str]]:
        """Buffer -> the nodes that create or read it, in file order."""
        out: dict[str, list[str]] = {b: [] for b in self.size}
        for n in self.nodes:
            for b in self.creates[n]:
                out[b].append(n)
            for b in self.reads[n]:
                out[b].append(n)
        return out

    def creator(self) -> dict[str, str]:
        """Buffer -> the node that creates it (buffers fed from outside have none)."""
        return {b: n for n in self.nodes for b in self.creates[n]}

    def succs(self) -> dict[str, list[str]]:
        """Node -> the nodes that must follow it directly."""
        out: dict[str, list[str]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for p in self.preds[n]:
                out[p].append(n)
        return out


@dataclass(frozen=True)
class OrderResult:
    """What an order policy returns: the order, its peak of live transient bytes, cost."""

    policy: str
    order: tuple[str, ...]
    peak_bytes: int
    solve_seconds: float
    optimal: bool | None = None  # ilp: proven optimal
    gap: float | None = None  # ilp: (peak - proven bound) / peak
    notes: tuple[str, ...] = ()


def _dedupe(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def memory_model(graph: StepGraph, buffer_of: dict[str, str] | None = None) -> MemoryModel:
    """The memory model of `graph`; `buffer_of` maps a value to its buffer after merging.

    Bytes are counted as the plan counts them (passes/lifetimes, offsets.lower_bound): each
    buffer takes its size aligned up to offsets.ALIGNMENT, and a node whose kernel needs scratch
    creates a buffer `scratch:NODE` of that size (aligned) live at its EO only.

    Rules:
    - a node follows the producers of its inputs and its control dependencies (`after`);
    - a buffer's size is the largest of its values' sizes; zero-byte buffers are left out;
    - a buffer's creator is the first node, in file order, that writes one of its values;
      a later writer (an in-place op) reads it instead, and must follow the creator;
    - a later writer that changes the bytes (any but a read-only view, alias kind "rv") must
      also follow every reader of the buffer that precedes it in file order (write after
      read: NNTrainer's integrity rule, which the in-place pass already implies);
    - an optimizer-phase node that reads a parameter or optimizer state updates it in place:
      it must follow the other readers of that value that precede it in file order;
    - step inputs (graph.inputs) live from EO 0; other values without a producer (an
      accumulation buffer that `realize` did not drop) are created by their first reader;
    - the loss and the transient graph outputs live to the last EO.
    All added edges point forward in file order, so the file order stays valid.
    """
    names = [n.name for n in graph.nodes]
    if len(set(names)) != len(names):
        dup = next(x for x in names if names.count(x) > 1)
        raise ModelError(f"node name {dup!r} is used twice; execution orders need unique node names")
    a = step_analysis(graph)
    bmap = buffer_of or {}

    def buf(value: str) -> str | None:
        v = graph.values.get(value)
        if v is None or v.persistent:
            return None
        return bmap.get(value, value)

    size: dict[str, int] = {}
    for name, v in graph.values.items():
        b = buf(name)
        if b is not None:
            size[b] = max(size.get(b, 0), v.nbytes)
    size = {b: align(s) for b, s in size.items() if s > 0}
    preds, creates, reads = _touches(graph, a, buf, size)
    for n, nbytes in a.scratch.items():
        size[SCRATCH_PREFIX + n] = align(nbytes)
        creates[n].append(SCRATCH_PREFIX + n)
    inputs = {buf(i) for i in graph.inputs if i not in a.producer}
    outputs = {buf(o) for o in [*graph.outputs, graph.loss] if o}
    _check_file_order(a.index, preds)
    return MemoryModel(
        nodes=tuple(names),
        preds={n: _dedupe(p) for n, p in preds.items()},
        creates={n: _dedupe(c) for n, c in creates.items()},
        reads={n: _dedupe(r) for n, r in reads.items()},
        size=size,
        inputs=frozenset(b for b in inputs if b in size),
        outputs=frozenset(b for b in outputs if b in size),
    )


_Lists = dict[str, list[str]]


def _touches(graph: StepGraph, a: StepAnalysis, buf: Callable[[str], str | None],
             size: dict[str, int]) -> tuple[_Lists, _Lists, _Lists]:
    """(preds, creates, reads) per node, by the rules of memory_model."""
    preds: _Lists = {n.name: [] for n in graph.nodes}
    creates: _Lists = {n.name: [] for n in graph.nodes}
    reads: _Lists = {n.name: [] for n in graph.nodes}
    creator: dict[str, str] = {}
    readers_so_far: _Lists = {}
    param_readers: _Lists = {}
    for node in graph.nodes:
        n = node.name
        preds[n].extend(x for x in node.after if x != n)
        for inp in node.inputs:
            if not inp:
                continue
            if a.producer.get(inp, n) != n:
                preds[n].append(a.producer[inp])
            b = buf(inp)
            if b in size:
                reads[n].append(b)
        ins = {buf(i) for i in node.inputs if i}
        for out in node.outputs:
            b = buf(out) if out else None
            if b not in size:
                continue
            if b not in creator and b not in ins:
                creator[b] = n
                creates[n].append(b)
                continue
            # a later write into an existing buffer: in place, or a view of it
            if b not in ins:
                reads[n].append(b)
            if b in creator and creator[b] != n:
                preds[n].append(creator[b])
            alias = node.aliases.get(out)
            if alias is None or alias[1] != "rv":
                preds[n].extend(r for r in readers_so_far.get(b, []) if r != n)
        for b in reads[n]:
            readers_so_far.setdefault(b, []).append(n)
        # optimizer updates write parameters and optimizer state in place
        for inp in node.inputs:
            v = graph.values.get(inp) if inp else None
            if v is None or v.vclass not in (ValueClass.PARAMETER, ValueClass.OPTIMIZER_STATE):
                continue
            if node.phase == "optimizer":
                preds[n].extend(r for r in param_readers.get(inp, []) if r != n)
            else:
                param_readers.setdefault(inp, []).append(n)
    return preds, creates, reads


def _check_file_order(index: dict[str, int], preds: _Lists) -> None:
    """The added edges point forward, so only a bad file order fails here."""
    for n, ps in preds.items():
        unknown = [p for p in ps if p not in index]
        if unknown:
            raise ModelError(f"node {n!r} must run after {unknown[0]!r}, which is not in the graph")
        late = [p for p in ps if index[p] > index[n]]
        if late:
            raise ModelError(f"node {n!r} comes before its input's producer {late[0]!r}: "
                             "the graph's nodes are not in topological order")


def check_order(mm: MemoryModel, order: Sequence[str]) -> None:
    """Raise ValueError unless `order` runs every node once, after all its predecessors."""
    pos = {n: i for i, n in enumerate(order)}
    if len(pos) != len(order):
        raise ValueError("the order repeats a node")
    if len(order) != len(mm.nodes) or set(pos) != set(mm.nodes):
        missing = sorted(set(mm.nodes) - set(pos))[:3]
        extra = sorted(set(pos) - set(mm.nodes))[:3]
        raise ValueError(f"the order is not a permutation of the nodes (missing {missing}, unknown {extra})")
    for n in order:
        for p in mm.preds[n]:
            if pos[p] > pos[n]:
                raise ValueError(f"node {n!r} runs before its predecessor {p!r}")


def is_valid_order(mm: MemoryModel, order: Sequence[str]) -> bool:
    """True when `order` is a topological order of all the nodes of `mm`."""
    try:
        check_order(mm, order)
    except ValueError:
        return False
    return True


def buffer_spans(mm: MemoryModel, order: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Buffer -> (first EO, last EO) it is live under `order`."""
    last_eo = len(order) - 1
    spans: dict[str, tuple[int, int]] = {}
    for eo, n in enumerate(order):
        for b in (*mm.creates[n], *mm.reads[n]):
            lo, _ = spans.get(b, (eo, eo))
            spans[b] = (lo, eo)
    for b in mm.inputs:
        spans[b] = (0, spans.get(b, (0, 0))[1])
    for b in mm.outputs:
        if b in spans:
            spans[b] = (spans[b][0], last_eo)
    return spans


def live_bytes_of_order(mm: MemoryModel, order: Sequence[str]) -> list[int]:
    """Live transient bytes at each EO of `order` (buffers live creator..last reader), aligned,
    kernel scratch included."""
    deltas = [0] * (len(order) + 1)
    for b, (lo, hi) in buffer_spans(mm, order).items():
        deltas[lo] += mm.size[b]
        deltas[hi + 1] -= mm.size[b]
    out, live = [], 0
    for d in deltas[:-1]:
        live += d
        out.append(live)
    return out


def peak_of_order(mm: MemoryModel, order: Sequence[str]) -> int:
    """The max over EOs of live transient bytes under `order` (aligned, scratch included; 0
    for an empty graph)."""
    return max(live_bytes_of_order(mm, order), default=0)
