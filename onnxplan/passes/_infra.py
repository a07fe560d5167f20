"""Pass infrastructure: a pass is a graph rewrite with what it requires of the graph before it and
what it ensures after (onnx-ir's contract); it returns PassResult(graph, modified, notes).

A pipeline is a list of names. The table of the passes those names can stand for is explicit
(onnxplan.pipeline lists every pass of the step); `run_passes` checks, before running anything,
that each pass's requirements are ensured by the passes before it (or by the passes that made the
graph: StepGraph.ensured), and refuses the pipeline with one line otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from onnxplan.errors import OnnxplanError, UsageError
from onnxplan.ir.graph import StepGraph

__all__ = ["Pass", "PassError", "PassFamily", "PassResult", "PassTable", "run_passes"]


@dataclass
class PassResult:
    """What a pass returns: the (possibly new) graph, whether it changed, what it did."""

    graph: StepGraph
    modified: bool
    notes: list[str] = field(default_factory=list)


class PassError(OnnxplanError):
    """A pass failed; the message names the passes that ran before it."""

    exit_code = 1


PassFn = Callable[[StepGraph], PassResult]


@dataclass(frozen=True)
class Pass:
    """A rewrite named `name` in pipelines. `requires`: properties the graph must have before it
    (ensured by an earlier pass); `ensures`: properties it has after."""

    name: str
    fn: PassFn
    requires: tuple[str, ...] = ()
    ensures: tuple[str, ...] = ()


@dataclass(frozen=True)
class PassFamily:
    """A pass that takes an argument: the pipeline name "NAME:ARG" runs make(ARG) (e.g.
    "recompute:<schedule>"), so a plan's pass list replays the same rewrite."""

    name: str
    make: Callable[[str], PassFn]
    requires: tuple[str, ...] = ()
    ensures: tuple[str, ...] = ()


@dataclass(frozen=True)
class PassTable:
    """The passes a pipeline may name, by name."""

    passes: dict[str, Pass]
    families: dict[str, PassFamily]

    @classmethod
    def of(cls, entries: Iterable[Pass | PassFamily]) -> PassTable:
        passes: dict[str, Pass] = {}
        families: dict[str, PassFamily] = {}
        for e in entries:
            if e.name in passes or e.name in families:
                raise ValueError(f"pass {e.name!r} listed twice")
            if isinstance(e, Pass):
                passes[e.name] = e
            else:
                families[e.name] = e
        return cls(passes, families)

    def with_passes(self, *extra: Pass | PassFamily) -> PassTable:
        """This table and `extra` (tests plant passes this way)."""
        return PassTable.of([*self.passes.values(), *self.families.values(), *extra])

    def find(self, name: str) -> Pass | None:
        """The pass a pipeline name stands for ("NAME" or "NAME:ARG"), or None."""
        if name in self.passes:
            return self.passes[name]
        base, sep, arg = name.partition(":")
        fam = self.families.get(base) if sep else None
        return None if fam is None else Pass(name, fam.make(arg), fam.requires, fam.ensures)

    def names(self) -> list[str]:
        return sorted([*self.passes, *(f"{f}:<arg>" for f in self.families)])


def run_passes(graph: StepGraph, names: list[str],
               table: PassTable) -> tuple[StepGraph, list[tuple[str, PassResult]]]:
    """Run the named passes in order; an unknown pass or an unmet requirement is refused before
    any runs (UsageError, one line); a failure says which passes ran before it."""
    found = [table.find(n) for n in names]
    unknown = [n for n, p in zip(names, found) if p is None]
    if unknown:
        raise UsageError(f"unknown pass {unknown[0][:60]!r}; known: {', '.join(table.names())}")
    steps = [p for p in found if p is not None]
    have = set(graph.ensured)
    for k, p in enumerate(steps):
        missing = [r for r in p.requires if r not in have]
        if missing:
            before = ", ".join(names[:k]) or "none"
            raise UsageError(f"pass {p.name[:60]!r} requires {missing[0]!r}, which no pass before it ensures "
                             f"(passes before it: {before})")
        have.update(p.ensures)
    done: list[tuple[str, PassResult]] = []
    for p in steps:
        try:
            result = p.fn(graph)
        except OnnxplanError:
            raise
        except Exception as exc:  # a bug in a pass: say where the pipeline was
            ran = ", ".join(n for n, _ in done) or "none"
            raise PassError(f"pass '{p.name}' failed ({type(exc).__name__}: {exc}); "
                            f"passes run before it: {ran}") from exc
        graph = _ensured(result.graph, p.ensures, fresh=result.graph is not graph)
        done.append((p.name, PassResult(graph, result.modified, result.notes)))
    return graph, done


def _ensured(g: StepGraph, props: tuple[str, ...], fresh: bool) -> StepGraph:
    """`g` marked with `props`: in place when the pass made it (`fresh`); a graph a pass returned
    unchanged (its input) is not marked in place: a shallow copy shares its nodes and values
    (and their analysis)."""
    new = tuple(p for p in props if p not in g.ensured)
    if not new:
        return g
    if fresh:
        g.ensured = (*g.ensured, *new)
        return g
    out = dataclasses.replace(g, ensured=(*g.ensured, *new))
    if "_analysis" in g.__dict__:
        out.__dict__["_analysis"] = g.__dict__["_analysis"]
    return out
