"""What a loaded step trains: its trained and frozen parameters, and for a forward .onnx what
onnxplan rewrote to make it trainable (inspect's and plan's "parameters")."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from onnxplan.ir.graph import StepGraph, ValueClass

__all__ = ["ParameterReport", "parameter_report"]


@dataclass(frozen=True)
class ParameterReport:
    trained: tuple[str, ...]
    frozen: tuple[str, ...]
    rewrites: tuple[str, ...]  # forward .onnx only: onnxplan.forward's notes
    rebatched: Any = None  # forward .onnx only: how a fixed batch was changed

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {**d, "trained": list(self.trained), "frozen": list(self.frozen), "rewrites": list(self.rewrites)}

    def lines(self, limit: int = 8) -> list[str]:
        """The report as text lines (names cut after `limit`)."""

        def names(items: tuple[str, ...]) -> str:
            shown = ", ".join(items[:limit])
            return shown + (f", ... (+{len(items) - limit})" if len(items) > limit else "")

        lines = [f"trained parameters ({len(self.trained)}): {names(self.trained)}",
                 f"frozen parameters ({len(self.frozen)}): {names(self.frozen) or '-'}"]
        return lines + [f"forward model: {note}" for note in self.rewrites]


def parameter_report(graph: StepGraph) -> ParameterReport:
    """The parameters of `graph` (those no node produces), trained or frozen, and its source's rewrites."""
    produced = {o for n in graph.nodes for o in n.outputs}
    params = [v for v in graph.values.values() if v.vclass == ValueClass.PARAMETER and v.name not in produced]
    return ParameterReport(tuple(v.name for v in params if v.trainable), tuple(v.name for v in params if not v.trainable),
                           tuple(graph.source.get("rewrites", [])), graph.source.get("rebatched"))
