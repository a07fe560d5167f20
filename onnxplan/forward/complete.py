"""Output completion: the optional outputs ORT's gradient builders read, which exporters omit.

LayerNormalization's gradient reads Mean and InvStdDev (outputs 1, 2) and a bias input;
BatchNormalization in training mode must declare its running-mean/var outputs (ONNX shape
inference refuses it otherwise); Dropout's gradient reads its mask (output 1).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from onnxplan.forward._names import NameSource

__all__ = ["complete_outputs"]


def _label(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


def _training_bn(node: onnx.NodeProto) -> bool:
    return any(a.name == "training_mode" and a.i for a in node.attribute)


def complete_outputs(model: onnx.ModelProto, notes: list[str], synthetic: set[str]) -> None:
    """Add the missing outputs in place; initializers it creates are named in `synthetic`."""
    graph = model.graph
    names = NameSource(graph)
    inits = {t.name: t for t in graph.initializer}
    added: dict[str, list[str]] = {}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        base = node.output[0] if node.output else node.name
        if node.op_type == "LayerNormalization":
            if len(node.input) < 3 or not node.input[2]:
                scale = inits.get(node.input[1])
                if scale is None:
                    continue  # a computed scale: the bias shape is unknown; leave it to ORT
                zero = np.zeros(tuple(scale.dims), onnx.helper.tensor_dtype_to_np_dtype(scale.data_type))
                bias = names.fresh(f"{base}.zero_bias")
                graph.initializer.append(numpy_helper.from_array(zero, bias))
                synthetic.add(bias)
                del node.input[2:]
                node.input.append(bias)
                added.setdefault("LayerNormalization zero bias input", []).append(_label(node))
            if len(node.output) < 3:
                for suffix in ("mean", "inv_std_dev")[len(node.output) - 1:]:
                    node.output.append(names.fresh(f"{base}.{suffix}"))
                added.setdefault("LayerNormalization Mean/InvStdDev outputs", []).append(_label(node))
        elif node.op_type == "BatchNormalization" and _training_bn(node) and len(node.output) < 3:
            for suffix in ("running_mean", "running_var")[len(node.output) - 1:]:
                node.output.append(names.fresh(f"{base}.{suffix}"))
            added.setdefault("BatchNormalization running mean/var outputs", []).append(_label(node))
        elif node.op_type == "Dropout" and len(node.output) < 2:
            node.output.append(names.fresh(f"{base}.mask"))
            added.setdefault("Dropout mask output", []).append(_label(node))
    for what, where in added.items():
        shown = ", ".join(where[:3]) + (f", ... ({len(where)} nodes)" if len(where) > 3 else "")
        notes.append(f"added {what}: {shown}")
