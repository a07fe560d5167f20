"""Swap accounting of a run: peaks, transfers per step, stalls, latency against no swap."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxplan.executor.prepare import prepare
from onnxplan.executor.runner import run_plan
from onnxplan.planning import PlanOptions
from onnxplan.sizes import format_bytes
from onnxplan.swap import swap_totals

__all__ = ["describe_accounting", "no_swap_options", "swap_accounting"]


def no_swap_options(plan) -> Any:
    """PlanOptions giving `plan` without its swaps: the same order policy, planner, passes."""
    s = plan.settings
    return PlanOptions(order=plan.order_policy, planner=plan.planner, interleave=s.interleave, inplace=s.inplace,
                       time_limit=s.time_limit)


def swap_accounting(req, prep, res, *, steps: int, warmup: int, seed: int, lr: float | None,
                    threads: int | None, baseline: Any = None, xp: Any = np) -> dict:
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
    return {
        "policy": plan.swap.described,
        "planned_peak_bytes": plan.peak_bytes,
        "planned_peak_no_swap_bytes": baseline.peak_bytes,
        "measured_peak_bytes": None,
        "swaps": t["swaps"], "transfers": t["transfers"],
        "planned_bytes_out": t["bytes_out"], "planned_bytes_in": t["bytes_in"],
        "bytes_out_per_step": [s["bytes_out"] for s in per_step],
        "bytes_in_per_step": [s["bytes_in"] for s in per_step],
        "stalls_per_step": [s["stalls"] for s in per_step],
        "stall_seconds_per_step": [s["stall_seconds"] for s in per_step],
        "io_seconds_per_step": [s["io_seconds"] for s in per_step],
        "median_step_seconds": med, "median_step_seconds_no_swap": base,
        "latency_overhead": med / base - 1.0 if base > 0 else float("nan"),
        "same_results_as_no_swap": res.losses == baseline.losses and all(
            np.array_equal(res.params[k], baseline.params[k]) for k in baseline.params),
        "store": {k: res.swap[k] for k in ("store_bytes", "store_fs", "cache")},
    }


def describe_accounting(a: dict) -> list[str]:
    """Lines for the run table."""
    n = max(len(a["bytes_out_per_step"]), 1)
    lines = [
        (f"swap {a['policy']}: {a['swaps']} swaps ({a['transfers']} transfers) per step; planned peak "
        f"{format_bytes(a['planned_peak_bytes'])} vs {format_bytes(a['planned_peak_no_swap_bytes'])} without swap"),
        (f"  moved per step: {format_bytes(sum(a['bytes_out_per_step']) // n)} out, "
        f"{format_bytes(sum(a['bytes_in_per_step']) // n)} in; stalls {sum(a['stalls_per_step']) / n:.1f} "
        f"({sum(a['stall_seconds_per_step']) / n * 1e3:.1f} ms) per step; I/O busy "
        f"{sum(a['io_seconds_per_step']) / n * 1e3:.1f} ms per step"),
        (f"  latency {a['median_step_seconds'] * 1e3:.2f} ms vs {a['median_step_seconds_no_swap'] * 1e3:.2f} ms "
        f"without swap ({a['latency_overhead']:+.1%}); results "
        f"{'bit-identical to' if a['same_results_as_no_swap'] else 'DIFFERENT from'} the run without swap"),
        (f"  store: one unlinked file ({a['store']['store_fs'] or 'unknown fs'}, "
        f"{format_bytes(a['store']['store_bytes'])}); page cache: {a['store']['cache']}"),
    ]
    return lines
