"""Lifetime merge: one buffer per group of values merged by views, with EO lifetimes.

Analysis (no rewrite). For a given execution order:
  - values joined by aliases (read-only views "rv", modify views "mv") share one buffer;
  - NNTrainer's integrity rule is checked: a modify-view merge is legal only if no value of
    the target buffer is read after the merge point (read-only views always merge);
  - a buffer lives from the EO of its first writer to the EO of its last reader, inclusive;
    step inputs are live from EO 0 (the batch is in memory when the step starts) and step
    outputs (the loss) to the last EO;
  - persistent buffers (parameters, optimizer state, constants) are not in the arena: they
    are counted in `persistent_bytes`, once per buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxplan.errors import OnnxplanError
from onnxplan.ir.graph import StepGraph, ValueClass
from onnxplan.offsets.buffers import Buffer
from onnxplan.step_analysis import step_analysis

__all__ = ["SCRATCH_PREFIX", "IntegrityError", "LifetimeModel", "Lifetimes", "lifetime_model", "lifetimes"]


class IntegrityError(OnnxplanError):
    """A modify-view merge whose target is read after the merge point."""

    exit_code = 1


@dataclass(frozen=True)
class Lifetimes:
    buffers: tuple[Buffer, ...]  # transient buffers, placed in the arena
    persistent_bytes: int
    buffer_of: dict[str, str]  # value -> buffer name
    eo: dict[str, int]  # node -> EO


@dataclass(frozen=True)
class LifetimeModel:
    """What lifetimes() needs that does not depend on the order: computed once per graph,
    shared by every order tried on it (`lifetime_model(g)`)."""

    roots: dict[str, str]  # value -> buffer root
    touches: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]  # node, roots written, roots read
    buffers: tuple[tuple[str, int, str, tuple[str, ...]], ...]  # transient root, bytes, class, aliases
    persistent_bytes: int
    first_roots: tuple[str, ...]  # step inputs: live from EO 0
    last_roots: tuple[str, ...]  # step outputs: live to the last EO
    scratch: tuple[tuple[str, int], ...]  # node -> scratch bytes (> 0)
    reads: tuple[tuple[str, tuple[str, ...]], ...]  # node, values it reads
    merges: tuple[tuple[str, str, str, tuple[str, ...]], ...]  # mv: node, out, src, values to check


def lifetime_model(g: StepGraph) -> LifetimeModel:
    a = step_analysis(g)
    roots, members = a.roots, a.members
    touches = tuple((n.name, tuple(dict.fromkeys(roots[o] for o in n.outputs if o)),
                     tuple(dict.fromkeys(roots[i] for i in n.inputs if i))) for n in g.nodes)
    buffers, persistent = [], 0
    for r, vs in sorted(members.items()):
        vals = [g.values[v] for v in vs]
        size = max(v.nbytes for v in vals)
        if any(v.persistent for v in vals):
            persistent += size
            continue
        root = g.values[r]
        vclass = root.vclass.value
        if root.vclass == ValueClass.INPUT and len(vs) > 1:
            vclass = ValueClass.INPUT.value
        buffers.append((r, size, vclass, tuple(sorted(v for v in vs if v != r))))
    children: dict[str, list[str]] = {}
    for n in g.nodes:
        for o, (src, _k) in n.aliases.items():
            children.setdefault(src, []).append(o)
    merges = []
    for n in g.nodes:
        for out, (src, kind) in n.aliases.items():
            if kind == "mv":
                newer = _derived(children, out)  # values holding the new contents
                merges.append((n.name, out, src, tuple(v for v in members[roots[src]] if v not in newer)))
    return LifetimeModel(
        roots=roots, touches=touches, buffers=tuple(buffers), persistent_bytes=persistent,
        first_roots=tuple(roots[v] for v in g.inputs if v in roots),
        last_roots=tuple(roots[v] for v in g.outputs if v in roots),
        scratch=tuple(a.scratch.items()),
        reads=tuple((n.name, tuple(i for i in n.inputs if i)) for n in g.nodes),
        merges=tuple(merges),
    )


def lifetimes(g: StepGraph, order: list[str] | tuple[str, ...], model: LifetimeModel | None = None) -> Lifetimes:
    """Buffers with [first, last] EO spans for `order` (a topological order of g's nodes).

    `model`: lifetime_model(g), when several orders of the same graph are compared."""
    eo = {name: i for i, name in enumerate(order)}
    if len(eo) != len(g.nodes) or any(n.name not in eo for n in g.nodes):
        raise OnnxplanError("the order does not list every node of the graph exactly once")
    m = model if model is not None else lifetime_model(g)
    last_eo = len(order) - 1
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for name, writes, reads in m.touches:
        t = eo[name]
        for r in writes:
            f = first.get(r)
            if f is None or t < f:
                first[r] = t
            if last.get(r, -1) < t:
                last[r] = t
        for r in reads:
            if last.get(r, -1) < t:
                last[r] = t
    for r in m.first_roots:
        first[r] = 0
    for r in m.last_roots:
        last[r] = last_eo
    _check_integrity(m, eo)
    buffers = [Buffer(r, size, first[r], last.get(r, first[r]), vclass, aliases)
               for r, size, vclass, aliases in m.buffers if r in first]  # else never touched
    buffers.extend(Buffer(SCRATCH_PREFIX + n, nbytes, eo[n], eo[n], ValueClass.TEMPORARY.value)
                   for n, nbytes in m.scratch)
    return Lifetimes(tuple(buffers), m.persistent_bytes, dict(m.roots), eo)


SCRATCH_PREFIX = "scratch:"


def _check_integrity(m: LifetimeModel, eo: dict[str, int]) -> None:
    if not m.merges:
        return
    last_read: dict[str, int] = {}
    for name, ins in m.reads:
        t = eo[name]
        for i in ins:
            if last_read.get(i, -1) < t:
                last_read[i] = t
    for name, out, src, others in m.merges:
        t = eo[name]
        for v in others:
            if last_read.get(v, -1) > t:
                raise IntegrityError(
                    f"modify view '{out}' over '{src}' at EO {t} but '{v}' is read at EO "
                    f"{last_read[v]}: the order breaks the in-place merge"
                )


def _derived(children: dict[str, list[str]], out: str) -> set[str]:
    """`out` and every value aliased from it, transitively."""
    seen, todo = set(), [out]
    while todo:
        x = todo.pop()
        if x not in seen:
            seen.add(x)
            todo.extend(children.get(x, ()))
    return seen
