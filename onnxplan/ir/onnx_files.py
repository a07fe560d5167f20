"""Safe loading of ONNX files: clear errors for missing, truncated, refused or unsafe models."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from onnxplan.errors import ModelError

__all__ = ["MAX_IR_VERSION", "load_onnx", "check_external_data", "check_text"]

# onnxruntime-training 1.19.2 refuses models stamped with a newer IR version than this.
MAX_IR_VERSION = 10


def _external_locations(model: onnx.ModelProto) -> list[tuple[str, str]]:
    found = []
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        for t in list(g.initializer) + [a.t for n in g.node for a in n.attribute if a.HasField("t")]:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                loc = {e.key: e.value for e in t.external_data}.get("location", "")
                found.append((t.name, loc))
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)
    return found


def check_external_data(model: onnx.ModelProto, folder: Path, path: Path) -> None:
    """Refuse external-data locations that are absolute or point outside the model's folder."""
    root = folder.resolve()
    for tensor, loc in _external_locations(model):
        target = (root / loc).resolve()
        if os.path.isabs(loc) or not target.is_relative_to(root):
            raise ModelError(
                f"{path}: tensor '{tensor}' has external data at '{loc}', outside the model's "
                "folder; refusing it (path traversal)"
            )
        if not target.is_file():
            raise ModelError(f"{path}: external data file '{loc}' of tensor '{tensor}' is missing")


def check_text(model: onnx.ModelProto, path: Path) -> None:
    """Refuse names that are not valid UTF-8: protobuf hands them over as bytes, not str."""
    graphs = [model.graph]
    fields = [model.producer_name, model.domain, *(o.domain for o in model.opset_import)]
    while graphs:
        g = graphs.pop()
        fields += [g.name, *(t.name for t in g.initializer), *(t.name for t in g.sparse_initializer)]
        for vi in (*g.input, *g.output, *g.value_info):
            fields.append(vi.name)
            if vi.type.HasField("tensor_type"):
                fields += [d.dim_param for d in vi.type.tensor_type.shape.dim]
        for n in g.node:
            fields += [n.name, n.op_type, n.domain, *n.input, *n.output]
            for a in n.attribute:
                fields += [a.name, a.ref_attr_name]
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)
    bad = next((f for f in fields if not isinstance(f, str)), None)
    if bad is not None:
        raise ModelError(f"{path}: a name is not valid UTF-8 ({bytes(bad)[:40]!r})")


def load_onnx(path: Path | str, *, max_ir_version: int = MAX_IR_VERSION) -> onnx.ModelProto:
    """Load an ONNX model with its external data, turning every failure into a ModelError."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, expected an .onnx file")
    if not path.is_file():
        raise ModelError(f"{path}: not a regular file (a device, pipe or socket), expected an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise ModelError(f"{path}: not an ONNX model or truncated ({type(exc).__name__})") from None
    if not model.HasField("graph") or (len(model.graph.node) == 0 and not model.graph.output):
        raise ModelError(f"{path}: not an ONNX model or truncated (no graph)")
    check_text(model, path)
    if model.ir_version > max_ir_version:
        raise ModelError(
            f"{path}: IR version {model.ir_version} is newer than ONNX Runtime 1.19.2 accepts "
            f"(at most {max_ir_version}); re-save it with ir_version <= {max_ir_version}"
        )
    check_external_data(model, path.parent, path)
    if _external_locations(model):
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: cannot read external data ({exc})") from None
    return model
