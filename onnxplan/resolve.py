"""Resolve a MODEL argument (zoo name, forward .onnx, artifact folder) to a loaded StepGraph."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from onnxplan.errors import ModelError, UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.ir.load import ARTIFACT_FILES, input_spec, load_step
from onnxplan.ir.onnx_files import load_onnx

__all__ = ["ModelRequest", "resolve_artifacts", "load_model"]


@dataclass(frozen=True)
class ModelRequest:
    """What the user asked for on the command line."""

    model: str
    batch: int | None = None
    optimizer: str | None = None  # adamw | sgd (zoo default when None)
    loss: str | None = None  # ce | mse (zoo default when None)
    dims: tuple[tuple[str, int], ...] = ()
    train: tuple[str, ...] = ()  # --train GLOB: forward .onnx only
    freeze: tuple[str, ...] = ()  # --freeze GLOB: forward .onnx only


def _looks_like_path(text: str) -> bool:
    return "/" in text or text.endswith(".onnx") or text.startswith(".")


def resolve_artifacts(req: ModelRequest) -> Path:
    """The artifact folder for a request, building artifacts into the cache when needed."""
    path = Path(req.model)
    from onnxplan.models.hf import export_forward, is_hf_name

    if is_hf_name(req.model) and not path.exists():  # the corpus: a user's export, as a user's file
        path = export_forward(req.model, batch=req.batch)
    if (req.train or req.freeze) and not path.is_file():
        raise UsageError("--train/--freeze choose parameters of a forward .onnx model; "
                         f"'{req.model}' is not one")
    if path.is_dir():
        missing = [f for f in ARTIFACT_FILES if not (path / f).is_file()]
        if missing:
            raise ModelError(
                f"{path}: not an artifact folder (missing {', '.join(missing)}); give a forward "
                ".onnx file, a folder made by `onnxplan models build`, or a zoo model name"
            )
        return path
    if path.is_file():
        forward = load_onnx(path)  # validates before handing it to onnxruntime-training
        _check_dims(forward, req)
        from onnxplan.artifacts import generate_from_onnx

        return generate_from_onnx(
            path, model=forward, batch=req.batch, dims=dict(req.dims),
            optimizer=req.optimizer or "adamw", loss=req.loss or "ce",
            train=list(req.train), freeze=list(req.freeze),
        )
    from onnxplan.models import build_forward, list_models
    names = [m.name for m in list_models()]
    if req.model in names and not _looks_like_path(req.model):
        from onnxplan.artifacts import build_artifacts

        spec = next(m for m in list_models() if m.name == req.model)
        fm = build_forward(req.model, batch=req.batch, loss=req.loss)
        return build_artifacts(fm, None, optimizer=req.optimizer or spec.default_optimizer)
    if _looks_like_path(req.model):
        raise ModelError(f"{req.model}: no such file or folder")
    raise ModelError(
        f"'{req.model}' is neither a file, an artifact folder nor a zoo model "
        f"(zoo: {', '.join(names)})"
    )


def _check_dims(model, req: ModelRequest) -> None:
    """Refuse a dynamic input dimension with no value before anything is generated."""
    initializers = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.type.HasField("tensor_type") and vi.name not in initializers:
            input_spec(vi, dict(req.dims), req.batch)


def load_model(req: ModelRequest) -> StepGraph:
    """Resolve and load a request into one training-step graph."""
    folder = resolve_artifacts(req)
    return load_step(folder, dims=dict(req.dims), batch=req.batch)
