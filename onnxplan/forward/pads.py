"""auto_pad made explicit: Conv and AveragePool nodes get the `pads` their auto_pad means.

onnxruntime-training 1.19.2's CPU gradients of these never read auto_pad: ConvGrad and
AveragePoolGrad take `pads` as given, zeros when absent, while the forward kernels resolve
auto_pad. With SAME_UPPER / SAME_LOWER and a window wider than one element the training graph
then computes wrong gradients (O(1) of their norm; SAME_LOWER ConvGrad reads memory it never
wrote), so artifacts built from such a model would train wrong for anyone using them. The pads
come from the static input shapes by ONNX's SAME rule (output ceil(in / stride), the total padding
split with the odd element at the end for SAME_UPPER, at the beginning for SAME_LOWER: the
arithmetic of onnxplan.ir.windows.same_pads); VALID becomes zero pads. MaxPool keeps its auto_pad
(MaxPoolGrad scatters through the indices the forward chose: right either way); ConvTranspose
too (onnxruntime 1.19.2 CPU has no ConvTransposeGrad kernel to be wrong). Checked against a
float64 brute force in tests/test_forward_pads.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import helper

from onnxplan.errors import ModelError
from onnxplan.forward.gradients import ORT_TRAINING
from onnxplan.ir.windows import SAME, auto_pad, same_pads

__all__ = ["EXPLICIT_PAD_OPS", "explicit_auto_pads"]

# ops whose onnxruntime-training 1.19.2 gradient ignores auto_pad
EXPLICIT_PAD_OPS = ("Conv", "AveragePool")


def _pads(node: onnx.NodeProto, mode: str, shapes: Mapping[str, tuple[int, ...]]) -> list[int]:
    """The explicit pads (begin..., end...) of `node`'s auto_pad on its static input shape."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if mode == "VALID":  # no padding, whatever the shapes: as many zeros as spatial axes
        rank = next((len(attrs[k]) for k in ("kernel_shape", "strides", "dilations") if attrs.get(k)), None)
        x = shapes.get(node.input[0])
        rank = rank if rank is not None else (len(x) - 2 if x is not None else None)
        if rank is not None:
            return [0] * (2 * rank)
    x = shapes.get(node.input[0])
    kernel = attrs.get("kernel_shape")
    if not kernel and node.op_type == "Conv" and len(node.input) > 1:
        w = shapes.get(node.input[1])
        kernel = w[2:] if w is not None else None
    if x is None or not kernel or len(x) < 3:
        label = node.name or node.output[0]
        what = "input's" if x is None or len(x) < 3 else "weight's"
        raise ModelError(f"cannot make auto_pad={mode} of {node.op_type} node {label} explicit: its {what} "
                         f"shape is unknown ({ORT_TRAINING}'s {node.op_type}Grad ignores auto_pad, so its "
                         f"gradient would be wrong); give the dynamic dimensions (--batch / --dim NAME=N) or "
                         f"export the model with explicit padding")
    return same_pads(attrs, x[2:], kernel)


def explicit_auto_pads(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], notes: list[str]) -> None:
    """Rewrite, in place, every default-domain Conv / AveragePool with auto_pad SAME_UPPER,
    SAME_LOWER or VALID to explicit `pads` (AveragePool also to ceil_mode 0: with these pads
    the floor gives SAME's ceil(in / stride)); ModelError (one line) where a shape is unknown."""
    done: dict[tuple[str, str], list[str]] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in EXPLICIT_PAD_OPS:
            continue
        mode = auto_pad({a.name: helper.get_attribute_value(a) for a in node.attribute})
        if mode not in (*SAME, "VALID"):
            continue
        pads = _pads(node, mode, shapes)
        kept = [a for a in node.attribute if a.name not in ("auto_pad", "pads", "ceil_mode")]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.attribute.append(helper.make_attribute("pads", pads))
        done.setdefault((node.op_type, mode), []).append(node.name or node.output[0])
    for (op, mode), where in done.items():
        shown = ", ".join(where[:3]) + (f", ... ({len(where)} nodes)" if len(where) > 3 else "")
        notes.append(f"gave {op} auto_pad={mode} nodes explicit pads ({ORT_TRAINING}'s {op}Grad reads pads, "
                     f"never auto_pad): {shown}")
