"""Benchmark: checkpoint policies under 10 memory limits (smallest feasible .. no-recompute peak).

For each model: plan without recomputation (its peak is the top limit) and with each policy's
least-memory schedule (the smallest of them is the bottom limit); then for 10 limits evenly
spaced between, plan sqrt, chen and rotor with --budget LIMIT and, unless --no-run, run each
plan that fits: each distinct plan 5 rounds (interleaved with the other plans) of 3 steps
after 1 warm-up, timed in CPU seconds of this process with one BLAS thread (the best step;
wall seconds too: a shared machine makes them noisy), and once in a fresh process for the
measured peak (the peak probe). Predicted step times come from one
profile of our kernels per model (the fastest of 3 timed steps, node by node, same clock).
Prints a Markdown table (planned and measured peak, predicted and measured step time), the
throughput gain of rotor over the best other policy that fits at each limit, and how close
the predictions came.

Run: python benchmarks/bench_checkpoint.py [--models resnet18 transformer] [--batch 64]
     [--no-run] [--threads 1] [--out reports/checkpoint-bench.md]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

from onnxplan.sizes import format_bytes

POLICIES = ("sqrt", "chen", "rotor")
CLOCK = "cpu"  # step and profile times: CPU seconds of this process (one BLAS thread)


def _plan(graph, opts, policy: str | None = None):
    """The plain plan, or the plan of a checkpoint policy under opts.budget (profiled stage times)."""
    from onnxplan.budget import ProfiledCosts, attempt, plan_with_checkpoint

    t0 = time.perf_counter()
    out = attempt(graph, opts) if policy is None else plan_with_checkpoint(graph, opts, policy, ProfiledCosts(clock=CLOCK))
    return out, time.perf_counter() - t0


def _time_steps(prep, steps: int, params: dict, batches: list) -> tuple[list[float], list[float], list[float]]:
    """One warm-up step, the initial state again, then `steps` steps: (losses, CPU s, wall s).
    CPU seconds of this process with one BLAS thread: robust on a shared machine."""
    from onnxplan.executor.runner import Executor

    ex = Executor(prep.graph, prep.plan)
    ex.load_state(params)
    ex.step(batches[0])
    ex.load_state(params)
    losses, cpu, wall = [], [], []
    for k in range(steps):
        t0, w0 = time.process_time(), time.perf_counter()
        losses.append(ex.step(batches[k]))
        cpu.append(time.process_time() - t0)
        wall.append(time.perf_counter() - w0)
    return losses, cpu, wall


def _measure(folder, preps: dict, steps: int, rounds: int) -> dict:
    """Each distinct plan: `rounds` rounds of `steps` steps, the plans interleaved round by
    round (so a busy moment of the machine does not fall on one plan); the best step; then
    once in a fresh process for the measured peak."""
    from onnxplan.executor.measure import measure_run
    from onnxplan.executor.runner import initial_parameters, step_batches

    params, batches = initial_parameters(folder), step_batches(folder, steps, 0)
    out = {key: {"cpu": [], "wall": []} for key in preps}
    for _ in range(rounds):
        for key, prep in preps.items():
            losses, cpu, wall = _time_steps(prep, steps, params, batches)
            out[key]["losses"] = losses
            out[key]["cpu"] += cpu
            out[key]["wall"] += wall
    for key, prep in preps.items():
        _, out[key]["measured_peak"] = measure_run(str(folder), None, steps=1, warmup=0, prepared=prep)
        out[key]["step_seconds"] = min(out[key].pop("cpu"))
        out[key]["wall_step_seconds"] = min(out[key].pop("wall"))
    return out


def bench_model(name: str, batch: int, run: bool, steps: int, planner: str, limits: int,
                rounds: int) -> list[dict]:
    from onnxplan.budget import price
    from onnxplan.executor.prepare import Prepared
    from onnxplan.executor.profile import profile_times
    from onnxplan.loading import load_step
    from onnxplan.loading.request import LoadRequest
    from onnxplan.loading.resolve import resolve_artifacts
    from onnxplan.pipeline import run_pipeline
    from onnxplan.planning import PlanOptions

    req = LoadRequest(name, batch)
    folder = resolve_artifacts(req)
    graph = load_step(req)
    base_opts = PlanOptions(planner=planner)
    plain, secs = _plan(graph, base_opts)
    times, _ = profile_times(run_pipeline(graph, ["realize", "interleave"])[0], clock=CLOCK)

    def key(o):
        return o.plan.passes, o.plan.order

    preps = {key(plain): Prepared(folder, plain.graph, plain.plan)}
    rows = [{"model": name, "batch": batch, "policy": "none", "limit": None, "planned_peak": plain.plan.peak_bytes,
             "plan_seconds": secs, "predicted": price(plain, times).seconds, "key": key(plain)}]
    least = {p: _plan(graph, base_opts, p)[0].plan.peak_bytes for p in POLICIES}
    bottom, top = min(least.values()), plain.plan.peak_bytes
    for k in range(limits):
        limit = int(bottom + (top - bottom) * k / (limits - 1))
        for policy in POLICIES:
            out, secs = _plan(graph, replace(base_opts, budget=limit), policy)
            ck = out.plan.checkpoint
            row = {"model": name, "batch": batch, "policy": policy, "limit": limit,
                   "planned_peak": out.plan.peak_bytes, "fits": out.plan.peak_bytes <= limit,
                   "predicted": price(out, times).seconds, "chain_time": ck.chain_time_seconds if ck else None,
                   "schedule": ck.schedule if ck else "", "plan_seconds": secs, "key": key(out)}
            if row["fits"]:
                preps.setdefault(key(out), Prepared(folder, out.graph, out.plan))
            rows.append(row)
            print(json.dumps({k2: v for k2, v in row.items() if k2 not in ("schedule", "key")}), flush=True)
    if run:
        measured = _measure(folder, preps, steps, rounds)
        ref = measured[key(plain)]["losses"]
        for row in rows:
            m = measured.get(row["key"]) if row.get("fits", True) else None
            if m is not None:
                row.update(m)
                row["same_numbers"] = m["losses"] == ref
    for row in rows:
        row.pop("key")
    return rows


def table(rows: list[dict]) -> str:
    head = ("| model | limit | policy | planned peak | measured peak | predicted step | measured step | "
            "predicted / measured | same loss | note |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mp = format_bytes(r["measured_peak"]) if r.get("measured_peak") else "-"
        ms = f"{r['step_seconds'] * 1e3:.1f} ms" if r.get("step_seconds") else "-"
        ratio = f"{r['predicted'] / r['step_seconds'] - 1:+.1%}" if r.get("step_seconds") else "-"
        same = {True: "yes", False: "NO", None: "-"}[r.get("same_numbers")] if r["limit"] else "(reference)"
        note = "" if r.get("fits", True) else "misses the limit"
        lim = format_bytes(r["limit"]) if r["limit"] else "(none)"
        lines.append(f"| {r['model']} b{r['batch']} | {lim} | {r['policy']} | {format_bytes(r['planned_peak'])} | "
                     f"{mp} | {r['predicted'] * 1e3:.1f} ms | {ms} | {ratio} | {same} | {note} |")
    measured = [r for r in rows if r.get("step_seconds")]
    if measured:
        err = [abs(r["predicted"] / r["step_seconds"] - 1) for r in measured]
        lines.append(f"\npredicted vs measured step time: {sum(e <= 0.15 for e in err)} of {len(err)} rows within "
                     f"15%, mean absolute error {sum(err) / len(err):.1%}, worst {max(err):.1%}")
    return "\n".join(lines)


def gains(rows: list[dict], key: str) -> list[tuple]:
    """(model, limit, rotor time, best other time) where rotor and another policy fit."""
    out = []
    by = {}
    for r in rows:
        if r["limit"] is not None and r.get("fits") and r.get(key):
            by.setdefault((r["model"], r["limit"]), {})[r["policy"]] = r[key]
    for (model, limit), t in sorted(by.items()):
        others = [v for p, v in t.items() if p != "rotor"]
        if "rotor" in t and others:
            out.append((model, limit, t["rotor"], min(others)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "transformer"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--limits", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="rounds over the distinct plans, interleaved")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (parent and probe)")
    ap.add_argument("--planner", default="best-fit")
    ap.add_argument("--no-run", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)  # the probe's children read it
    from onnxplan.threads import use_threads

    use_threads(args.threads)
    rows = []
    for m in args.models:
        rows += bench_model(m, args.batch, not args.no_run, args.steps, args.planner, args.limits, args.rounds)
    text = table(rows)
    for key, what in (("predicted", "predicted"), ("step_seconds", "measured")):
        g = gains(rows, key)
        if g:
            ratio = [other / rot - 1 for _, _, rot, other in g]
            worse = sum(1 for _, _, rot, other in g if rot > other * 1.0001)
            text += (f"\n\nrotor vs the best other policy that fits ({what} step time): average throughput gain "
                     f"{sum(ratio) / len(ratio):+.1%} over {len(g)} limits; rotor slower at {worse} of them")
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
