"""Exporter normalisation: what both PyTorch exporters leave that onnxruntime-training 1.19.2
cannot take (local functions, opset above 17, IR 10, initializers listed as graph inputs)."""

from __future__ import annotations

import numpy as np
import onnx

from onnxplan.errors import ModelError
from onnxplan.forward._names import NameSource
from onnxplan.forward.gradients import ORT_TRAINING
from onnxplan.ort import RUNTIME_IR_VERSION

__all__ = ["KNOWN_DOMAINS", "RUNTIME_IR_VERSION", "TARGET_OPSET", "default_opset", "normalize"]

TARGET_OPSET = 17  # the default-domain opset generate_artifacts handles (LayerNormalization needs 17)
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
                         f"{ORT_TRAINING} trains opset {TARGET_OPSET}); "
                         f"export with opset_version={TARGET_OPSET}")
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


_HIDDEN = "onnxplan.hidden"  # the converter leaves nodes of an unknown domain alone
# ops onnx.version_converter has no downgrade adapter for, rewritten to their opset-13 form here
_NO_ADAPTER = ("Split", "Pad", "ConstantOfShape")


def _static_dims(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - best effort
        inferred = model
    out = {}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        if vi.type.tensor_type.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else None
                            for d in vi.type.tensor_type.shape.dim]
    return out


def _drop_attr(node: onnx.NodeProto, name: str):
    found = next((a for a in node.attribute if a.name == name), None)
    if found is not None:
        node.attribute.remove(found)
    return None if found is None else onnx.helper.get_attribute_value(found)


def _hide_for_conversion(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Rewrite Split/Pad/ConstantOfShape nodes to the opset-13 form (valid at 17) and move them
    to a private domain so the converter, which has no adapter for them, skips them."""
    from onnx import numpy_helper


    targets = [n for n in model.graph.node if n.domain in ("", "ai.onnx") and n.op_type in _NO_ADAPTER]
    if not targets:
        return []
    dims = _static_dims(model)
    inits = {t.name: t for t in model.graph.initializer}
    names = NameSource(model.graph)

    def refuse(node, why):
        return ModelError(f"cannot convert {node.op_type} (node {_node_label(node)}) to opset "
                          f"{TARGET_OPSET}: {why}")

    for node in targets:
        if node.op_type == "Split":
            n_out = _drop_attr(node, "num_outputs")
            if n_out is not None and (len(node.input) < 2 or not node.input[1]):
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                shape = dims.get(node.input[0])
                size = shape[axis] if shape and -len(shape) <= axis < len(shape) else None
                if size is None:
                    raise refuse(node, "num_outputs over a dimension that is not static")
                chunk = -(-size // n_out)
                split = np.array([chunk] * (n_out - 1) + [size - chunk * (n_out - 1)], np.int64)
                name = names.fresh(f"{_node_label(node)}.split")
                model.graph.initializer.append(numpy_helper.from_array(split, name))
                del node.input[1:]
                node.input.append(name)
        elif node.op_type == "Pad":
            mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "constant")
            if mode == "wrap":
                raise refuse(node, "mode 'wrap' has no opset-17 form")
            if len(node.input) > 3 and node.input[3]:
                axes_t, pads_t = inits.get(node.input[3]), inits.get(node.input[1])
                rank = len(dims.get(node.input[0]) or [])
                if axes_t is None or pads_t is None or not rank:
                    raise refuse(node, "an 'axes' input that is not a constant")
                axes = [int(a) % rank for a in numpy_helper.to_array(axes_t)]
                pads = numpy_helper.to_array(pads_t).astype(np.int64)
                full = np.zeros(2 * rank, np.int64)
                for k, a in enumerate(axes):
                    full[a], full[a + rank] = pads[k], pads[k + len(axes)]
                name = names.fresh(f"{_node_label(node)}.pads")
                model.graph.initializer.append(numpy_helper.from_array(full, name))
                node.input[1] = name
                del node.input[3:]
        node.domain = _HIDDEN
    model.opset_import.add(domain=_HIDDEN, version=1)
    return targets


def _unhide(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        if node.domain == _HIDDEN:
            node.domain = ""
    keep = [o for o in model.opset_import if o.domain != _HIDDEN]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def convert_opset(model: onnx.ModelProto, notes: list[str]) -> onnx.ModelProto:
    """The default-domain opset down to TARGET_OPSET (onnx.version_converter), IR down to 9."""
    opset = default_opset(model)
    if opset > TARGET_OPSET:
        import onnx.version_converter

        hidden = _hide_for_conversion(model)
        try:
            model = onnx.version_converter.convert_version(model, TARGET_OPSET)
        except Exception as exc:  # onnx raises RuntimeError/ValueError with the adapter's message
            cause = " ".join(str(exc).split())
            raise ModelError(f"cannot convert ai.onnx opset {opset} to {TARGET_OPSET} for {ORT_TRAINING}: "
                             f"{cause}") from None
        if hidden:
            _unhide(model)
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
