"""Exporter normalisation: what both PyTorch exporters leave that onnxruntime-training 1.19.2
cannot take (local functions, opset above 17, IR 10, initializers listed as graph inputs)."""

from __future__ import annotations

import onnx

from onnxplan.errors import ModelError
from onnxplan.forward.gradients import ORT_TRAINING

__all__ = ["TARGET_OPSET", "RUNTIME_IR_VERSION", "KNOWN_DOMAINS", "default_opset", "normalize"]

TARGET_OPSET = 17  # the default-domain opset generate_artifacts handles (LayerNormalization needs 17)
RUNTIME_IR_VERSION = 9
# domains onnxruntime-training 1.19.2 has operators in
KNOWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc",
                 "ai.onnx.training", "ai.onnx.preview.training", "org.pytorch.aten")


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _node_label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "?")


def check_ops(model: onnx.ModelProto) -> None:
    """Refuse an op no runtime schema knows, naming it and its node (one line)."""
    opset = default_opset(model)
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise ModelError(f"ai.onnx opset {opset} is newer than any this onnxplan knows (at most {newest}; "
                         f"{ORT_TRAINING} trains opset {TARGET_OPSET}); export with opset_version={TARGET_OPSET}")
    functions = {(f.domain, f.name) for f in model.functions}
    for node in model.graph.node:
        if (node.domain, node.op_type) in functions:
            continue
        if node.domain not in KNOWN_DOMAINS:
            raise ModelError(f"unknown custom op {node.domain}::{node.op_type} (node {_node_label(node)}): "
                             f"{ORT_TRAINING} has no kernel or gradient for domain '{node.domain}'")
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
            raise ModelError(f"unknown op {node.op_type} (node {_node_label(node)}): not an ai.onnx operator")


def inline_functions(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    if not model.functions:
        return model
    import onnx.inliner

    names = sorted({f.name for f in model.functions})
    model = onnx.inliner.inline_local_functions(model)
    del model.functions[:]
    notes.append(f"inlined {len(names)} local function(s): {', '.join(names)}")
    return model


def drop_initializer_inputs(model: onnx.ModelProto, notes: list[str]) -> None:
    inits = {t.name for t in model.graph.initializer}
    keep = [vi for vi in model.graph.input if vi.name not in inits]
    dropped = len(model.graph.input) - len(keep)
    if dropped:
        del model.graph.input[:]
        model.graph.input.extend(keep)
        notes.append(f"{dropped} initializer(s) listed as graph inputs kept as initializers only")


# reductions whose opset-18 form (axes as an input) the converter maps back to 13, leaving
# the opset-18-only attribute noop_with_empty_axes behind
_REDUCE_18 = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")


def _fix_reduce_attributes(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _REDUCE_18:
            continue
        keep = []
        for a in node.attribute:
            if a.name != "noop_with_empty_axes":
                keep.append(a)
            elif a.i:  # identity on empty axes has no opset-17 form
                raise ModelError(f"cannot convert {node.op_type} (node {_node_label(node)}) to opset "
                                 f"{TARGET_OPSET}: noop_with_empty_axes=1 has no opset-17 form")
        if len(keep) != len(node.attribute):
            del node.attribute[:]
            node.attribute.extend(keep)


def convert_opset(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """The default-domain opset down to TARGET_OPSET (onnx.version_converter), IR down to 9."""
    opset = default_opset(model)
    if opset > TARGET_OPSET:
        import onnx.version_converter

        try:
            model = onnx.version_converter.convert_version(model, TARGET_OPSET)
        except Exception as exc:  # onnx raises RuntimeError/ValueError with the adapter's message
            cause = " ".join(str(exc).split())
            raise ModelError(f"cannot convert ai.onnx opset {opset} to {TARGET_OPSET} for {ORT_TRAINING}: "
                             f"{cause}") from None
        _fix_reduce_attributes(model)
        notes.append(f"converted ai.onnx opset {opset} to {TARGET_OPSET}")
    if model.ir_version > RUNTIME_IR_VERSION:
        notes.append(f"IR version {model.ir_version} set to {RUNTIME_IR_VERSION}")
        model.ir_version = RUNTIME_IR_VERSION
    return model


def normalize(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """Checks and rewrites in order; `notes` gets one line per rewrite made."""
    check_ops(model)
    model = inline_functions(model, notes)
    check_ops(model)
    drop_initializer_inputs(model, notes)
    return model
