"""ONNX Runtime's training API as ground truth: seeded training steps on an artifact folder."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnxruntime.training import api as ort_training  # imports torch

from onnxplan.data import InputSpec, make_step_batch, read_input_specs, run_steps, step_specs
from onnxplan.errors import ModelError
from onnxplan.memprobe import mark_baseline
from onnxplan.ort import ort_cause
from onnxplan.threads import ort_session_options, use_threads

__all__ = [
    "ReferenceResult",
    "ArtifactPaths",
    "artifact_paths",
    "run_reference",
    "probe_target",
    "TRAINING_MODEL",
    "OPTIMIZER_MODEL",
    "EVAL_MODEL",
    "CHECKPOINT",
]

TRAINING_MODEL = "training_model.onnx"
OPTIMIZER_MODEL = "optimizer_model.onnx"
EVAL_MODEL = "eval_model.onnx"
CHECKPOINT = "checkpoint"
_MAX_IR_VERSION = 10  # the newest IR onnxruntime 1.19 loads
_PATCHED_IR_VERSION = 9  # generate_artifacts stamps the optimizer model with IR 14


@dataclass
class ReferenceResult:
    """What ONNX Runtime computed: the loss of each step, every parameter after the last step."""

    losses: list[float]
    params: dict[str, np.ndarray]  # trainable and frozen, by name, copies
    step_seconds: list[float]


@dataclass(frozen=True)
class ArtifactPaths:
    """The files ONNX Runtime loads, the optimizer model possibly an IR-patched copy."""

    training_model: Path
    optimizer_model: Path
    checkpoint: Path


def artifact_paths(artifact_dir: str | Path, scratch_dir: str | Path) -> ArtifactPaths:
    """Check the artifact files exist; write an IR-patched optimizer model to scratch_dir if needed."""
    root = Path(artifact_dir)
    paths = ArtifactPaths(root / TRAINING_MODEL, root / OPTIMIZER_MODEL, root / CHECKPOINT)
    for path in (paths.training_model, paths.optimizer_model, paths.checkpoint):
        if not path.exists():
            raise ModelError(f"{path}: not found (is {root} an onnxplan artifact folder?)")
    try:
        optimizer = onnx.load(paths.optimizer_model)
    except Exception as exc:  # onnx raises DecodeError and friends
        raise ModelError(f"{paths.optimizer_model}: unreadable ({exc})") from None
    if optimizer.ir_version <= _MAX_IR_VERSION:
        return paths
    optimizer.ir_version = _PATCHED_IR_VERSION
    patched = Path(scratch_dir) / OPTIMIZER_MODEL
    onnx.save(optimizer, patched)
    return ArtifactPaths(paths.training_model, patched, paths.checkpoint)


class _OrtTrainer:
    """One CheckpointState + Module + Optimizer; `step` runs forward, backward and the update."""

    def __init__(self, paths: ArtifactPaths, learning_rate: float | None, *, beside_our_kernels: bool = True) -> None:
        # the process's threads (onnxplan.threads); alone in a process (the peer) ORT's idle
        # workers spin as by default, its fastest
        opts = ort_session_options(beside_our_kernels=beside_our_kernels)
        try:
            self.state = ort_training.CheckpointState.load_checkpoint(os.fspath(paths.checkpoint))
            # No eval model: it builds a second session a training step never uses (~0.1 MiB).
            self.module = ort_training.Module(os.fspath(paths.training_model), self.state, session_options=opts)
            self.optimizer = ort_training.Optimizer(os.fspath(paths.optimizer_model), self.module)
        except Exception as exc:  # pybind's Fail, InvalidProtobuf... share no base but Exception
            raise ModelError(f"{paths.training_model.parent}: {_ort_message(exc)}") from None
        if learning_rate is not None:
            self.optimizer.set_learning_rate(float(learning_rate))
        self.input_names = list(self.module.input_names())

    def check_feeds(self, specs: list[InputSpec]) -> None:
        names = [spec.name for spec in specs]
        if sorted(names) != sorted(self.input_names):
            raise ModelError(
                f"onnxplan.json lists inputs {names}, the training model takes {self.input_names}"
            )

    def step(self, batch: dict[str, np.ndarray]) -> tuple[float, float]:
        """One training step; returns (loss, seconds)."""
        feeds = [batch[name] for name in self.input_names]
        start = time.perf_counter()
        self.module.train()
        loss = self.module(*feeds)
        self.optimizer.step()
        self.module.lazy_reset_grad()
        seconds = time.perf_counter() - start
        loss = loss[0] if isinstance(loss, (list, tuple)) else loss
        return float(np.asarray(loss).reshape(())), seconds

    def parameters(self) -> dict[str, np.ndarray]:
        # Parameter.data is a view of the live state buffer: copy it.
        return {name: np.array(param.data, copy=True) for name, param in self.state.parameters}


def _ort_message(exc: Exception) -> str:
    """ONNX Runtime's error: its cause, without the C++ source location and signature."""
    return f"onnxruntime refused the artifacts: {ort_cause(str(exc))}"


def _step_batches(artifact_dir: str | Path, steps: int, seed: int) -> tuple[list, list]:
    inputs, labels = read_input_specs(artifact_dir)
    batches = [make_step_batch(inputs, labels, seed, step) for step in range(steps)]
    return step_specs(inputs, labels), batches


def run_reference(
    artifact_dir: str | Path,
    steps: int = 3,
    seed: int = 0,
    warmup: int = 0,
    learning_rate: float | None = None,
) -> ReferenceResult:
    """Run `steps` seeded training steps with ONNX Runtime from the artifacts' checkpoint.

    Step k feeds make_step_batch(..., seed, k). Warm-up steps run first on a separate,
    throw-away CheckpointState/Module/Optimizer (on batches 0, 1, ...), so they warm the
    process (thread pool, allocator, lazily loaded code) but never change the losses or
    parameters reported. `learning_rate` overrides the optimizer's default (1e-3).
    """
    onnxruntime.set_default_logger_severity(3)
    if steps < 0 or warmup < 0:
        raise ValueError("steps and warmup must be >= 0")
    specs, batches = _step_batches(artifact_dir, max(steps, warmup), seed)
    with tempfile.TemporaryDirectory(prefix="onnxplan-ref-") as scratch:
        paths = artifact_paths(artifact_dir, scratch)
        if warmup:
            warm = _OrtTrainer(paths, learning_rate)
            warm.check_feeds(specs)
            for batch in batches[:warmup]:
                warm.step(batch)
            del warm
        trainer = _OrtTrainer(paths, learning_rate)
        trainer.check_feeds(specs)
        timed = run_steps(trainer, batches[:steps])
        return ReferenceResult(losses=timed["losses"], params=trainer.parameters(),
                               step_seconds=timed["step_seconds"])


def probe_target(artifact_dir: str, steps: int = 3, seed: int = 0, threads: int | None = None, warmup: int = 0,
                 warmup_seconds: float = 0.0) -> dict:
    """Memory-probe entry point (run in a child by onnxplan.memprobe): JSON-able losses and timings.

    Baseline: interpreter, torch and onnxruntime imported, step data generated; nothing of
    the model loaded. The measured section loads the checkpoint, builds the training and
    optimizer sessions and runs the steps: `steps` timed ones after the warm-up (data.run_steps:
    `warmup` steps, on until `warmup_seconds`).
    """
    onnxruntime.set_default_logger_severity(3)
    specs, batches = _step_batches(artifact_dir, warmup + steps, seed)
    with tempfile.TemporaryDirectory(prefix="onnxplan-ref-") as scratch:
        paths = artifact_paths(artifact_dir, scratch)
        settings = use_threads(threads)
        mark_baseline()
        trainer = _OrtTrainer(paths, None, beside_our_kernels=False)
        trainer.check_feeds(specs)
        return {**run_steps(trainer, batches, warmup, warmup_seconds), "threads": settings.as_dict()}

