"""The `greedy` order policy: memory-aware list scheduling (least net allocation first)."""

from __future__ import annotations

import heapq
import time

from onnxplan.ir.graph import StepGraph
from onnxplan.limits import DEFAULT_TIME_LIMIT
from onnxplan.orders.memory_model import MemoryModel, OrderResult, peak_of_order

__all__ = ["greedy_order", "greedy_policy"]


def greedy_order(mm: MemoryModel) -> tuple[str, ...]:
    """List scheduling: among ready nodes run the one whose run changes live bytes least.

    A node's net change = bytes it allocates (buffers it creates, and buffers fed from
    outside that it is the first to touch) - bytes it frees (buffers it is the last to
    touch, outputs excepted). Ties go to file order. Scores only ever fall as other nodes
    run, so a heap with stale entries skipped on pop keeps it O((n + touches) log n).
    """
    index = {n: i for i, n in enumerate(mm.nodes)}
    succs = mm.succs()
    waiting = {n: len(mm.preds[n]) for n in mm.nodes}
    touchers = mm.touchers()
    left = {b: len(ts) for b, ts in touchers.items()}
    live = set(mm.inputs)
    done: set[str] = set()
    touches = {n: (*mm.creates[n], *mm.reads[n]) for n in mm.nodes}

    def score(n: str) -> int:
        net = 0
        for b in touches[n]:
            if b not in live:
                net += mm.size[b]
            if left[b] == 1 and b not in mm.outputs:
                net -= mm.size[b]
        return net

    current: dict[str, int] = {}
    heap: list[tuple[int, int, str]] = []

    def push(n: str) -> None:
        current[n] = score(n)
        heapq.heappush(heap, (current[n], index[n], n))

    for n in mm.nodes:
        if waiting[n] == 0:
            push(n)
    order: list[str] = []
    while heap:
        s, _, n = heapq.heappop(heap)
        if n in done or current.get(n) != s:
            continue
        done.add(n)
        order.append(n)
        changed: set[str] = set()
        for b in touches[n]:
            left[b] -= 1
            became_live = b not in live
            live.add(b)
            if became_live or left[b] == 1:
                changed.update(t for t in touchers[b] if t not in done)
        for t in changed:
            if t in current:  # ready: its score fell
                push(t)
        for m in succs[n]:
            waiting[m] -= 1
            if waiting[m] == 0:
                push(m)
    if len(order) != len(mm.nodes):
        raise ValueError("the dependency graph has a cycle")
    return tuple(order)


def greedy_policy(graph: StepGraph, mm: MemoryModel, *, time_limit: float = DEFAULT_TIME_LIMIT) -> OrderResult:
    """Memory-aware list scheduling."""
    start = time.perf_counter()
    order = greedy_order(mm)
    return OrderResult("greedy", order, peak_of_order(mm, order), time.perf_counter() - start)
