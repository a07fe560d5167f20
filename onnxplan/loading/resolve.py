"""Resolve a LoadRequest's model (artifact folder, forward .onnx, or a name a model source
knows) to an artifact folder, building artifacts into the cache when needed."""

from __future__ import annotations

from pathlib import Path

from onnxplan.errors import ModelError, UsageError
from onnxplan.ir.load import input_spec
from onnxplan.ir.metadata import STEP_FILES
from onnxplan.ir.onnx_files import load_onnx
from onnxplan.loading.request import LoadRequest, looks_like_path
from onnxplan.loading.zoo import sources
from onnxplan.sizes import MAX_BYTES, format_bytes

__all__ = ["resolve_artifacts"]


def resolve_artifacts(req: LoadRequest) -> Path:
    """The artifact folder for a request, building artifacts into the cache when needed."""
    path = Path(req.model)
    default_loss = "ce"  # a forward .onnx
    if not path.exists():  # a named export (the HF corpus): a user's file, trained as one
        export = next((e for s in sources() if (e := s.forward_file(req)) is not None), None)
        if export is not None:
            path, default_loss = export.path, export.default_loss
    if (req.train or req.freeze) and not path.is_file():
        raise UsageError("--train/--freeze choose parameters of a forward .onnx model; "
                         f"'{req.model}' is not one")
    if path.is_dir():
        missing = [f for f in STEP_FILES if not (path / f).is_file()]
        if missing:
            raise ModelError(
                f"{path}: not an artifact folder (missing {', '.join(missing)}); give a forward "
                ".onnx file, a folder made by `onnxplan models build`, or a zoo model name"
            )
        return path
    if path.is_file():
        return _forward_artifacts(path, req, default_loss)
    if not looks_like_path(req.model):
        folder = next((f for s in sources() if (f := s.artifacts(req)) is not None), None)
        if folder is not None:
            return folder
    if path.exists():
        raise ModelError(f"{req.model}: not a regular file or folder (a device, pipe or socket)")
    if looks_like_path(req.model):
        raise ModelError(f"{req.model}: no such file or folder")
    if not sources():  # ONNXPLAN_MODEL_SOURCES set empty, nothing registered
        raise ModelError(f"'{req.model}' is not a file or folder, and no model source is set to name it "
                         "(ONNXPLAN_MODEL_SOURCES)")
    names = [n for s in sources() for n in s.names()]
    raise ModelError(
        f"'{req.model}' is neither a file, an artifact folder nor a zoo model "
        f"(zoo: {', '.join(names)})"
    )


def _forward_artifacts(path: Path, req: LoadRequest, default_loss: str) -> Path:
    """A forward .onnx file's artifacts. It is validated before onnxruntime-training sees it;
    the weights stay on disk until generate_from_onnx has checked their size and prepared the
    model from shapes alone."""
    from onnxplan.loading.artifacts import generate_from_onnx

    forward = load_onnx(path, weights=False)
    _check_dims(forward, req)
    return generate_from_onnx(
        path, model=forward, batch=req.batch, dims=dict(req.dims),
        optimizer=req.optimizer or "adamw", loss=req.loss or default_loss,
        train=list(req.train), freeze=list(req.freeze),
    )


def _check_dims(model, req: LoadRequest) -> None:
    """Refuse a dynamic input dimension with no value, or an input past sizes.MAX_BYTES,
    before anything is generated."""
    initializers = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.type.HasField("tensor_type") and vi.name not in initializers:
            spec = input_spec(vi, dict(req.dims), req.batch)
            if spec.nbytes > MAX_BYTES:
                raise ModelError(f"input '{vi.name}' {spec} holds {format_bytes(spec.nbytes)}, more than "
                                 f"onnxplan plans for ({format_bytes(MAX_BYTES)}); use a smaller batch or dimension")
