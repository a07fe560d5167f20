"""The load stage's one entry: a LoadRequest to the training step's StepGraph (and the
artifact folder it was read from). `inspect`, `plan`, `run`, `bench` and the API all load here."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from onnxplan.ir.graph import StepGraph
from onnxplan.ir.load import read_step
from onnxplan.ir.metadata import read_metadata
from onnxplan.loading.request import LoadRequest
from onnxplan.loading.resolve import resolve_artifacts

__all__ = ["LoadedStep", "load_step", "open_step", "step_at", "step_batch"]


class LoadedStep(NamedTuple):
    """A loaded training step: the artifact folder (what ORT and the executor read) and its graph."""

    folder: Path
    graph: StepGraph


def step_batch(request: LoadRequest, folder: Path) -> int | None:
    """The batch a step is loaded at: the request's, else the one the artifacts were built for.

    A folder our builder made records its batch in onnxplan.json; when the request names none,
    that batch fills a dynamic batch axis the artifacts kept, so a folder loads the same step
    whichever command reads it (`inspect`, `plan`, `run`, `bench`, `onnxplan.load`). Before
    this one home, `inspect` and `bench` loaded such a folder without it (and refused the
    dynamic axis) while `plan`, `run` and the API used it. A folder from another tool has no
    onnxplan.json: then a dynamic batch axis needs --batch or --dim (DynamicDimError)."""
    if request.batch is not None:
        return request.batch
    return read_metadata(folder, required=False).get("batch")


def open_step(request: LoadRequest | str | Path) -> LoadedStep:
    """Resolve `request` (or a bare model argument) to its artifacts and load its step."""
    req = request if isinstance(request, LoadRequest) else LoadRequest(str(request))
    folder = resolve_artifacts(req)
    return LoadedStep(folder, step_at(folder, req))


def step_at(folder: Path, request: LoadRequest) -> StepGraph:
    """The step of `request` read from its artifact folder, already resolved (resolve_artifacts:
    a bench sweep resolves first and reads the step only when a row needs planning)."""
    return read_step(folder, dims=dict(request.dims), batch=step_batch(request, folder))


def load_step(request: LoadRequest | str | Path) -> StepGraph:
    """The training step `request` stands for, as one StepGraph (artifacts built when needed)."""
    return open_step(request).graph
