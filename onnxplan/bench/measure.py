"""The "onnxplan measured" columns: run a plan with the executor (when it is installed) in a probe."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from onnxplan.bench.peers import combine_rounds, step_stats

__all__ = ["MEASURED_FIELDS", "executor_available", "measure_plan", "measure_rounds"]

MEASURED_FIELDS = ("measured_peak_bytes", "median_step_seconds", "min_step_seconds", "max_step_seconds",
                   "steps_timed", "warmup_steps", "first_loss", "measure_error", "pool_threads", "rounds",
                   "round_median_step_seconds")


def _executor():
    """onnxplan.executor if it is there and offers measure_run, else None."""
    try:
        module = importlib.import_module("onnxplan.executor")
    except ImportError:
        return None
    return module if hasattr(module, "measure_run") else None


def executor_available() -> bool:
    return _executor() is not None


def _empty(error: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {k: None for k in MEASURED_FIELDS}
    out["steps_timed"] = 0
    out["measure_error"] = error
    return out


def measure_plan(artifact_dir: Path, plan, repeat: int, warmup: int = 1, seed: int = 0,
                 threads: int | None = None, warmup_seconds: float = 0.0) -> dict[str, Any]:
    """Measured peak (probe: peak RSS increase from just before the arena) and step latency of
    `plan` run by onnxplan's executor: `warmup` untimed steps (on until `warmup_seconds`), then `repeat` timed ones, at
    `threads` (onnxplan.threads; None: every available core; `pool_threads` records what each
    pool got). Never raises for a failed run: the figures are null and measure_error says why
    (also when there is no executor)."""
    executor = _executor()
    if executor is None:
        return _empty("onnxplan.executor is not available in this version")
    try:
        res = executor.measure_run(Path(artifact_dir), plan, steps=repeat, warmup=warmup, seed=seed,
                                   threads=threads, warmup_seconds=warmup_seconds)
    except Exception as exc:  # noqa: BLE001 (a kernel or probe failure is a result of the row, not a crash)
        return _empty(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    peak = None
    if isinstance(res, tuple):  # (result dict, measured peak bytes)
        res, peak = res
    res = res if isinstance(res, dict) else vars(res)
    seconds = list(res.get("step_seconds") or [])
    losses = list(res.get("losses") or res.get("loss") or [None])
    out = _empty(None)
    out.update(step_stats(seconds, 0))  # measure_run times only the steps after its warm-up
    out["measured_peak_bytes"] = peak if peak is not None else res.get("measured_peak_bytes")
    out["first_loss"] = losses[0]
    out["warmup_steps"] = res.get("warmup_steps")
    out["pool_threads"] = res.get("threads")
    return out


def measure_rounds(artifact_dir: Path, plan, repeat: int, warmup: int = 1, rounds: int = 1,
                   threads: int | None = None, warmup_seconds: float = 0.0) -> dict[str, Any]:
    """measure_plan in `rounds` fresh processes back to back, combined (peers.combine_rounds)."""
    runs = [measure_plan(artifact_dir, plan, repeat, warmup, threads=threads, warmup_seconds=warmup_seconds)
            for _ in range(rounds)]
    return combine_rounds(runs, "measured_peak_bytes", "measure_error")
