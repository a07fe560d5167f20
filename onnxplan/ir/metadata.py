"""An artifact folder's files and its onnxplan.json: one list, one reader (with the version check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onnxplan.errors import ModelError
from onnxplan.ort import CHECKPOINT, EVAL_MODEL, OPTIMIZER_MODEL, TRAINING_MODEL

__all__ = ["ARTIFACT_FILES", "FORWARD_DATA", "FORWARD_MODEL", "METADATA_FILE", "SCHEMA_VERSION", "STEP_FILES", "read_metadata"]

METADATA_FILE = "onnxplan.json"
SCHEMA_VERSION = 1  # of onnxplan.json: written by onnxplan.loading.artifacts, checked by read_metadata
# what `onnxplan models build` writes into a folder (the cache counts a folder complete when all are there)
FORWARD_MODEL = "forward.onnx"  # the forward model the artifacts were generated from
# its weights, when left on disk (a model over 2 GiB: loading.by_reference): a folder beside it
FORWARD_DATA = "forward.data"
ARTIFACT_FILES = (FORWARD_MODEL, TRAINING_MODEL, OPTIMIZER_MODEL, EVAL_MODEL, CHECKPOINT, METADATA_FILE)
# of those, what loading a step needs: a folder made by another tool may hold only these
STEP_FILES = (TRAINING_MODEL, OPTIMIZER_MODEL)


def read_metadata(folder: str | Path, *, required: bool = True) -> dict[str, Any]:
    """The parsed onnxplan.json of an artifact folder; ModelError if unreadable or of another
    schema version, or if missing and `required` (else {}: a folder made by another tool)."""
    path = Path(folder) / METADATA_FILE
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        if not required:
            return {}
        raise ModelError(f"{path}: not found (is {folder} an onnxplan artifact folder?)") from None
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: unreadable ({exc})") from None
    version = meta.get("schema_version") if isinstance(meta, dict) else None
    if version != SCHEMA_VERSION:
        raise ModelError(f"{path}: schema_version {version!r}, expected {SCHEMA_VERSION}")
    return meta
