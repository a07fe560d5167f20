"""Benchmark: the joint solver against rotor (recompute on the chain) and swap-only, at a few budgets.

Per model and budget (evenly spaced from rotor's least planned peak, or with --from-swap-floor
from the least of it and of swapping every gap, up to, not including, the plain plan's peak): each strategy's planned peak, whether it fits, its predicted step time (one
profile of our kernels gives every strategy its node costs), the measured median step time
(our executor, `--steps` steps after `--warmup`), and the solve time. The swap store's
bandwidth is measured once (write then read of 64 MiB through a temporary file) unless given.
Run: python benchmarks/bench_joint.py [--models resnet18 transformer] [--small] [--budgets 4]
     [--time-limit 10] [--steps 5] [--bandwidth BYTES_PER_S] [--from-swap-floor] [--no-measure]
     [-o reports/joint.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace

import numpy as np

from onnxplan.artifacts import build_artifacts
from onnxplan.budget import STRATEGIES, ProfiledCosts, attempt, plan_with_checkpoint, predicted_step_seconds
from onnxplan.budget.attempt import step_before_inplace
from onnxplan.executor.runner import run_plan
from onnxplan.ir.load import load_step
from onnxplan.joint.fit import plan_joint
from onnxplan.models import get_model
from onnxplan.planning import PlanOptions, plan_step


def measure_bandwidth(nbytes: int = 64 << 20) -> float:
    """Bytes/s of a write then a read of `nbytes` through an unlinked temporary file (the
    slower of the two), as the swap store moves bytes."""
    buf = np.ones(nbytes, dtype=np.uint8)
    out = np.empty_like(buf)
    with tempfile.TemporaryFile() as f:
        fd = f.fileno()
        t0 = time.perf_counter()
        os.pwrite(fd, buf, 0)
        t1 = time.perf_counter()
        os.preadv(fd, [out], 0)
        t2 = time.perf_counter()
    return nbytes / max(t1 - t0, t2 - t1, 1e-9)


def _measure(folder, plan, steps: int, warmup: int) -> float | None:
    if not steps:
        return None
    res = run_plan(str(folder), plan, steps=steps, warmup=warmup)
    return statistics.median(res.step_seconds)


def bench_model(name: str, args, bandwidth: float) -> list[dict]:
    from tests.zoo_small import SMALL

    model = get_model(name)
    fm = model.builder(**SMALL[name]) if args.small else model.builder()
    folder = build_artifacts(fm, None, optimizer=model.default_optimizer)
    graph = load_step(folder)
    opts = PlanOptions()
    plain = plan_step(graph, opts)
    profiled = ProfiledCosts()  # one profile (cached) gives every strategy its node costs
    times, note = profiled.times(step_before_inplace(graph, opts))
    costs = dict(times.measured)
    least = plan_with_checkpoint(graph, opts, "rotor", profiled).plan.peak_bytes
    if args.from_swap_floor:
        least = min(least, attempt(graph, replace(opts, swap="proactive")).plan.peak_bytes)
    top = plain.plan.peak_bytes
    budgets = [int(least + k * (top - least) / args.budgets) for k in range(args.budgets)]
    rows = []
    base_measured = _measure(folder, plain.plan, args.steps, args.warmup)
    rows.append({"model": name, "budget": top, "strategy": "plain", "peak": top, "fits": True,
                 "predicted": predicted_step_seconds(plain, times), "measured": base_measured, "solve": 0.0,
                 "note": note})
    for budget in budgets:
        cands = {}
        t0 = time.perf_counter()
        cands["rotor"] = (STRATEGIES["recompute"](graph, budget, profiled, None, opts), None)
        cands["rotor"] += (time.perf_counter() - t0,)
        t0 = time.perf_counter()
        cands["swap"] = (STRATEGIES["swap"](graph, budget, profiled, None, opts), None, time.perf_counter() - t0)
        for label, bw in (("joint-recompute", None), ("joint", bandwidth)):
            t0 = time.perf_counter()
            out, sched = plan_joint(graph, budget, opts, costs=costs, swap_bandwidth=bw, time_limit=args.time_limit,
                                    swap_on_top=bw is not None)
            cands[label] = (out, sched, time.perf_counter() - t0)
        for label, (out, sched, solve) in cands.items():
            if label == "rotor":
                predicted = out.plan.checkpoint.predicted_step_seconds if out.plan.checkpoint else None
            elif sched is not None:
                predicted = out.plan.joint.predicted_step_seconds
            else:
                predicted = predicted_step_seconds(out, times)
            fits = out.plan.peak_bytes <= budget
            measured = _measure(folder, out.plan, args.steps, args.warmup) if fits else None
            extra = ""
            if sched is not None:
                j = out.plan.joint
                gap = "none" if j.gap is None else f"{j.gap:.2f}"
                extra = (f"{j.status} gap {gap}, model {j.estimate_bytes / 2**20:.2f} MiB, "
                         f"{j.recomputations} recomputations, {len(out.plan.swaps)} swaps, {len(j.rounds)} rounds"
                         + ("; then swap auto" if any("swap auto" in n for n in j.notes) else ""))
            rows.append({"model": name, "budget": budget, "strategy": label, "peak": out.plan.peak_bytes,
                         "fits": fits, "predicted": predicted, "measured": measured, "solve": solve, "note": extra})
            print(_row(rows[-1]), flush=True)
    return rows


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _row(r: dict) -> str:
    err = ("-" if r["measured"] is None or r["predicted"] is None
           else f"{r['predicted'] / r['measured'] - 1:+.0%}")
    return (f"| {r['model']} | {r['budget'] / 2**20:.2f} | {r['strategy']} | {r['peak'] / 2**20:.2f} | "
            f"{'yes' if r['fits'] else 'no'} | {_ms(r['predicted'])} | {_ms(r['measured'])} | {err} | "
            f"{r['solve']:.1f} | {r['note']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "transformer"])
    ap.add_argument("--small", action="store_true", help="the CI sizes of tests/zoo_small.py")
    ap.add_argument("--budgets", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bandwidth", type=float, default=None)
    ap.add_argument("--from-swap-floor", action="store_true")
    ap.add_argument("--no-measure", action="store_true", help="plan and predict only")
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    bandwidth = args.bandwidth or measure_bandwidth()
    if args.no_measure:
        args.steps = 0
    head = [(f"swap store bandwidth {bandwidth / 1e9:.2f} GB/s ({'given' if args.bandwidth else 'measured'}); "
            f"solver time limit {args.time_limit:.0f} s; median of {args.steps} steps after {args.warmup} warm-up"),
            "",
            ("| model | budget MiB | strategy | planned peak MiB | fits | predicted ms | measured ms | pred/meas | "
            "plan s | joint |"),
            "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(head), flush=True)
    rows = []
    for name in args.models:
        rows += bench_model(name, args, bandwidth)
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n".join(head + [_row(r) for r in rows]) + "\n")


if __name__ == "__main__":
    main()
