"""Run a prepared plan and report it: losses, latency, planned against measured peak, swap
accounting, and the comparison with ONNX Runtime (`onnxplan run`'s JSON is RunReport.to_json)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np

from onnxplan.budget.decide import chosen_strategy
from onnxplan.device import DevicePeak, device_name
from onnxplan.errors import EXIT_FAILURE, OnnxplanError
from onnxplan.executor.measure import measure_run
from onnxplan.executor.prepare import Prepared
from onnxplan.executor.runner import DEFAULT_LEARNING_RATE, run_plan
from onnxplan.executor.swap_account import SwapAccounting, swap_accounting
from onnxplan.hostmem import give_back_freed
from onnxplan.json_models import doc, dumped, optional
from onnxplan.loading.request import LoadRequest
from onnxplan.memprobe import ProbeError
from onnxplan.plan import Plan
from onnxplan.sizes import format_bytes
from onnxplan.threads import current as current_threads
from onnxplan.verification.step_check import verify_run

__all__ = ["RUNTIME_OVERHEAD_BYTES", "BudgetCheck", "Measurement", "RunFailed", "RunReport", "budget_check",
           "predicted_step", "run_prepared"]

# What a measured peak may exceed the plan by without a tensor outside it (README: Concepts,
# Executor): on the CPU the interpreter's and BLAS's working memory (1-9 MiB on the zoo) plus
# torch's runtime, touched on its first op (~8.7 MiB); on a GPU, live CuPy arrays are counted,
# within 1.5 MiB of the plan on every zoo model (reports/cuda.md). A measured peak is held
# against a budget less this allowance (budget_check).
RUNTIME_OVERHEAD_BYTES = {"cpu": 18 << 20, "cuda": 2 << 20}



class RunFailed(OnnxplanError):
    """Measuring failed (a crashed or killed subprocess)."""

    exit_code = EXIT_FAILURE


@dataclass(frozen=True)
class Measurement:
    """How the peak was measured: a fresh process's probe on the CPU (with its median step), or
    CuPy's pool on a GPU (with what the pool holds in all)."""

    method: Annotated[str, doc("the probe's method")]
    pool_total_bytes: Annotated[int | None, optional("GPU: what CuPy's pool holds in all (cached blocks)")] = None
    median_step_seconds_in_probe: Annotated[float | None, optional("CPU: the probe process's median step")] = None
    state_alignment_bytes: Annotated[int, doc("the state slots' alignment to 64 B")] = 0


@dataclass(frozen=True)
class BudgetCheck:
    """A measured peak against the budget asked (budget_check)."""

    budget_bytes: Annotated[int, doc("the budget")]
    overhead_bytes: Annotated[int, doc("the runtime's fixed overhead allowed (RUNTIME_OVERHEAD_BYTES)")]
    fits: Annotated[bool, doc("the plan fits and the measured peak less the overhead does too")]
    line: Annotated[str | None, doc("what to say (null: the measured peak is within the budget)")]


@dataclass
class RunReport:
    """What a run of a plan did: per step loss and seconds, the planned peak and (measured) the
    peak in a fresh process or on the device, swap accounting, and with verify the comparison
    with ONNX Runtime from the same state (`verified`: None when not verified)."""

    model: str
    folder: str
    steps: int
    warmup: int
    seed: int
    learning_rate: float
    order_policy: str
    planner: str
    passes: list[str]
    loss: list[float]
    step_seconds: list[float]
    median_step_seconds: float
    arena_bytes: int
    persistent_bytes: int
    state_region_bytes: int
    peak_bytes: int
    measured_peak_bytes: int | None = None
    measured_minus_planned_bytes: int | None = None
    check_arena: bool = False
    verified: bool | None = None
    max_rel_diff: float | None = None
    worst: list[str] = field(default_factory=list)
    threads: dict[str, Any] = field(default_factory=dict)  # what each thread pool got (onnxplan.threads)
    swap: SwapAccounting | None = None  # swap accounting (onnxplan.executor.swap_account)
    predicted_step_seconds: float | None = None
    predicted_from: str = ""
    strategy: str = "none"  # the memory strategy the plan was made with (onnxplan.budget.decide.chosen_strategy)
    device: str = "cpu"
    measurement: Annotated[Measurement | None, optional("how the peak was measured")] = None
    # per step checks (onnxplan.verification.step_check.Verification.as_dict)
    verification: Annotated[dict[str, Any] | None, optional("per step checks against ONNX Runtime")] = None
    ort_loss: Annotated[list[float] | None, optional("ONNX Runtime's loss per step")] = None
    budget_check: Annotated[BudgetCheck | None, optional("the measured peak against the budget")] = None

    def to_json(self) -> dict[str, Any]:
        """`run --json`: every field; measurement, verification, ort_loss and budget_check only when present."""
        return dumped(self)


def predicted_step(plan: Plan) -> tuple[float | None, str]:
    """The plan's predicted step time and what it rests on (recorded when a checkpoint policy
    or the budget layer's strategy choice planned it)."""
    if plan.checkpoint is not None:
        return plan.checkpoint.predicted_step_seconds, plan.checkpoint.time_source
    if plan.strategy is not None:
        chosen = plan.strategy.chosen_candidate
        return (chosen.predicted_step_seconds if chosen else None), "strategy"
    return None, ""


def run_prepared(req: LoadRequest, prep: Prepared, *, steps: int = 3, warmup: int = 1, seed: int = 0,
                 lr: float | None = None, check_arena: bool = False, threads: int | None = None,
                 measure: bool = False, verify: bool = False, swap_dir=None, xp: Any = np,
                 tell: Callable[[str], None] = lambda text: None, budget: int | None = None) -> RunReport:
    """Run `prep` (a plan adopted or made for `req`'s step): `steps` seeded steps after `warmup`;
    with `measure` the peak (a fresh process on the CPU, CuPy's pool on a GPU), held against
    `budget` (report.budget_check); with `verify` every step against ONNX Runtime from the same
    state. `tell(text)` reports progress."""
    counted = DevicePeak(xp) if xp is not np and measure else contextlib.nullcontext()
    with counted as device_peak:  # on a GPU the run itself is measured (None on the CPU)
        res = run_plan(req, None, steps=steps, warmup=warmup, seed=seed, check_arena=check_arena,
                       learning_rate=lr, prepared=prep, threads=threads, swap_dir=swap_dir, xp=xp,
                       on_step=lambda text: tell(f"running {text}"))
    plan = prep.plan
    predicted, source = predicted_step(plan)
    out = RunReport(
        model=plan.model, folder=str(prep.folder), steps=steps, warmup=warmup, seed=seed,
        learning_rate=lr if lr is not None else DEFAULT_LEARNING_RATE, order_policy=plan.order_policy,
        planner=plan.planner, passes=list(plan.passes), loss=res.losses, step_seconds=res.step_seconds,
        median_step_seconds=res.median_step_seconds, arena_bytes=res.arena_bytes,
        persistent_bytes=res.persistent_bytes, state_region_bytes=res.state_region_bytes,
        peak_bytes=res.peak_bytes, check_arena=check_arena, threads=current_threads().as_dict(),
        predicted_step_seconds=predicted, predicted_from=source, device=device_name(xp),
        strategy=chosen_strategy(plan),
    )
    if res.swap is not None:  # accounting, and the latency of the same plan without swap
        tell("the same steps without swap (for comparison)")
        out.swap = swap_accounting(req, prep, res, steps=steps, warmup=warmup, seed=seed, lr=lr,
                                   threads=threads, xp=xp)
    alignment = res.state_region_bytes - res.persistent_bytes
    if device_peak is not None:  # the run above, counted on the device: no subprocess needed
        _measured(out, device_peak.peak)
        out.measurement = Measurement("device memory held by live CuPy arrays (pool memory hook)",
                                      pool_total_bytes=device_peak.pool_total_bytes, state_alignment_bytes=alignment)
    elif measure:
        try:
            tell("measuring the peak in a fresh process")
            child, peak = measure_run(req, None, steps=steps, warmup=warmup, seed=seed, learning_rate=lr,
                                      prepared=prep, threads=threads)
        except ProbeError as exc:
            raise RunFailed(f"measuring the peak failed: {exc}") from None
        _measured(out, peak)
        out.measurement = Measurement(child["probe"]["method"],
                                      median_step_seconds_in_probe=_median(child["step_seconds"]),
                                      state_alignment_bytes=alignment)
    if budget is not None and out.measured_peak_bytes is not None:
        out.budget_check = budget_check(out.peak_bytes, out.measured_peak_bytes, budget,
                                        RUNTIME_OVERHEAD_BYTES["cpu" if xp is np else "cuda"])
    if verify:
        del res  # the run's final parameters: not needed beside the verification's own step
        give_back_freed()
        tell("verifying against ONNX Runtime")
        ver = verify_run(prep, steps=steps, seed=seed, learning_rate=lr, xp=xp, swap_dir=swap_dir,
                         check_arena=check_arena)
        errors = [c.error for s in ver.steps for k, c in s.checks.items() if k != "update"]
        out.verified, out.max_rel_diff = ver.ok, max(errors, default=0.0)
        out.verification, out.ort_loss = ver.as_dict(), [s.ort_loss for s in ver.steps]
        out.worst = [] if ver.ok else [ver.summary()]
    return out


def budget_check(planned: int, measured: int, budget: int, overhead: int) -> BudgetCheck:
    """A measured peak against the budget asked: `fits` unless the plan misses it or the measured
    peak less the runtime's fixed `overhead` (RUNTIME_OVERHEAD_BYTES) exceeds it (something
    outside the plan grew with the step); `line` says so, or that the measured peak is over the
    budget by no more than that overhead (None when it is within the budget)."""
    over = measured - budget
    fits = planned <= budget and measured - overhead <= budget
    line = None
    if planned > budget:
        line = (f"the run misses the budget {format_bytes(budget)}: planned peak {format_bytes(planned)} "
                f"({planned} B), measured {format_bytes(measured)}")
    elif not fits:
        line = (f"the run misses the budget {format_bytes(budget)}: measured peak {format_bytes(measured)} "
                f"({measured} B) is {format_bytes(over)} over it, more than the runtime's fixed overhead "
                f"({format_bytes(overhead)}: interpreter, BLAS, torch); planned peak {format_bytes(planned)}")
    elif over > 0:
        line = (f"measured peak {format_bytes(measured)} is {format_bytes(over)} over the budget "
                f"{format_bytes(budget)}, within the runtime's fixed overhead ({format_bytes(overhead)}: "
                f"interpreter, BLAS, torch); the plan ({format_bytes(planned)}) fits")
    return BudgetCheck(budget, overhead, fits, line)


def _measured(out: RunReport, peak: int) -> None:
    out.measured_peak_bytes = peak
    out.measured_minus_planned_bytes = peak - out.peak_bytes
    if out.swap is not None:
        out.swap.measured_peak_bytes = peak


def _median(xs) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])
