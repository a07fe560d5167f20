"""Seeded step data: the input and label arrays of one training step, the same for every runner."""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from onnxplan.errors import ModelError
from onnxplan.forward.spec import InputSpec  # one definition of how data is drawn
from onnxplan.ir.metadata import METADATA_FILE, read_metadata

__all__ = [
    "METADATA_FILE",
    "InputSpec",
    "make_step_batch",
    "read_input_specs",
    "read_metadata",
    "run_steps",
    "step_specs",
    "warm_up_steps",
]

# The most warm-up steps warm_up_steps runs to fill its seconds (a model of ~0.1 ms a step).
MAX_WARMUP_STEPS = 10_000

def read_input_specs(artifact_dir: str | Path) -> tuple[list[InputSpec], InputSpec | None]:
    """The model inputs and the labels of an artifact folder, from its onnxplan.json (labels
    None: the loss takes its labels from the inputs, causal-lm)."""
    meta = read_metadata(artifact_dir)
    try:
        inputs = [InputSpec.from_dict(row) for row in meta["inputs"]]
        labels = None if meta["labels"] is None else InputSpec.from_dict(meta["labels"])
    except (KeyError, TypeError, ValueError) as exc:
        path = Path(artifact_dir) / METADATA_FILE
        raise ModelError(f"{path}: bad input spec ({type(exc).__name__}: {exc})") from None
    return inputs, labels


def step_specs(inputs: list[InputSpec], labels: InputSpec | None) -> list[InputSpec]:
    """Every array a step is fed: the inputs, then the labels where the loss has its own."""
    return [*inputs, *([labels] if labels is not None else [])]


def make_step_batch(
    inputs: list[InputSpec], labels: InputSpec | None, seed: int, step: int
) -> dict[str, np.ndarray]:
    """The arrays of one step, by name; a pure function of (seed, step, spec).

    Each array has its own generator, seeded from (seed, step, crc32(name)), so adding or
    reordering inputs never changes the others; InputSpec.sample draws it (uniform in
    [low, high) in the spec's dtype, integers low..high-1).
    """
    batch: dict[str, np.ndarray] = {}
    for spec in step_specs(inputs, labels):
        if spec.name in batch:
            raise ModelError(f"input {spec.name!r} is listed twice")
        rng = np.random.default_rng([int(seed), int(step), zlib.crc32(spec.name.encode())])
        batch[spec.name] = spec.sample(rng)
    return batch


def warm_up_steps(warmup: int, seconds: float = 0.0) -> Iterator[int]:
    """The indices of a run's warm-up steps: 0..warmup-1, then on until `seconds` have passed
    since the first began (at most MAX_WARMUP_STEPS); none when `warmup` is 0. The caller feeds
    step k batch k % warmup."""
    start = time.perf_counter()
    for k in range(MAX_WARMUP_STEPS if warmup > 0 else 0):
        if k >= warmup and time.perf_counter() - start >= seconds:
            return
        yield k


def run_steps(trainer, batches, warmup: int = 0, warmup_seconds: float = 0.0) -> dict[str, Any]:
    """Run trainer.step(batch) -> (loss, seconds): warm-up steps on batches[:warmup] (cycled
    until `warmup_seconds` have passed: warm_up_steps), then batches[warmup:]; every step's loss
    and seconds, and how many of them were warm-up (`warmup_steps`)."""
    losses, seconds = [], []

    def run(batch) -> None:
        loss, elapsed = trainer.step(batch)
        losses.append(loss)
        seconds.append(elapsed)

    for k in warm_up_steps(warmup, warmup_seconds):
        run(batches[k % warmup])
    warm = len(seconds)
    for batch in batches[warmup:]:
        run(batch)
    return {"losses": losses, "step_seconds": seconds, "warmup_steps": warm}
