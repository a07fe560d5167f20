"""Fresh, unused value and node names inside one model."""

from __future__ import annotations

import onnx

__all__ = ["NameSource"]


class NameSource:
    """Hands out names not yet used by any value, initializer or node of `graph`."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.used = {t.name for t in graph.initializer} | {v.name for v in graph.input}
        self.used |= {v.name for v in graph.output}
        for n in graph.node:
            self.used.update(n.input)
            self.used.update(n.output)
            self.used.add(n.name)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name
