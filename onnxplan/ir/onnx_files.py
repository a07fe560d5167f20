"""Safe loading of ONNX files: clear errors for missing, truncated, refused or unsafe models."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from onnxplan.errors import ModelError
from onnxplan.ort import MAX_IR_VERSION

__all__ = [
    "MAX_IR_VERSION",
    "SMALL_TENSOR",
    "check_external_data",
    "check_text",
    "external_bytes",
    "external_chunks",
    "external_tensors",
    "load_onnx",
    "load_tensor",
    "load_weights",
    "tensor_bytes",
]

# elements: an external tensor this small is read even by load_onnx(weights=False): shape
# arithmetic (Reshape shapes, Pad pads, Slice starts) needs its values; weights are larger
SMALL_TENSOR = 1 << 16


def _graphs(model: onnx.ModelProto):
    """The main graph and every subgraph (If/Loop/Scan bodies), each once."""
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        yield g
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    graphs.append(a.g)
                graphs.extend(a.graphs)


def _external_locations(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(tensor name, location) of every tensor with external data."""
    return [(t.name, {e.key: e.value for e in t.external_data}.get("location", ""))
            for t, _ in external_tensors(model)]


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
    fields = [model.producer_name, model.domain, *(o.domain for o in model.opset_import)]
    for g in _graphs(model):
        fields += [g.name, *(t.name for t in g.initializer), *(t.name for t in g.sparse_initializer)]
        for vi in (*g.input, *g.output, *g.value_info):
            fields.append(vi.name)
            if vi.type.HasField("tensor_type"):
                fields += [d.dim_param for d in vi.type.tensor_type.shape.dim]
        for n in g.node:
            fields += [n.name, n.op_type, n.domain, *n.input, *n.output]
            fields += [f for a in n.attribute for f in (a.name, a.ref_attr_name)]
    bad = next((f for f in fields if not isinstance(f, str)), None)
    if bad is not None:
        raise ModelError(f"{path}: a name is not valid UTF-8 ({bytes(bad)[:40]!r})")


def external_tensors(model: onnx.ModelProto) -> list[tuple[onnx.TensorProto, bool]]:
    """Every tensor with external data, and whether it is an initializer of the main graph (only
    those may stay on disk: a node's tensor attribute, a subgraph's initializer are always read)."""
    found = []
    for g in _graphs(model):
        found += [(t, g is model.graph) for t in g.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        found += [(a.t, False) for n in g.node for a in n.attribute
                  if a.HasField("t") and a.t.data_location == onnx.TensorProto.EXTERNAL]
    return found


def tensor_bytes(t: onnx.TensorProto) -> int:
    """Bytes of an external tensor's data: its 'length' entry, else dims x element size."""
    length = {e.key: e.value for e in t.external_data}.get("length")
    if length and length.isdigit():
        return int(length)
    count = 1
    for d in t.dims:
        count *= int(d)
    try:
        return count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return count  # an unknown element type is refused later, with its own line


def external_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the data `model` still holds as external references (not read)."""
    return sum(tensor_bytes(t) for t, _ in external_tensors(model))


def load_weights(model: onnx.ModelProto, folder: Path | str, path: Path | str, *,
                 max_elements: int | None = None) -> None:
    """Read external data into `model` (in place) from `folder`: every tensor, or only those of at
    most `max_elements` elements (and every one that is not a main-graph initializer). A
    ModelError naming `path` when a file cannot be read."""
    for t, weight in external_tensors(model):
        count = 1
        for d in t.dims:
            count *= int(d)
        if weight and max_elements is not None and count > max_elements:
            continue
        load_tensor(t, folder, path)


def load_tensor(t: onnx.TensorProto, folder: Path | str, path: Path | str) -> None:
    """Read the external data of tensor `t` into it (in place) from `folder`; a ModelError
    naming `path` when its file cannot be read."""
    try:
        t.raw_data = onnx.external_data_helper._read_external_data_bytes(t, str(folder))
    except (OSError, ValueError, onnx.checker.ValidationError) as exc:  # onnx's own refusals (a hard link)
        raise ModelError(f"{path}: cannot read external data ({exc})") from None
    # the tensor as it would be had it been saved inline (onnx's loader sets DEFAULT explicitly)
    t.ClearField("data_location")
    del t.external_data[:]


def external_chunks(t: onnx.TensorProto, folder: Path | str, path: Path | str, chunk: int = 1 << 24):
    """The external data of tensor `t` (relative to `folder`), in chunks of at most `chunk`
    bytes, without holding it whole; a ModelError naming `path` when the file is short or
    unreadable. The location was checked by check_external_data."""
    info = {e.key: e.value for e in t.external_data}
    try:
        offset, length = int(info.get("offset") or 0), tensor_bytes(t)
        with open(Path(folder) / info.get("location", ""), "rb") as f:
            f.seek(offset)
            left = length
            while left:
                data = f.read(min(chunk, left))
                if not data:
                    raise ValueError(f"tensor '{t.name}': file ends {left} byte(s) before its data")
                left -= len(data)
                yield data
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read external data ({exc})") from None


def load_onnx(path: Path | str, *, max_ir_version: int = MAX_IR_VERSION, weights: bool = True) -> onnx.ModelProto:
    """Load an ONNX model with its external data, turning every failure into a ModelError.

    weights=False reads only the external tensors of at most SMALL_TENSOR elements (what shape
    arithmetic needs) and those that are not main-graph initializers; the rest stay references (dims, data type and location, checked), so a
    model over 2 GB loads in little memory. load_weights reads them later."""
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
        load_weights(model, path.parent, path, max_elements=None if weights else SMALL_TENSOR)
    return model
