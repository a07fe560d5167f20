"""Static shape inference for training-step graphs: per-op rules plus constant folding of shape subgraphs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from onnxplan.errors import ModelError, UnsupportedOpError
from onnxplan.ir.graph import Node
from onnxplan.ir.shape_rules import (
    RuleContext,
    ShapeInferenceError,
    canonical_domain,
    find_rule,
    rule_context,
    rule_versions,
)
from onnxplan.ir.shape_rules.folding import SPEC_ONLY_OPS, conform, find_folder
from onnxplan.ir.tensor import TensorSpec

__all__ = ["infer_shapes", "check_rules", "FOLD_MAX_ELEMENTS"]

FOLD_MAX_ELEMENTS = 4096  # fold only small results: shape vectors and scalars, never activations


def _op_name(node: Node) -> str:
    return f"{node.domain}.{node.op_type}" if canonical_domain(node.domain) else node.op_type


def _opset(node: Node, opsets: Mapping[str, int]) -> int:
    domain = canonical_domain(node.domain)
    if domain in opsets:
        return int(opsets[domain])
    if domain == "" and "ai.onnx" in opsets:
        return int(opsets["ai.onnx"])
    return 1


def check_rules(nodes: Sequence[Node], opsets: Mapping[str, int]) -> None:
    """Raise UnsupportedOpError naming every op (and its nodes) that has no shape rule, in one line."""
    missing: dict[str, list[str]] = {}
    for node in nodes:
        version = _opset(node, opsets)
        if find_rule(node.domain, node.op_type, version) is None:
            at = f" at opset {version}" if rule_versions(node.domain, node.op_type) else ""
            missing.setdefault(f"{_op_name(node)}{at}", []).append(node.name)
    if missing:
        parts = []
        for op, names in missing.items():
            shown = ", ".join(f"'{n}'" for n in names[:3])
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            parts.append(f"op {op} ({'node' if len(names) == 1 else 'nodes'} {shown}{more})")
        raise UnsupportedOpError(f"no shape rule for {', '.join(parts)}")


def infer_shapes(
    nodes: Sequence[Node],
    known: Mapping[str, TensorSpec],
    constants: Mapping[str, np.ndarray],
    opsets: Mapping[str, int],
) -> tuple[dict[str, TensorSpec], dict[str, np.ndarray]]:
    """Specs of every value of `nodes` (walked in order), and the values folded to constants.

    `known` holds the specs of graph inputs and initializers; it may also hold specs of values
    that nodes produce (e.g. from ONNX value_info): those are only hints, consulted by the few
    rules whose inputs do not determine their output (AveragePoolGrad). `constants` holds the
    contents of initializers. Folded: `Constant` nodes, `Shape`/`Size` of any value with a
    spec, and small shape-manipulating ops whose inputs are all constant.
    """
    check_rules(nodes, opsets)
    produced = {out: n for n in nodes for out in n.outputs if out}
    specs = {k: v for k, v in known.items() if k not in produced}
    values = {k: np.asarray(v) for k, v in constants.items()}
    for name, value in values.items():
        specs.setdefault(name, TensorSpec(value.dtype.name, value.shape))
    ctx = RuleContext(hints={k: v for k, v in known.items() if k in produced}, specs=specs)
    folded: dict[str, np.ndarray] = {}
    done: set[str] = set()
    with rule_context(ctx):
        for node in nodes:
            in_specs = _input_specs(node, specs, produced, done)
            consts = {n: values[n] for n in node.inputs if n and n in values}
            out_specs = _apply_rule(node, in_specs, consts, _opset(node, opsets))
            for name, spec in zip(node.outputs, out_specs):
                if name and spec is not None:  # (a named output has its spec: _apply_rule checked)
                    specs[name] = spec
                    ctx.producers[name] = (node, in_specs)
                    done.add(name)
            for name, value in _fold(node, in_specs, out_specs, values).items():
                values[name] = folded[name] = value
    return specs, folded


def _input_specs(node: Node, specs, produced, done) -> list[TensorSpec | None]:
    result: list[TensorSpec | None] = []
    for name in node.inputs:
        if not name:
            result.append(None)
        elif name in produced and name not in done:
            raise ModelError(f"node '{node.name}' ({_op_name(node)}) reads '{name}' before node "
                             f"'{produced[name].name}' produces it: nodes are not in topological order")
        elif name not in specs:
            raise ModelError(f"node '{node.name}' ({_op_name(node)}): input '{name}' has no known shape "
                             "(not a graph input, an initializer or the output of an earlier node)")
        else:
            result.append(specs[name])
    return result


def _apply_rule(node: Node, in_specs, consts, opset: int) -> list[TensorSpec | None]:
    rule = find_rule(node.domain, node.op_type, opset)
    where = f"node '{node.name}' ({_op_name(node)})"
    if rule is None:  # check_supported refused the graph first
        raise UnsupportedOpError(f"no shape rule for {where}")
    try:
        out = list(rule(node, in_specs, consts))
    except ShapeInferenceError as exc:
        raise ShapeInferenceError(f"cannot infer shapes of {where}: {exc}") from exc
    except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as exc:
        raise ShapeInferenceError(f"cannot infer shapes of {where}: {type(exc).__name__}: {exc}") from exc
    if len(out) != len(node.outputs):
        raise ShapeInferenceError(f"shape rule of {where} gave {len(out)} specs for {len(node.outputs)} outputs")
    for name, spec in zip(node.outputs, out):
        if name and spec is None:
            raise ShapeInferenceError(f"shape rule of {where} gave no spec for its output '{name}'")
    return out


def _fold(node: Node, in_specs, out_specs, values) -> dict[str, np.ndarray]:
    folder = find_folder(node.domain, node.op_type)
    small = {name for name, spec in zip(node.outputs, out_specs) if name and spec.numel <= FOLD_MAX_ELEMENTS}
    spec_only = (canonical_domain(node.domain), node.op_type) in SPEC_ONLY_OPS
    # a spec-only op folds its small outputs (ConcatTraining's per_input_length beside a large
    # concatenation); any other op only when every output is small
    if folder is None or not small or (not spec_only and len(small) < sum(1 for n in node.outputs if n)):
        return {}
    if not spec_only and any(name and name not in values for name in node.inputs):
        return {}
    inputs = [values.get(name) if name else None for name in node.inputs]
    try:
        results = folder(node, inputs, in_specs, out_specs)
        return {name: conform(v, spec) for name, spec, v in zip(node.outputs, out_specs, results)
                if name in small and v is not None}
    except (ValueError, IndexError, TypeError, ArithmeticError) as exc:
        raise ShapeInferenceError(f"cannot fold node '{node.name}' ({_op_name(node)}): {exc}") from exc
