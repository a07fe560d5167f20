"""Benchmark: step time and measured peak from the split floor up to the plain peak (issue 28).

Per model (NAME:BATCH), budgets from the least a split plan reaches to the plain plan's peak:
  split floor     the split floor (+16 KiB: budget/split.py, every node's smallest chunk or, where
                  it does not split, its whole working set), the least any plan reaches;
  between         `--between` budgets spaced evenly (geometrically) from there to the unsplit floor;
  unsplit floor   swap's floor without splitting (+16 KiB): the least an unsplit plan reaches, the
                  pair of every budget below it (no unsplit plan fits there);
  above           the midpoint (geometric) from the unsplit floor to the plain peak;
  plain           no budget: the default in-memory plan.
Each budget's plan is the one `onnxplan plan --budget` makes (api.solve, the default decision).
Every distinct plan (benchmarks/decision.py's fingerprint) is measured in a fresh process per
round (onnxplan.bench.measure.measure_plan: its measured peak, and `--steps` steps after one
warm-up at `--threads`, default every core as `run`), `--rounds` rounds with the plans' order
rotated; a round keeps its process's fastest step. Reported per budget: planned and measured
peak, the nodes split (and the largest K), the median over rounds of the fastest step, and the
ratio to the unsplit floor's plan and to the plain plan, paired by round. A floor whose plan
misses it (the floor named is not reached) is replaced by that plan's peak, and the row says so.

Run: PYTHONPATH=. python benchmarks/split_steps.py [--models transformer:16 gpt:16 resnet18:16]
     [--rounds 3] [--steps 2] [--threads N] [--json reports/split-steps.json] [-o reports/split-steps.md]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from pathlib import Path
from unittest import mock

import onnxplan
from benchmarks.decision import fingerprint
from onnxplan.api import solve
from onnxplan.bench.measure import measure_plan
from onnxplan.budget import MemoryRequest, plan_for_budget
from onnxplan.planning import PlanOptions
from onnxplan.sizes import format_bytes
from onnxplan.swap.driver import Floor

MODELS = ("transformer:16", "gpt:16", "resnet18:16")
EPS = 16 << 10  # above a floor: the planners' alignment


def swap_floor(step, split: bool) -> Floor:
    """The least swap reaches (budget/split.py: with `split`, the floor of every split plan, set
    by a node's smallest chunk or a node that does not split; without, the unsplit graph's): its
    bound and the node behind it."""
    with contextlib.ExitStack() as stack:
        if not split:
            stack.enter_context(mock.patch("onnxplan.budget.strategies.split_to_fit", lambda g, o, swapped: swapped))
        res = plan_for_budget(step.graph, PlanOptions(), MemoryRequest(budget=1, strategy="swap"))
    assert res.swap is not None and res.swap.floor is not None
    return res.swap.floor


def budgets(step, plain_peak: int, between: int) -> list[tuple[str, int | None]]:
    """(label, budget) from the split floor up; None: no budget (the plain plan)."""
    unsplit = swap_floor(step, split=False).bound + EPS
    lowest = swap_floor(step, split=True).bound + EPS
    out: list[tuple[str, int | None]] = [("split floor", lowest)]
    if lowest < unsplit:
        ratio = unsplit / lowest
        out += [(f"between {i}/{between + 1}", int(lowest * ratio ** (i / (between + 1))))
                for i in range(1, between + 1)]
    out.append(("unsplit floor", unsplit))
    if unsplit < plain_peak:
        out.append(("above", int((unsplit * plain_peak) ** 0.5)))
    out.append(("plain", None))
    return out


def split_summary(plan) -> str:
    if not plan.splits:
        return "-"
    ks = [s.k for s in plan.splits]
    return f"{len(ks)} nodes (K <= {max(ks)})"


def bench_model(spec: str, args) -> dict:
    name, _, batch = spec.partition(":")
    step = onnxplan.load(name, batch=int(batch) if batch else None)
    plain = solve(step).plan
    rows, plans = [], {}
    for label, budget in budgets(step, plain.peak_bytes, args.between):
        t0 = time.perf_counter()
        plan = plain if budget is None else solve(step, PlanOptions(), MemoryRequest(budget=budget)).plan
        missed = None
        if budget is not None and plan.peak_bytes > budget:  # a floor no plan reaches: the least one that does
            missed, budget = budget, plan.peak_bytes
            plan = solve(step, PlanOptions(), MemoryRequest(budget=budget)).plan
            assert plan.peak_bytes <= budget, f"{spec} {label}: {plan.peak_bytes} B over {budget} B twice"
        key = fingerprint(plan)
        plans.setdefault(key, plan)
        rows.append({"label": label, "budget": budget, "missed": missed, "planned_peak": plan.peak_bytes, "plan": key,
                     "splits": split_summary(plan), "swaps": len(plan.swaps),
                     "plan_seconds": time.perf_counter() - t0})
        print(f"# {spec} {label}: budget {format_bytes(budget) if budget else '-'}, planned "
              f"{format_bytes(plan.peak_bytes)}, splits {rows[-1]['splits']}", flush=True)
    keys = list(plans)
    times: dict[str, list[float]] = {k: [] for k in keys}
    peaks: dict[str, list[int]] = {k: [] for k in keys}
    for r in range(args.rounds):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            m = measure_plan(step.folder, plans[k], args.steps, warmup=1, threads=args.threads)
            times[k].append(m.get("min_step_seconds") or float("nan"))
            if m.get("measured_peak_bytes"):
                peaks[k].append(m["measured_peak_bytes"])
    pair = next(r["plan"] for r in rows if r["label"] == "unsplit floor")
    for row in rows:
        k = row["plan"]
        row["median_step"] = statistics.median(times[k])
        row["measured_peak"] = max(peaks[k]) if peaks[k] else None
        row["vs_unsplit_floor"] = statistics.median(a / b for a, b in zip(times[k], times[pair]))
        row["vs_plain"] = statistics.median(a / b for a, b in zip(times[k], times[fingerprint(plain)]))
    return {"model": spec, "plain_peak": plain.peak_bytes, "rows": rows}


def summarize(doc: dict) -> list[str]:
    m = doc["machine"]
    out = ["# Split plans: step time from the split floor to the plain peak (benchmarks/split_steps.py)", "",
           f"{m['cpus']} CPUs, load {m['load_start']} at the start, {m['load_end']} at the end; threads "
           f"{doc['threads'] or 'every core (the default)'}; {doc['rounds']} rounds x {doc['steps']} steps after a "
           f"warm-up, one fresh process per plan per round; {doc['wall_seconds'] / 60:.1f} min.", "",
           "| model | budget | planned | measured | splits | swaps | median step ms | / unsplit floor | / plain |",
           "|---|---|---|---|---|---|---|---|---|"]
    for model in doc["models"]:
        for r in model["rows"]:
            budget = format_bytes(r["budget"]) if r["budget"] else "none"
            if r.get("missed"):
                budget += f" (the floor named, {format_bytes(r['missed'])}, missed)"
            measured = format_bytes(r["measured_peak"]) if r["measured_peak"] else "-"
            out.append(f"| {model['model']} | {r['label']}: {budget} | {format_bytes(r['planned_peak'])} | {measured} "
                       f"| {r['splits']} | {r['swaps']} | {r['median_step'] * 1e3:.1f} | {r['vs_unsplit_floor']:.2f} "
                       f"| {r['vs_plain']:.2f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--between", type=int, default=2, help="budgets between the split and the unsplit floor")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default="reports/split-steps.json")
    ap.add_argument("-o", "--out", default="reports/split-steps.md")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.between < 0:
        ap.error("--rounds and --steps must be >= 1, --between >= 0")
    t0, load = time.perf_counter(), round(os.getloadavg()[0], 2)
    doc: dict = {"rounds": args.rounds, "steps": args.steps, "threads": args.threads, "models": []}
    for spec in args.models:
        doc["models"].append(bench_model(spec, args))
        doc["machine"] = {"host": platform.node(), "cpus": os.cpu_count(), "load_start": load,
                          "load_end": round(os.getloadavg()[0], 2)}
        doc["wall_seconds"] = time.perf_counter() - t0
        Path(args.json).write_text(json.dumps(doc, indent=1))
    Path(args.out).write_text("\n".join(summarize(doc)) + "\n")
    print("\n".join(summarize(doc)))


if __name__ == "__main__":
    main()
