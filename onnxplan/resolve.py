"""Resolve a MODEL argument (zoo name, forward .onnx, artifact folder) to a loaded StepGraph."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from onnxplan.errors import ModelError, UsageError
from onnxplan.ir.graph import StepGraph
from onnxplan.ir.load import input_spec, load_step
from onnxplan.ir.metadata import STEP_FILES, read_metadata
from onnxplan.ir.onnx_files import load_onnx
from onnxplan.sizes import MAX_BYTES

__all__ = [
    "ModelRequest",
    "check_content_hash",
    "load_model",
    "make_request",
    "model_reference",
    "request_from_reference",
    "resolve_artifacts",
]


@dataclass(frozen=True)
class ModelRequest:
    """What the user asked for on the command line."""

    model: str
    batch: int | None = None
    optimizer: str | None = None  # adamw | sgd (zoo default when None)
    loss: str | None = None  # ce | mse | causal-lm (zoo default when None)
    dims: tuple[tuple[str, int], ...] = ()
    train: tuple[str, ...] = ()  # --train GLOB: forward .onnx only
    freeze: tuple[str, ...] = ()  # --freeze GLOB: forward .onnx only


def make_request(model: str | Path, batch: int | None = None, optimizer: str | None = None, loss: str | None = None,
                 dims: Iterable[tuple[str, int]] = (), train: Iterable[str] | None = None,
                 freeze: Iterable[str] | None = None) -> ModelRequest:
    """A ModelRequest with its values checked (UsageError, exit 2, naming the CLI option)."""
    if batch is not None and not 0 < batch <= MAX_BYTES:
        raise UsageError(f"invalid --batch {batch}: must be a positive integer, at most 2**53")
    if optimizer is not None and optimizer not in ("adamw", "sgd"):
        raise UsageError(f"invalid --optimizer '{optimizer}': expected adamw or sgd")
    from onnxplan.models._spec import LOSSES

    if loss is not None and loss not in LOSSES:
        raise UsageError(f"invalid --loss '{loss}': expected {', '.join(LOSSES)}")
    dims = tuple(dims)
    for name, value in dims:  # zero: a step of no elements (README: exit codes)
        if not 0 < value <= MAX_BYTES:
            raise UsageError(f"invalid --dim {name}={value}: must be a positive integer, at most 2**53")
    for option, globs in (("--train", train), ("--freeze", freeze)):
        if any(not g for g in globs or []):
            raise UsageError(f"invalid {option} '': expected a glob over initializer names, e.g. 'fc.*'")
    return ModelRequest(str(model), batch, optimizer, loss, tuple(dims), tuple(train or ()), tuple(freeze or ()))


def _looks_like_path(text: str) -> bool:
    return "/" in text or text.endswith(".onnx") or text.startswith(".")


def resolve_artifacts(req: ModelRequest) -> Path:
    """The artifact folder for a request, building artifacts into the cache when needed."""
    path = Path(req.model)
    from onnxplan.models.hf import export_forward, is_hf_name, require_spec

    default_loss = "ce"  # a forward .onnx
    if is_hf_name(req.model) and not path.exists():  # the corpus: a user's export, as a user's file
        path = export_forward(req.model, batch=req.batch)
        default_loss = require_spec(req.model)[0].loss
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
        # validates before handing it to onnxruntime-training; the weights stay on disk until
        # generate_from_onnx has checked their size and prepared the model from shapes alone
        forward = load_onnx(path, weights=False)
        _check_dims(forward, req)
        from onnxplan.artifacts import generate_from_onnx

        return generate_from_onnx(
            path, model=forward, batch=req.batch, dims=dict(req.dims),
            optimizer=req.optimizer or "adamw", loss=req.loss or default_loss,
            train=list(req.train), freeze=list(req.freeze),
        )
    from onnxplan.models import build_forward, build_recipe, list_models
    names = [m.name for m in list_models()]
    if req.model in names and not _looks_like_path(req.model):
        from onnxplan.artifacts import recipe_artifacts

        spec = next(m for m in list_models() if m.name == req.model)
        return recipe_artifacts(build_recipe(req.model, batch=req.batch, loss=req.loss),
                                lambda: build_forward(req.model, batch=req.batch, loss=req.loss),
                                optimizer=req.optimizer or spec.default_optimizer)
    if path.exists():
        raise ModelError(f"{req.model}: not a regular file or folder (a device, pipe or socket)")
    if _looks_like_path(req.model):
        raise ModelError(f"{req.model}: no such file or folder")
    raise ModelError(
        f"'{req.model}' is neither a file, an artifact folder nor a zoo model "
        f"(zoo: {', '.join(names)})"
    )


def _check_dims(model, req: ModelRequest) -> None:
    """Refuse a dynamic input dimension with no value, or an input past sizes.MAX_BYTES,
    before anything is generated."""
    from onnxplan.sizes import MAX_BYTES, format_bytes

    initializers = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.type.HasField("tensor_type") and vi.name not in initializers:
            spec = input_spec(vi, dict(req.dims), req.batch)
            if spec.nbytes > MAX_BYTES:
                raise ModelError(f"input '{vi.name}' {spec} holds {format_bytes(spec.nbytes)}, more than "
                                 f"onnxplan plans for ({format_bytes(MAX_BYTES)}); use a smaller batch or dimension")


def load_model(req: ModelRequest) -> StepGraph:
    """Resolve and load a request into one training-step graph."""
    folder = resolve_artifacts(req)
    return load_step(folder, dims=dict(req.dims), batch=req.batch)


def model_reference(req: ModelRequest, folder: Path | None) -> dict:
    """What a plan file records to find its model again (`run --plan plan.json`): the zoo
    name or the absolute path, batch, dims, optimizer, loss, and the content hash of the
    artifacts in `folder` (when our builder made them)."""

    from_zoo = not Path(req.model).exists() and not _looks_like_path(req.model)
    return {"model": req.model if from_zoo else str(Path(req.model).resolve()), "batch": req.batch,
            "dims": [list(d) for d in req.dims], "optimizer": req.optimizer, "loss": req.loss,
            "train": list(req.train), "freeze": list(req.freeze),
            "content_hash": read_metadata(Path(folder), required=False).get("content_hash") if folder is not None else None}


def request_from_reference(ref: dict, batch: int | None = None, optimizer: str | None = None,
                           loss: str | None = None, dims: tuple[tuple[str, int], ...] = (),
                           train: tuple[str, ...] = (), freeze: tuple[str, ...] = ()) -> ModelRequest:
    """The request a plan's model reference stands for; options given override it (the
    plan's fingerprint check then refuses a different graph)."""
    try:
        return ModelRequest(str(ref["model"]), batch if batch is not None else ref.get("batch"),
                            optimizer or ref.get("optimizer"), loss or ref.get("loss"),
                            dims or tuple((str(k), int(v)) for k, v in ref.get("dims") or ()),
                            train or tuple(str(g) for g in ref.get("train") or ()),
                            freeze or tuple(str(g) for g in ref.get("freeze") or ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"malformed model reference in the plan: {type(exc).__name__}: {exc}") from None


def check_content_hash(ref: dict, folder: Path) -> None:
    """Refuse artifacts whose content hash differs from the one the plan was made with."""

    want, have = ref.get("content_hash"), read_metadata(Path(folder), required=False).get("content_hash")
    if want and have and want != have:
        raise ModelError(f"the plan was made for artifacts {want[:12]}, {folder} holds {have[:12]} "
                         "(the model changed since the plan was made)")
