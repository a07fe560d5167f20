"""Benchmark: the joint solver against rotor (recompute on the chain) and swap-only, measured.

Per model, at `--budgets` budgets evenly spaced from the least feasible one (the least planned
peak any strategy reaches: rotor's least schedule, swap's floor, the joint model's least
memory) up to the plain plan's peak, both included, four strategies are planned:
  rotor            the budget layer's "recompute" strategy (rotor on the chain);
  swap             the budget layer's "swap" strategy (the swap module's own policy);
  joint            onnxplan.joint (recompute on the DAG and paging), at the swap store's bandwidth;
  joint-recompute  the same with swap disabled (recompute on the DAG alone).
Each row: planned peak, whether it fits, predicted step seconds (one profile of our kernels, CPU
clock, one thread, gives every strategy its node costs; rotor's and joint's own predictions,
swap's the budget layer's: transfers at memory bandwidth, no overlap), the wall time of planning
(joint: every round, placement included) and the joint solver's status and gap.
Measurement: every distinct fitting plan and the plain plan run in one process, one BLAS/torch
thread, `--rounds` rounds, the plans' order rotated each round; each round runs `--steps` steps
after one warm-up and keeps its fastest step (what the profile also keeps), in wall time and in
this process's CPU time (the I/O worker's included, its waits not). Reported: the median over
rounds (wall), the spread (max - min) / median over rounds, the median over rounds of the step /
the plain step of the same round, the CPU-time median, and predicted / measured (wall).
The swap store's bandwidth is measured once (write, flush, drop, read of 64 MiB, as the swap
store moves bytes) unless given.

Models are NAME:BATCH, NAME a zoo model or `densenet` (models/densenet.py: a DenseNet-BC
written in PyTorch and exported with torch.onnx.export).
Run: PYTHONPATH=. python benchmarks/bench_joint.py --models resnet18:4 transformer:16 gpt:16 densenet:8
     [--budgets 10] [--time-limit 10] [--rounds 3] [--steps 3] [--bandwidth B] [--no-measure]
     [--json reports/joint.json] [-o reports/joint-table.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

from onnxplan.artifacts import build_artifacts
from onnxplan.budget import STRATEGIES, ProfiledCosts, predicted_step_seconds
from onnxplan.budget.attempt import step_before_inplace
from onnxplan.executor.prepare import Prepared, adopt_plan
from onnxplan.executor.runner import run_plan
from onnxplan.executor.threads import set_blas_threads
from onnxplan.ir.load import load_step
from onnxplan.joint.fit import plan_joint
from onnxplan.models import get_model
from onnxplan.planning import PlanOptions, plan_step

STRATEGY_NAMES = ("rotor", "swap", "joint", "joint-recompute")


def measure_bandwidth(nbytes: int = 64 << 20) -> float:
    """Bytes/s of moving `nbytes` through an unlinked temporary file as the swap store does
    (onnxplan.executor.swap_io): a write flushed to the device and dropped from the page
    cache, then a read; the slower of the two."""
    buf = np.ones(nbytes, dtype=np.uint8)
    out = np.empty_like(buf)
    with tempfile.TemporaryFile() as f:
        fd = f.fileno()
        t0 = time.perf_counter()
        os.pwrite(fd, buf, 0)
        os.fdatasync(fd)
        t1 = time.perf_counter()
        os.posix_fadvise(fd, 0, nbytes, os.POSIX_FADV_DONTNEED)
        t2 = time.perf_counter()
        os.preadv(fd, [out], 0)
        t3 = time.perf_counter()
    return nbytes / max(t1 - t0, t3 - t2, 1e-9)


def model_folder(spec: str):
    """(label, artifact folder) of NAME:BATCH."""
    name, _, batch = spec.partition(":")
    batch = int(batch) if batch else None
    if name == "densenet":
        from onnxplan.models.densenet import densenet_artifacts

        return f"densenet b{batch or 8}", densenet_artifacts(batch or 8)
    model = get_model(name)
    fm = model.builder(batch=batch) if batch else model.builder()
    return f"{name} b{batch or model.default_batch}", build_artifacts(fm, None, optimizer=model.default_optimizer)


def _joint_note(out, sched) -> str:
    j = out.plan.joint
    gap = "none" if j.gap is None else f"{j.gap:.2f}"
    solve = sum(r["solve_seconds"] for r in j.rounds)
    return (f"{j.status} gap {gap}; CP-SAT {solve:.1f} s in {len(j.rounds)} round(s); model "
            f"{j.estimate_bytes / 2**20:.2f} MiB; {j.recomputations} recomputations, {len(out.plan.swaps)} swaps"
            + ("; then swap auto" if any("swap auto" in n for n in j.notes) else ""))


def plan_model(label: str, folder, args, bandwidth: float) -> tuple[list[dict], dict]:
    """The rows of one model (not yet measured) and the plans to measure (key -> Plan)."""
    graph = load_step(folder)
    opts = PlanOptions()
    plain = plan_step(graph, opts)
    profiled = ProfiledCosts(clock="cpu")  # one profile (cached) gives every strategy its node costs
    times, note = profiled.times(step_before_inplace(graph, opts))
    costs = dict(times.measured)
    top = plain.plan.peak_bytes

    def joint(budget, bw):
        return plan_joint(graph, budget, opts, costs=costs, swap_bandwidth=bw, time_limit=args.time_limit,
                          swap_on_top=bw is not None)

    t0 = time.perf_counter()
    floors = {"rotor": STRATEGIES["recompute"](graph, plain.plan.persistent_bytes, profiled, None, opts),
              "swap": STRATEGIES["swap"](graph, plain.plan.persistent_bytes, profiled, None, opts),
              "joint": joint(plain.plan.persistent_bytes, bandwidth)[0]}
    least = min(o.plan.peak_bytes for o in floors.values())
    print(f"# {label}: plain {top / 2**20:.2f} MiB; floors "
          + ", ".join(f"{k} {o.plan.peak_bytes / 2**20:.2f}" for k, o in floors.items())
          + f" MiB ({time.perf_counter() - t0:.0f} s)", flush=True)
    n = max(2, args.budgets)
    budgets = [int(least + k * (top - least) / (n - 1)) for k in range(n)]
    plans = {"plain": plain.plan}
    rows = [{"model": label, "budget": top, "strategy": "plain", "peak": top, "fits": True,
             "predicted": predicted_step_seconds(plain, times), "plan_seconds": 0.0, "key": "plain",
             "note": note}]
    for budget in budgets:
        for strategy in STRATEGY_NAMES:
            t0 = time.perf_counter()
            note, gap = "", None
            if strategy == "rotor":
                out = STRATEGIES["recompute"](graph, budget, profiled, None, opts)
                c = out.plan.checkpoint
                predicted = c.predicted_step_seconds if c and c.predicted_step_seconds else predicted_step_seconds(
                    out, times)
            elif strategy == "swap":
                out = STRATEGIES["swap"](graph, budget, profiled, None, opts)
                predicted = predicted_step_seconds(out, times)
                note = f"{len(out.plan.swaps)} swaps" + (" (split grads)" if any(
                    "split" in x for x in out.plan.passes) else "")
            else:
                out, sched = joint(budget, bandwidth if strategy == "joint" else None)
                predicted = out.plan.joint.predicted_step_seconds
                note, gap = _joint_note(out, sched), out.plan.joint.gap
            secs = time.perf_counter() - t0
            fits = out.plan.peak_bytes <= budget
            key = None
            if fits:
                key = str(hash((tuple(out.plan.order), out.plan.arena_bytes, out.plan.passes)))
                plans.setdefault(key, out.plan)
            rows.append({"model": label, "budget": budget, "strategy": strategy, "peak": out.plan.peak_bytes,
                         "fits": fits, "predicted": predicted, "plan_seconds": secs, "key": key, "gap": gap,
                         "note": note})
            print(_row(rows[-1]), flush=True)
    return rows, plans


def measure(folder, plans: dict, rounds: int, steps: int) -> dict[str, dict]:
    """key -> {"rounds": fastest step per round, "vs_plain": per round its step / plain's}."""
    preps = {k: Prepared(folder, adopt_plan(load_step(folder), p), p) for k, p in plans.items()}
    keys = list(preps)
    got: dict[str, list[float]] = {k: [] for k in keys}
    cpu: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        turn = keys[r % len(keys):] + keys[: r % len(keys)]
        for k in turn:
            ticks: list[tuple[str, float]] = []
            res = run_plan(folder, preps[k].plan, steps=steps, warmup=1, prepared=preps[k], threads=1,
                           on_step=lambda text: ticks.append((text, time.process_time())))
            end = time.process_time()
            starts = [t for text, t in ticks if text.startswith("step")] + [end]
            got[k].append(min(res.step_seconds))
            cpu[k].append(min(b - a for a, b in zip(starts, starts[1:])))
        print(f"#   round {r + 1}/{rounds} measured ({os.getloadavg()[0]:.1f} load)", flush=True)
    return {k: {"rounds": v, "cpu": cpu[k], "vs_plain": [a / b for a, b in zip(v, got["plain"])]}
            for k, v in got.items()}


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _row(r: dict) -> str:
    m = r.get("measured")
    err = "-" if m is None or r["predicted"] is None else f"{r['predicted'] / m - 1:+.0%}"
    spread = "-" if r.get("spread") is None else f"{r['spread']:.0%}"
    vs = "-" if r.get("vs_plain") is None else f"{r['vs_plain']:.2f}"
    return (f"| {r['model']} | {r['budget'] / 2**20:.2f} | {r['strategy']} | {r['peak'] / 2**20:.2f} | "
            f"{'yes' if r['fits'] else 'no'} | {_ms(r['predicted'])} | {_ms(m)} | {spread} | {vs} | "
            f"{_ms(r.get('cpu'))} | {err} | {r['plan_seconds']:.1f} | {r['note']} |")


HEAD = ("| model | budget MiB | strategy | planned peak MiB | fits | predicted ms | measured ms | spread | "
        "/ plain | CPU ms | pred/meas | plan s | notes |")


def summarize(rows: list[dict]) -> list[str]:
    """Markdown: per model and budget, each strategy's measured step / the plain step of the same
    round (median over rounds; '-' where its plan misses the budget), joint against the best
    single strategy, and the verdict (within the larger spread of the two counts as equal); then
    per model the predicted / measured errors, raw and relative to the plain step (predicted
    step / predicted plain against measured step / measured plain)."""
    out = []
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    for model, rs in by_model.items():
        plain = next(r for r in rs if r["strategy"] == "plain")
        out += [f"**{model}** (plain: {plain['peak'] / 2**20:.2f} MiB, measured {_ms(plain.get('measured'))} ms, "
                f"predicted {_ms(plain['predicted'])} ms)", "",
                "each cell: wall step / plain (median over rounds) ±spread · CPU step / plain CPU step; "
                "'-': the plan misses the budget", "",
                "| budget MiB | rotor | swap | joint | joint-recompute | best single (wall) | joint / best: wall · CPU "
                "| verdict |",
                "|---|---|---|---|---|---|---|---|"]
        budgets = sorted({r["budget"] for r in rs if r["strategy"] != "plain"})
        for b in budgets:
            at = {r["strategy"]: r for r in rs if r["budget"] == b and r["strategy"] != "plain"}

            def cell(name):
                r = at.get(name)
                if r is None or not r["fits"]:
                    return "-"
                if r.get("vs_plain") is None:
                    return "fits"
                return f"{r['vs_plain']:.2f} ±{r['spread']:.0%} · {r['cpu'] / plain['cpu']:.2f}"

            singles = [at[n] for n in ("rotor", "swap") if n in at and at[n]["fits"] and at[n].get("vs_plain")]
            j = at.get("joint")
            best = min(singles, key=lambda r: r["vs_plain"]) if singles else None
            if j is None or not j["fits"] or j.get("vs_plain") is None:
                verdict, ratio = ("none fits" if best is None else "joint misses"), "-"
            elif best is None:
                verdict, ratio = "only joint fits", "-"
            else:
                q = j["vs_plain"] / best["vs_plain"]
                tol = max(j["spread"], best["spread"])
                verdict = "better" if q < 1 - tol else ("worse" if q > 1 + tol else "equal within spread")
                qc = j["cpu"] / min(r["cpu"] for r in singles)
                ratio = f"{q:.2f} · {qc:.2f}"
                verdict += f"; CPU {'better' if qc < 0.95 else 'worse' if qc > 1.05 else 'equal'}"
            out.append(f"| {b / 2**20:.2f} | {cell('rotor')} | {cell('swap')} | {cell('joint')} | "
                       f"{cell('joint-recompute')} | {best['strategy'] if best else '-'} | {ratio} | {verdict} |")
        measured = [r for r in rs if r.get("measured") and r["predicted"]]
        if measured and plain.get("measured"):
            for what, errs in (("wall", [r["predicted"] / r["measured"] - 1 for r in measured]),
                               ("CPU", [r["predicted"] / r["cpu"] - 1 for r in measured])):
                out += ["", f"predicted / measured {what} - 1 over {len(measured)} rows: median "
                        f"{statistics.median(errs):+.0%}, within 15% on {sum(abs(x) <= 0.15 for x in errs)}; worst "
                        + ", ".join(f"{r['strategy']} at {r['budget'] / 2**20:.2f} MiB {x:+.0%}"
                                    for x, r in sorted(zip(errs, measured), key=lambda xr: -abs(xr[0]))[:4])]
            for name in ("rotor", "swap", "joint", "joint-recompute"):
                errs = [r["predicted"] / r["cpu"] - 1 for r in measured if r["strategy"] == name]
                if errs:
                    out.append(f"- {name}: predicted / CPU - 1 median {statistics.median(errs):+.0%}, "
                               f"range {min(errs):+.0%} .. {max(errs):+.0%}")
        out.append("")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18:4", "transformer:16", "gpt:16", "densenet:8"])
    ap.add_argument("--budgets", type=int, default=10)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bandwidth", type=float, default=None)
    ap.add_argument("--no-measure", action="store_true", help="plan and predict only")
    ap.add_argument("--json", default=None, help="append every row as a JSON line")
    ap.add_argument("-o", "--output", default=None)
    ap.add_argument("--summarize", nargs="+", default=None, metavar="JSON",
                    help="print the summary tables of rows written by --json, and stop")
    args = ap.parse_args()
    if args.summarize:
        rows = [json.loads(line) for path in args.summarize for line in open(path) if line.strip()]
        print("\n".join(summarize(rows)))
        return
    set_blas_threads(1)
    bandwidth = args.bandwidth or measure_bandwidth()
    head = [(f"swap store bandwidth {bandwidth / 1e9:.2f} GB/s ({'given' if args.bandwidth else 'measured'}); "
             f"CP-SAT time limit {args.time_limit:.0f} s per round; {args.rounds} rounds x fastest of "
             f"{args.steps} steps after 1 warm-up; one thread; load average at start "
             f"{os.getloadavg()[0]:.1f}"), "", HEAD, "|" + "---|" * 13]
    print("\n".join(head), flush=True)
    every = []
    for spec in args.models:
        label, folder = model_folder(spec)
        rows, plans = plan_model(label, folder, args, bandwidth)
        if not args.no_measure:
            got = measure(folder, plans, args.rounds, args.steps)
            for r in rows:
                if r["key"] in got:
                    g = got[r["key"]]
                    r["measured"] = statistics.median(g["rounds"])
                    r["spread"] = (max(g["rounds"]) - min(g["rounds"])) / r["measured"]
                    r["vs_plain"] = statistics.median(g["vs_plain"])
                    r["rounds"] = g["rounds"]
                    r["cpu"] = statistics.median(g["cpu"])
        r_load = os.getloadavg()[0]
        for r in rows:
            r["load"] = r_load
            print(_row(r), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
        every += rows
        if args.output:
            with open(args.output, "w") as f:
                f.write("\n".join(head + [_row(r) for r in every]) + "\n")


if __name__ == "__main__":
    main()
