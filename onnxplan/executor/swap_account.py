"""Swap accounting of a run: peaks, transfers per step, stalls, latency against no swap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np

from onnxplan.executor.prepare import prepare
from onnxplan.executor.runner import run_plan
from onnxplan.json_models import doc
from onnxplan.planning import PlanOptions
from onnxplan.sizes import format_bytes
from onnxplan.swap import swap_totals

__all__ = ["StoreUse", "SwapAccounting", "describe_accounting", "no_swap_options", "swap_accounting"]


def no_swap_options(plan) -> Any:
    """PlanOptions giving `plan` without its swaps: the same order policy, planner, passes."""
    s = plan.settings
    return PlanOptions(order=plan.order_policy, planner=plan.planner, interleave=s.interleave, inplace=s.inplace,
                       time_limit=s.time_limit)


@dataclass(frozen=True)
class StoreUse:
    """The swap store a run used."""

    store_bytes: Annotated[int, doc("the store file's size")]
    store_fs: Annotated[str | None, doc("the file system it lives on")]
    cache: Annotated[str, doc("what the page cache did with it")]


@dataclass
class SwapAccounting:
    """Swap accounting of a run (`run --json`'s `swap`): planned peaks with and without swap,
    swaps and bytes per step (planned, measured), stalls, and the latency against no swap."""

    policy: Annotated[str, doc("the swap policy, described")]
    planned_peak_bytes: Annotated[int, doc("the plan's peak")]
    planned_peak_no_swap_bytes: Annotated[int, doc("the same plan's peak without swap")]
    measured_peak_bytes: Annotated[int | None, doc("the measured peak (null: not measured)")]
    swaps: Annotated[int, doc("swaps per step")]
    transfers: Annotated[int, doc("transfers per step")]
    planned_bytes_out: Annotated[int, doc("planned bytes out per step")]
    planned_bytes_in: Annotated[int, doc("planned bytes in per step")]
    bytes_out_per_step: Annotated[list[int], doc("measured bytes out, per step")]
    bytes_in_per_step: Annotated[list[int], doc("measured bytes in, per step")]
    stalls_per_step: Annotated[list[int], doc("waits for a transfer, per step")]
    stall_seconds_per_step: Annotated[list[float], doc("seconds waited, per step")]
    io_seconds_per_step: Annotated[list[float], doc("seconds the I/O worker was busy, per step")]
    median_step_seconds: Annotated[float, doc("median step with swap")]
    median_step_seconds_no_swap: Annotated[float, doc("median step of the same plan without swap")]
    latency_overhead: Annotated[float, doc("with / without - 1")]
    same_results_as_no_swap: Annotated[bool, doc("losses and parameters bit-identical to the run without swap")]
    compared_unsplit: Annotated[bool, doc("the plan splits nodes and the run without swap is also unsplit (its "
                                          "sums in another order: differences within rounding)")]
    store: Annotated[StoreUse, doc("the store (StoreUse)")]


def swap_accounting(req, prep, res, *, steps: int, warmup: int, seed: int, lr: float | None,
                    threads: int | None, baseline: Any = None, xp: Any = np) -> SwapAccounting:
    """Planned peak with and without swap, swaps, bytes out/in and stalls per step (measured),
    and the latency overhead against the same plan without swap (run here unless `baseline`,
    a RunResult of that plan, is given)."""
    plan = prep.plan
    if baseline is None:
        plain = prepare(req, no_swap_options(plan))
        baseline = run_plan(req, None, steps=steps, warmup=warmup, seed=seed, learning_rate=lr,
                            prepared=plain, threads=threads, xp=xp)
    per_step = res.swap["steps"]
    med = float(np.median(res.step_seconds))
    base = float(np.median(baseline.step_seconds))
    t = swap_totals(plan.swaps)
    return SwapAccounting(
        policy=plan.swap.described, planned_peak_bytes=plan.peak_bytes, planned_peak_no_swap_bytes=baseline.peak_bytes,
        measured_peak_bytes=None, swaps=t["swaps"], transfers=t["transfers"],
        planned_bytes_out=t["bytes_out"], planned_bytes_in=t["bytes_in"],
        bytes_out_per_step=[s["bytes_out"] for s in per_step], bytes_in_per_step=[s["bytes_in"] for s in per_step],
        stalls_per_step=[s["stalls"] for s in per_step], stall_seconds_per_step=[s["stall_seconds"] for s in per_step],
        io_seconds_per_step=[s["io_seconds"] for s in per_step],
        median_step_seconds=med, median_step_seconds_no_swap=base,
        latency_overhead=med / base - 1.0 if base > 0 else float("nan"),
        same_results_as_no_swap=res.losses == baseline.losses and all(
            np.array_equal(res.params[k], baseline.params[k]) for k in baseline.params),
        compared_unsplit=any(p.startswith("split:") for p in plan.passes),
        store=StoreUse(res.swap["store_bytes"], res.swap["store_fs"], res.swap["cache"]),
    )


def describe_accounting(a: SwapAccounting) -> list[str]:
    """Lines for the run table."""
    n = max(len(a.bytes_out_per_step), 1)
    unsplit = " or splits" if a.compared_unsplit else ""
    same = ("bit-identical to" if a.same_results_as_no_swap else  # split sums run in another order
            "not bit-identical (split sums in another order; --verify compares with ONNX Runtime) to"
            if a.compared_unsplit else "DIFFERENT from")
    lines = [
        (f"swap {a.policy}: {a.swaps} swaps ({a.transfers} transfers) per step; planned peak "
        f"{format_bytes(a.planned_peak_bytes)} vs {format_bytes(a.planned_peak_no_swap_bytes)} without swap{unsplit}"),
        (f"  moved per step: {format_bytes(sum(a.bytes_out_per_step) // n)} out, "
        f"{format_bytes(sum(a.bytes_in_per_step) // n)} in; stalls {sum(a.stalls_per_step) / n:.1f} "
        f"({sum(a.stall_seconds_per_step) / n * 1e3:.1f} ms) per step; I/O busy "
        f"{sum(a.io_seconds_per_step) / n * 1e3:.1f} ms per step"),
        (f"  latency {a.median_step_seconds * 1e3:.2f} ms vs {a.median_step_seconds_no_swap * 1e3:.2f} ms "
        f"without swap{unsplit} ({a.latency_overhead:+.1%}); results {same} the run without swap{unsplit}"),
        (f"  store: one unlinked file ({a.store.store_fs or 'unknown fs'}, "
        f"{format_bytes(a.store.store_bytes)}); page cache: {a.store.cache}"),
    ]
    return lines
