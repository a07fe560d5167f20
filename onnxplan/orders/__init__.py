"""Execution-order (EO) policies chosen by name: given, nntrainer, greedy, ilp."""

from __future__ import annotations

from collections.abc import Callable

from onnxplan.errors import UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.limits import DEFAULT_TIME_LIMIT
from onnxplan.orders.given import given_policy
from onnxplan.orders.greedy import greedy_policy
from onnxplan.orders.ilp import ilp_policy
from onnxplan.orders.memory_model import (
    MemoryModel,
    OrderResult,
    check_order,
    is_valid_order,
    live_bytes_of_order,
    memory_model,
    peak_of_order,
)
from onnxplan.orders.nntrainer import nntrainer_policy

__all__ = [
    "ORDERS",
    "MemoryModel",
    "OrderResult",
    "check_order",
    "is_valid_order",
    "live_bytes_of_order",
    "memory_model",
    "order_nodes",
    "order_policy",
    "peak_of_order",
]

OrderPolicy = Callable[..., OrderResult]  # (graph, memory model, *, time_limit) -> result
ORDERS: dict[str, OrderPolicy] = {
    "given": given_policy,
    "nntrainer": nntrainer_policy,
    "greedy": greedy_policy,
    "ilp": ilp_policy,
}


def order_nodes(graph: StepGraph, policy: str, *, buffer_of: dict[str, str] | None = None,
                time_limit: float = DEFAULT_TIME_LIMIT) -> OrderResult:
    """Order the nodes of `graph` with the named policy; the result is checked valid."""
    return order_policy(graph, memory_model(graph, buffer_of), policy, time_limit=time_limit)


def order_policy(graph: StepGraph, mm: MemoryModel, policy: str, *, time_limit: float = DEFAULT_TIME_LIMIT) -> OrderResult:
    """Order with the named policy on a memory model already built; the result is checked valid."""
    if policy not in ORDERS:
        raise UsageError(f"unknown execution order {policy!r}; known: {', '.join(ORDERS)}")
    result = ORDERS[policy](graph, mm, time_limit=time_limit)
    check_order(mm, result.order)
    return result
