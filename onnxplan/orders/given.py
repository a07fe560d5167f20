"""The `given` order policy: the nodes in file order (ONNX Runtime's own order)."""

from __future__ import annotations

import time

from onnxplan.ir.graph import StepGraph
from onnxplan.limits import DEFAULT_TIME_LIMIT
from onnxplan.orders.memory_model import MemoryModel, OrderResult, peak_of_order

__all__ = ["given_order", "given_policy"]


def given_order(mm: MemoryModel) -> tuple[str, ...]:
    """The file order: valid by construction of the step graph."""
    return mm.nodes


def given_policy(graph: StepGraph, mm: MemoryModel, *, time_limit: float = DEFAULT_TIME_LIMIT) -> OrderResult:
    """Keep the file order."""
    start = time.perf_counter()
    order = given_order(mm)
    return OrderResult("given", order, peak_of_order(mm, order), time.perf_counter() - start)
