"""Measured peak of a planned run: the probe's fresh subprocess, baseline just before the arena."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from onnxplan.executor.prepare import Prepared, prepare
from onnxplan.loading.request import LoadRequest
from onnxplan.memprobe import ProbeError, mark_baseline, probe_peak
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions
from onnxplan.threads import current as current_threads
from onnxplan.threads import use_threads

__all__ = ["MeasureError", "blas_workspace_target", "measure_blas_workspace", "measure_run", "probe_target"]


class MeasureError(ProbeError):
    """The measuring subprocess failed."""


def probe_target(folder: str, plan_path: str = "-", steps: int = 3, warmup: int = 0, seed: int = 0,
                 learning_rate: float | None = None, batch: int | None = None,
                 dims: list | None = None, threads: int | None = None, warmup_seconds: float = 0.0) -> dict:
    """Run in the probe's child: adopt the plan, build the data and the initial state, mark the
    baseline, then allocate the arena and state region and run warm-up and measured steps.

    Before the baseline: interpreter, numpy, onnxruntime/torch (the checkpoint reader), the
    kernels, the step data and the checkpoint's parameters (the input, like a model file).
    After it: the arena, the state region, views, and whatever the kernels and BLAS touch."""
    from onnxplan.executor.runner import execute, initial_parameters, step_batches
    from onnxplan.kernels import _torch
    from onnxplan.kernels.registry import _load_all

    req = LoadRequest(folder, batch, dims=tuple((str(k), int(v)) for k, v in (dims or [])))
    plan = Plan.from_json(json.loads(sys.stdin.read())) if plan_path == "-" else Plan.load(plan_path)
    prep = prepare(req, plan)
    batches = step_batches(prep.folder, max(steps, warmup), seed)
    params = initial_parameters(prep.folder)
    _load_all()  # every kernel module imported before the baseline
    _torch.load()  # and torch, which some of them call
    if prep.plan.swaps:  # and the swap runtime's modules
        import onnxplan.executor.swap_io  # noqa: F401
        import onnxplan.swap.kernels  # noqa: F401
    if any(p.startswith("split:") for p in prep.plan.passes):  # and the split pass's transfers
        import onnxplan.executor.piece_io  # noqa: F401
    mark_baseline()
    ex, losses, seconds = execute(prep, batches, params, steps=steps, warmup=warmup,
                                  learning_rate=learning_rate, check_arena=False, threads=threads,
                                  warmup_seconds=warmup_seconds)
    return {"losses": losses, "step_seconds": seconds, "warmup_steps": ex.warmup_steps, "threads": current_threads().as_dict(), "arena_bytes": prep.plan.arena_bytes,
            "state_region_bytes": ex.layout.nbytes, "persistent_bytes": prep.plan.persistent_bytes,
            "peak_bytes": prep.plan.peak_bytes, "swap": ex.swap.summary() if ex.swap is not None else None}


def measure_run(folder_or_request: str | Path | LoadRequest, plan_options_or_plan: PlanOptions | Plan | None = None,
                *, steps: int = 3, warmup: int = 0, seed: int = 0, learning_rate: float | None = None,
                prepared: Prepared | None = None, timeout_s: float = 600.0,
                threads: int | None = None, warmup_seconds: float = 0.0) -> tuple[dict, int]:
    """Run the plan in a fresh interpreter through onnxplan.memprobe: (its result, measured peak).

    The result holds losses, step_seconds, arena_bytes, state_region_bytes, persistent_bytes,
    peak_bytes (planned) and `probe` (baseline and peak RSS, method). The plan is made here
    (or given) and handed to the child as JSON on its stdin; the child re-checks it against the model.
    `threads` sizes the child's thread pools (onnxplan.threads; None: every available core);
    the warm-up runs `warmup` steps, on until `warmup_seconds` (runner.execute)."""
    req = folder_or_request if isinstance(folder_or_request, LoadRequest) else LoadRequest(str(folder_or_request))
    prep = prepared or prepare(req, plan_options_or_plan)
    kwargs = {"folder": str(Path(prep.folder).resolve()), "plan_path": "-", "steps": steps,
              "warmup": warmup, "seed": seed, "learning_rate": learning_rate, "batch": req.batch,
              "dims": [list(d) for d in req.dims], "threads": threads, "warmup_seconds": warmup_seconds}
    try:  # the plan goes through the child's stdin: no temporary file to leave behind
        res = probe_peak("onnxplan.executor.measure:probe_target", kwargs, timeout_s=timeout_s,
                         stdin=prep.plan.dumps())
    except ProbeError as exc:
        raise MeasureError(str(exc)) from None
    out = dict(res.result)
    out["probe"] = {"baseline_rss_bytes": res.baseline_rss_bytes, "peak_rss_bytes": res.peak_rss_bytes,
                    "method": res.method}
    return out, res.peak_increase_bytes


def blas_workspace_target(n: int = 2048, threads: int | None = None) -> dict:
    """Probe target: the memory BLAS touches outside its operands, for GEMMs up to n x n.

    Operands and output are allocated and written before the baseline, so what the products
    add is the library's packing buffers (per thread) and thread stacks."""
    import numpy as np

    use_threads(threads)
    a = np.ones((n, n), np.float32)
    b = np.ones((n, n), np.float32)
    out = np.ones((n, n), np.float32)  # written: np.zeros' pages would be touched only later
    mark_baseline()
    for x, y in ((a, b), (a.T, b), (a, b.T)):  # the transposed forms backward passes use
        np.matmul(x, y, out=out)
    return {"n": n}


def measure_blas_workspace(n: int = 2048, threads: int | None = None) -> int:
    """Bytes of resident memory BLAS adds for its own work (see blas_workspace_target)."""
    return probe_peak("onnxplan.executor.measure:blas_workspace_target", {"n": n, "threads": threads}).peak_increase_bytes
