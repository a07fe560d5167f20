"""Which initializers are trained: parameters that reach the loss through differentiable inputs.

A backward reachability over the graph from the output, following only inputs ORT
differentiates (onnxplan.forward.gradients) and float values. Of the float initializers
reached, the parameters are trained: those a dynamo export annotates PARAMETER (never those
it annotates as buffers or lifted constants), and the unannotated ones (TorchScript exports,
weights the dynamo optimizer folded, e.g. pre-transposed) except rank-0 scalars. BatchNorm
running statistics are frozen parameters (checkpointed, never differentiated); everything
else stays a constant. --train GLOB restricts training to matching initializers, --freeze
GLOB excludes them; both match initializer names with fnmatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

import onnx

from onnxplan.errors import ModelError, UsageError
from onnxplan.forward.gradients import FLOAT_TYPES, ORT_TRAINING, differentiable_positions, has_gradient

__all__ = ["Selection", "select_parameters", "TORCH_KIND", "torch_kinds"]

TORCH_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"


@dataclass
class Selection:
    trained: list[str]
    frozen: list[str]
    constants: list[str]


def _subgraph_names(node: onnx.NodeProto) -> list[str]:
    """Outer values a control-flow node's subgraphs read (implicit inputs)."""
    found: list[str] = []
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in g.node:
                found.extend(x for x in n.input if x)
                for sub in n.attribute:
                    if sub.HasField("g") or sub.graphs:
                        found.extend(_subgraph_names(n))
                        break
    return found


def _edges(node: onnx.NodeProto, types: dict[str, int]) -> list[str]:
    """Inputs of `node` a gradient could flow back to (float values at differentiable positions)."""
    if not any(types.get(o) in FLOAT_TYPES for o in node.output if o):
        return []
    pos = differentiable_positions(node)
    if pos is None:
        return []
    names = [node.input[i] for i in pos] + _subgraph_names(node)
    return [x for x in names if types.get(x) in FLOAT_TYPES]


def _reach_loss(graph: onnx.GraphProto, types: dict[str, int]) -> set[str]:
    reach = {graph.output[0].name}
    for node in reversed(graph.node):  # graph order is topological
        if any(o in reach for o in node.output if o):
            reach.update(_edges(node, types))
    return reach


def torch_kinds(graph: onnx.GraphProto) -> dict[str, str]:
    """A dynamo export's initializer kinds (PARAMETER, BUFFER, CONSTANT_TENSOR...) by name; read
    them before anything clears value_info."""
    kinds = {}
    for vi in (*graph.value_info, *graph.input):
        for p in vi.metadata_props:
            if p.key == TORCH_KIND:
                kinds[vi.name] = p.value
    return kinds


def _match(globs: list[str], names: list[str], option: str) -> set[str]:
    hit: set[str] = set()
    for g in globs:
        found = {n for n in names if fnmatchcase(n, g)}
        if not found:
            raise UsageError(f"{option} '{g}' matches no initializer of the model")
        hit |= found
    return hit


def _check_path(graph: onnx.GraphProto, types: dict[str, int], trained: list[str], reach: set[str]) -> None:
    """Refuse (one line) a node without an ORT gradient between a trained parameter and the loss."""
    live = set(trained)
    for node in graph.node:
        edges = [x for x in _edges(node, types) if x in live]
        if not edges:
            continue
        outs = [o for o in node.output if o and types.get(o) in FLOAT_TYPES]
        live.update(outs)
        if any(o in reach for o in outs) and not has_gradient(node):
            label = node.name or node.output[0]
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            raise ModelError(f"{ORT_TRAINING} has no gradient for {op} (node {label}); it lies between "
                             f"trained parameters and the loss: freeze those parameters (--freeze) or "
                             f"export the model without {node.op_type}")


def select_parameters(model: onnx.ModelProto, types: dict[str, int], train: list[str] | None = None,
                      freeze: list[str] | None = None, synthetic: set[str] | frozenset = frozenset(),
                      kinds: dict[str, str] | None = None) -> Selection:
    graph = model.graph
    inits = [t for t in graph.initializer]
    names = [t.name for t in inits]
    reach = _reach_loss(graph, types)
    reachable = [t.name for t in inits if t.data_type in FLOAT_TYPES and t.name in reach
                 and t.name not in synthetic]
    kinds = torch_kinds(graph) if kinds is None else kinds
    by_name = {t.name: t for t in inits}
    params = [n for n in reachable if kinds.get(n) == "PARAMETER"
              or (n not in kinds and len(by_name[n].dims) > 0)]
    train_hit = _match(list(train or []), names, "--train")
    freeze_hit = _match(list(freeze or []), names, "--freeze")
    if train:
        trainable_hit = [n for n in reachable if n in train_hit]
        if not trainable_hit:
            raise UsageError(f"--train {' '.join(train)} matches no float initializer that reaches the loss "
                             f"through a differentiable input (matches: {', '.join(sorted(train_hit)[:5])})")
        trained = trainable_hit
    else:
        trained = list(params)
    trained = [n for n in trained if n not in freeze_hit]
    bn_stats = {node.input[i] for node in graph.node if node.op_type == "BatchNormalization"
                and node.domain in ("", "ai.onnx") for i in (3, 4) if len(node.input) > i}
    frozen_set = (set(params) | bn_stats | freeze_hit) - set(trained)
    frozen = [n for n in names if n in frozen_set and by_name[n].data_type in FLOAT_TYPES]
    if not trained:
        why = " (all frozen by --freeze)" if params else ""
        raise ModelError(f"nothing to train: no float initializer reaches the loss through a differentiable "
                         f"input{why}")
    _check_path(graph, types, trained, reach)
    done = set(trained) | set(frozen)
    return Selection(trained, frozen, [n for n in names if n not in done])
