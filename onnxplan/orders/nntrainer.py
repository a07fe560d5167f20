"""The `nntrainer` order policy: NNTrainer's Algorithm 1 (F, then per layer CG, CD, AG) on a DAG."""

from __future__ import annotations

import heapq
import time

from onnxplan.ir.analysis import forward_of_gradient
from onnxplan.ir.graph import Node, StepGraph, ValueClass
from onnxplan.limits import DEFAULT_TIME_LIMIT
from onnxplan.orders.memory_model import MemoryModel, OrderResult, peak_of_order
from onnxplan.step_analysis import step_analysis

__all__ = ["Stage", "assign_layers", "nntrainer_order", "nntrainer_policy"]

class Stage:
    """Within-layer ranks: forward, compute gradient, compute derivative, apply gradient."""

    F, CG, CD, AG, LAST = 0, 1, 2, 3, 4


def _named_layer(name: str, fwd_index: dict[str, int]) -> int | None:
    """The forward node a gradient node is named after, if any."""
    forward = forward_of_gradient(name, fwd_index)
    return None if forward is None else fwd_index[forward]


def _single_param(node: Node, graph: StepGraph) -> str | None:
    """The one parameter an optimizer node updates, or None (an un-split optimizer)."""
    params = [i for i in dict.fromkeys(node.inputs)
              if i and i in graph.values and graph.values[i].vclass == ValueClass.PARAMETER]
    return params[0] if len(params) == 1 else None


def assign_layers(graph: StepGraph) -> dict[str, tuple[int, int]]:
    """Node -> (layer, stage). A layer is the index of a forward node (NNTrainer's layer).

    Forward nodes are their own layers (stage F). A backward node goes to the forward
    node it is named after (`<fwd>_Grad/...`); else to the layer of the parameter whose
    gradient it makes (`<param>_grad`, or a gradient the optimizer reads); else to the
    layer of a parameter it reads; else to the latest-processed layer of its backward
    inputs; else to its first consumer's layer; else to the layer of the activations it
    reads. A parameter's layer is its first forward reader. Stage CG when the
    node leads, within its layer, to a parameter gradient; CD otherwise. A per-parameter
    optimizer update is the AG of the layer that first reads its parameter. An un-split
    optimizer node, and anything unrelated to a layer, gets layer -1 and stage LAST.
    """
    forward = [n for n in graph.nodes if n.phase == "forward"]
    fwd_index = {n.name: i for i, n in enumerate(forward)}
    a = step_analysis(graph)
    producer, consumers = a.producer, a.consumers
    param_layer: dict[str, int] = {}
    for i, n in enumerate(forward):
        for inp in n.inputs:
            v = graph.values.get(inp)
            if v is not None and v.vclass == ValueClass.PARAMETER:
                param_layer.setdefault(inp, i)

    grad_of = {f"{p}_grad": p for p in param_layer}  # ONNX Runtime's gradient names
    grad_of.update(zip(graph.optimizer.get("grads", []), graph.optimizer.get("params", [])))
    layer: dict[str, int | None] = {n.name: fwd_index[n.name] for n in forward}
    rest = [n for n in graph.nodes if n.phase != "forward"]
    for n in rest:
        layer[n.name] = _named_layer(n.name, fwd_index) if n.phase == "backward" else None
    for n in rest:  # file order is topological: producers are settled first
        if layer[n.name] is not None:
            continue
        if n.phase == "optimizer":
            p = _single_param(n, graph)
            layer[n.name] = param_layer.get(p) if p is not None else -1
            if layer[n.name] is not None:
                continue
        made = [param_layer[grad_of[o]] for o in n.outputs if grad_of.get(o) in param_layer]
        params = [param_layer[i] for i in n.inputs if i in param_layer]
        fed_by = [layer[producer[i]] for i in n.inputs
                  if i in producer and a.nodes[producer[i]].phase != "forward"]
        back = [x for x in fed_by if x is not None and x >= 0]
        for found in (made, params, back):
            if found:
                layer[n.name] = min(found)
                break
    for n in reversed(rest):  # then by consumers, latest first
        if layer[n.name] is not None:
            continue
        read_by = [layer[c] for o in n.outputs if o for c in consumers.get(o, ())]
        users = [x for x in read_by if x is not None and x >= 0]
        fed_by = [layer[producer[i]] for i in n.inputs if i in producer]
        acts = [x for x in fed_by if x is not None and x >= 0]
        layer[n.name] = max(users) if users else max(acts) if acts else -1
    known = {name: x for name, x in layer.items() if x is not None}  # every node has its layer by now

    stage: dict[str, int] = {n.name: Stage.F for n in forward}
    cg: set[str] = set()
    for n in reversed(rest):
        if n.phase == "optimizer":
            stage[n.name] = Stage.AG if known[n.name] >= 0 else Stage.LAST
            continue
        grads = any(graph.values[o].vclass == ValueClass.GRADIENT
                    for o in n.outputs if o in graph.values)
        feeds = any(c in cg and known[c] == known[n.name]
                    for o in n.outputs if o for c in consumers.get(o, ()))
        if grads or feeds:
            cg.add(n.name)
        stage[n.name] = Stage.LAST if known[n.name] < 0 else Stage.CG if n.name in cg else Stage.CD
    return {name: (known[name], stage[name]) for name in known}


def nntrainer_order(graph: StepGraph, mm: MemoryModel) -> tuple[str, ...]:
    """Forward in file order; then layers in reverse: CG, CD, AG; un-split optimizer last.

    The wished-for position of each node is a priority key; a node inherits the most
    urgent key of the nodes that need it, and a list scheduler runs the most urgent ready
    node. When the wish respects the dependencies this is exactly the wished order; when
    it does not, the needed node is pulled forward (the topological fix-up).
    """
    index = {n: i for i, n in enumerate(mm.nodes)}
    layers = assign_layers(graph)
    own: dict[str, tuple[int, int, int, int]] = {}
    for n in mm.nodes:
        lay, st = layers[n]
        if st == Stage.F:
            own[n] = (0, lay, 0, index[n])
        elif st == Stage.LAST:
            own[n] = (2, 0, 0, index[n])
        else:
            own[n] = (1, -lay, st, index[n])
    succs = mm.succs()
    key = dict(own)
    for n in reversed(mm.nodes):
        for s in succs[n]:
            key[n] = min(key[n], key[s])
    waiting = {n: len(mm.preds[n]) for n in mm.nodes}
    heap = [(key[n], own[n], n) for n in mm.nodes if waiting[n] == 0]
    heapq.heapify(heap)
    order: list[str] = []
    while heap:
        _, _, n = heapq.heappop(heap)
        order.append(n)
        for s in succs[n]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(heap, (key[s], own[s], s))
    return tuple(order)


def nntrainer_policy(graph: StepGraph, mm: MemoryModel, *, time_limit: float = DEFAULT_TIME_LIMIT) -> OrderResult:
    """NNTrainer's execution order, generalised to DAGs."""
    start = time.perf_counter()
    order = nntrainer_order(graph, mm)
    return OrderResult("nntrainer", order, peak_of_order(mm, order), time.perf_counter() - start)
