"""What the user asks the load stage for (LoadRequest), checked, and how a plan file names it again."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from onnxplan.errors import ModelError, UsageError
from onnxplan.forward.spec import LOSSES, OPTIMIZERS
from onnxplan.ir.metadata import read_metadata
from onnxplan.sizes import MAX_BYTES

__all__ = ["LoadRequest", "check_content_hash", "looks_like_path", "make_request", "model_reference",
           "request_from_reference"]


@dataclass(frozen=True)
class LoadRequest:
    """What to load: a model (zoo name, forward .onnx or artifact folder) and how to make its
    step (batch, optimizer, loss, named dims; which parameters train, for a forward .onnx)."""

    model: str
    batch: int | None = None
    optimizer: str | None = None  # adamw | sgd (zoo default when None)
    loss: str | None = None  # ce | mse | causal-lm (zoo default when None)
    dims: tuple[tuple[str, int], ...] = ()
    train: tuple[str, ...] = ()  # --train GLOB: forward .onnx only
    freeze: tuple[str, ...] = ()  # --freeze GLOB: forward .onnx only


def make_request(model: str | Path, batch: int | None = None, optimizer: str | None = None, loss: str | None = None,
                 dims: Iterable[tuple[str, int]] = (), train: Iterable[str] | None = None,
                 freeze: Iterable[str] | None = None) -> LoadRequest:
    """A LoadRequest with its values checked (UsageError, exit 2, naming the CLI option)."""
    if batch is not None and not 0 < batch <= MAX_BYTES:
        raise UsageError(f"invalid --batch {batch}: must be a positive integer, at most 2**53")
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise UsageError(f"invalid --optimizer '{optimizer}': expected {' or '.join(OPTIMIZERS)}")
    if loss is not None and loss not in LOSSES:
        raise UsageError(f"invalid --loss '{loss}': expected {', '.join(LOSSES)}")
    dims = tuple(dims)
    for name, value in dims:  # zero: a step of no elements (README: exit codes)
        if not 0 < value <= MAX_BYTES:
            raise UsageError(f"invalid --dim {name}={value}: must be a positive integer, at most 2**53")
    for option, globs in (("--train", train), ("--freeze", freeze)):
        if any(not g for g in globs or []):
            raise UsageError(f"invalid {option} '': expected a glob over initializer names, e.g. 'fc.*'")
    return LoadRequest(str(model), batch, optimizer, loss, tuple(dims), tuple(train or ()), tuple(freeze or ()))


def looks_like_path(text: str) -> bool:
    return "/" in text or text.endswith(".onnx") or text.startswith(".")


def model_reference(req: LoadRequest, folder: Path | None) -> dict:
    """What a plan file records to find its model again (`run --plan plan.json`): the zoo
    name or the absolute path, batch, dims, optimizer, loss, and the content hash of the
    artifacts in `folder` (when our builder made them)."""

    from_zoo = not Path(req.model).exists() and not looks_like_path(req.model)
    return {"model": req.model if from_zoo else str(Path(req.model).resolve()), "batch": req.batch,
            "dims": [list(d) for d in req.dims], "optimizer": req.optimizer, "loss": req.loss,
            "train": list(req.train), "freeze": list(req.freeze),
            "content_hash": read_metadata(Path(folder), required=False).get("content_hash") if folder is not None else None}


def request_from_reference(ref: dict, batch: int | None = None, optimizer: str | None = None,
                           loss: str | None = None, dims: tuple[tuple[str, int], ...] = (),
                           train: tuple[str, ...] = (), freeze: tuple[str, ...] = ()) -> LoadRequest:
    """The request a plan's model reference stands for; options given override it (the
    plan's fingerprint check then refuses a different graph)."""
    try:
        return LoadRequest(str(ref["model"]), batch if batch is not None else ref.get("batch"),
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
