"""Benchmark: the budget layer's choice (onnxplan.budget.decide) against measurement.

Per model (NAME:BATCH; default a spread of the zoo at small batches), up to `--per-model`
budgets where the recompute, swap and joint strategies all fit: budgets persistent + f x arena
of the plain plan, f from `--fractions` in turn, kept when all three fit. At each budget:
  chosen      the plan onnxplan.plan(budget=...) makes (api.solve: the default cost model,
              budget.decide.DEFAULT_PROFILE, at one thread), and the strategy it records;
  other       the plan the other cost model (profile <-> FLOP estimate) would choose;
  recompute, swap, joint-quick
              the default strategies' own plans (budget.strategies, budget/joint.py: the ones
              fit_budget weighs);
  joint       the opt-in joint strategy's plan (`--strategy joint`, with `--joint-seconds` of
              wall clock; 0: not planned nor measured).
Every distinct plan (by fingerprint: passes, order, swaps; not offsets) is measured with the bench's
machinery (onnxplan.bench.measure.measure_plan: one fresh process per plan, `--steps` steps
after one warm-up, one thread), in `--rounds` paired rounds, the plans' order rotated each
round; a round keeps its process's fastest step. Per budget: the fastest measured plan (least
median over rounds), and the chosen plan's excess over it, the median over rounds of
chosen / fastest of the same round. Reported: how often the chosen strategy is the fastest
measured or within 5% of it, and how far off when not; the same for the other cost model.

Run: PYTHONPATH=. python benchmarks/decision.py [--models mlp:64 resnet18:8 ...] [--rounds 3]
     [--steps 3] [--no-other] [--minutes M] [--json reports/decision.json] [-o reports/decision.md]
     PYTHONPATH=. python benchmarks/decision.py --summarize reports/decision.json -o reports/decision.md

Time: each measured plan is one fresh process per round (3.5-7 s at load 0-4 on this project's
2-core machine, mostly the interpreter's and torch's start), so a budget costs about
distinct plans (4-5) x rounds x that, plus its planning (the joint strategy: --joint-seconds).
Within ~20 minutes on an idle 2-core machine (an estimate from those figures: 17 budgets x 4
plans x 3 rounds x ~3.5 s + planning; not timed idle):
     unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; PYTHONPATH=. python benchmarks/decision.py --no-other --steps 2 \
         --models transformer:16 gpt:16 resnet18:8 vgg16:8 hf-resnet@bench hf-mobilenet-v2@bench --minutes 20
(3 paired rounds, the default, are kept: fewer are allowed with --rounds but not honest for the
table.) `--minutes`: no budget is started after that many minutes; the table says which were
not reached. `--no-other`: the other cost model's plan is not planned nor measured (saves a
profile run per model and a plan per budget).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

import onnxplan
from onnxplan.api import solve
from onnxplan.bench.measure import measure_plan
from onnxplan.budget import DEFAULT_PROFILE, MemoryRequest, chosen_strategy, cost_model
from onnxplan.budget.joint import plan_joint_strategy
from onnxplan.budget.strategies import STRATEGIES, StrategySkipped
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.sizes import format_bytes
from onnxplan.swap.pricing import store_rates

# the zoo's families at small batches (a tiny model, mlp or the hf-* ones at batch 2, has no budget
# where recompute fits: its activations are a few KiB next to its parameters)
MODELS = ("transformer:16", "gpt:16", "resnet18:8", "vgg16:8", "hf-resnet@bench", "hf-mobilenet-v2@bench",
          "hf-vit:8", "hf-bert:8", "hf-gpt2:8")
FRACTIONS = (0.9, 0.75, 0.6, 0.45)
WITHIN = 0.05  # the acceptance: chosen is the fastest measured, or within this of it
AUTO_NAMES = ("recompute", "swap", "joint-quick")  # the strategies fit_budget weighs (budget.strategies)
STRATEGY_NAMES = (*AUTO_NAMES, "joint")  # and the opt-in joint strategy's plan


def fingerprint(plan) -> str:
    """What a step's time depends on: the passes (the recompute schedule), the order (swap nodes
    included) and the swaps' writes; not the buffers' offsets (the offset ILP's incumbent under
    its time limit differs from call to call: the chosen plan and the same strategy's plan came
    out 0.2% apart in peak with one schedule and order, and were measured as two plans)."""
    body = json.dumps([plan.passes, plan.order, [(s.value, s.write) for s in plan.swaps]])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def plan_budget(step, budget: int, joint_seconds: float, other: bool = True) -> dict | None:
    """The plans of one budget (None: the default strategies and joint do not all fit)."""
    opts = PlanOptions()
    default, other_costs = cost_model(DEFAULT_PROFILE, threads=1), cost_model(not DEFAULT_PROFILE, threads=1)
    plans = {}
    for name in AUTO_NAMES:
        try:
            plans[name] = STRATEGIES[name](step.graph, budget, default, None, opts).plan
        except StrategySkipped:  # joint-quick on a graph too large for it: fit_budget leaves it out too
            pass
    if joint_seconds > 0:
        plans["joint"] = plan_joint_strategy(step.graph, budget, default, None, opts, total_seconds=joint_seconds).plan
    if any(p.peak_bytes > budget for p in plans.values()):
        return None
    t0 = time.perf_counter()
    plans["chosen"] = solve(step, opts, MemoryRequest(budget=budget), default).plan
    plan_seconds = time.perf_counter() - t0
    if other:
        plans["other"] = solve(step, opts, MemoryRequest(budget=budget), other_costs).plan
    return {"plans": plans, "plan_seconds": plan_seconds}


def measure_rounds(folder, plans: dict, rounds: int, steps: int) -> dict[str, list[float]]:
    """fingerprint -> the fastest step of each round (one fresh process per plan per round)."""
    distinct = {}
    for plan in plans.values():
        distinct.setdefault(fingerprint(plan), plan)
    keys = list(distinct)
    got: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            m = measure_plan(folder, distinct[k], steps, warmup=1, threads=1)
            got[k].append(m["min_step_seconds"] if m.get("min_step_seconds") else float("nan"))
    return got


def judge(times: dict[str, list[float]], key: str) -> dict:
    """The plan `key` against the fastest measured: paired by round."""
    medians = {k: statistics.median(v) for k, v in times.items()}
    fastest = min(medians, key=medians.get)
    off = statistics.median(a / b for a, b in zip(times[key], times[fastest])) - 1
    return {"fastest": fastest, "off": off, "ok": key == fastest or off <= WITHIN}


def bench_model(spec: str, args) -> list[dict]:
    name, _, batch = spec.partition(":")
    step = onnxplan.load(name, batch=int(batch) if batch else None)
    plain = plan_step(step.graph, PlanOptions()).plan
    rows = []
    for f in args.fractions:
        if len(rows) >= args.per_model:
            break
        if args.deadline is not None and time.perf_counter() > args.deadline:
            print(f"# {spec} f={f}: not started (--minutes {args.minutes} spent)", flush=True)
            args.not_reached.append(f"{spec} f={f}")
            continue
        budget = plain.persistent_bytes + int(f * plain.arena_bytes)
        got = plan_budget(step, budget, args.joint_seconds, args.other)
        if got is None:
            print(f"# {spec} f={f}: not every strategy fits {format_bytes(budget)}", flush=True)
            continue
        plans = got["plans"]
        times = measure_rounds(step.folder, plans, args.rounds, args.steps)
        keys = {n: fingerprint(p) for n, p in plans.items()}
        chosen = judge(times, keys["chosen"])
        other = judge(times, keys["other"]) if "other" in keys else {"off": float("nan"), "ok": False}
        by_key: dict[str, str] = {}
        for n, v in keys.items():  # a plan two strategies made alike: named by the first (a default one)
            if n in STRATEGY_NAMES:
                by_key.setdefault(v, n)
        row = {"model": spec, "fraction": f, "budget_bytes": budget, "plain_peak_bytes": plain.peak_bytes,
               "chosen": chosen_strategy(plans["chosen"]),
               "other": chosen_strategy(plans["other"]) if "other" in plans else "-",
               "plan_seconds": got["plan_seconds"],
               "peaks": {n: p.peak_bytes for n, p in plans.items()},
               "predicted": {c.strategy: c.predicted_step_seconds for c in plans["chosen"].strategy.candidates},
               "measured": {n: statistics.median(times[k]) for n, k in keys.items()},
               "rounds": {n: times[k] for n, k in keys.items()},
               "fastest": by_key.get(chosen["fastest"], chosen["fastest"]), "chosen_off": chosen["off"],
               "chosen_ok": chosen["ok"], "other_off": other["off"], "other_ok": other["ok"],
               "loadavg": os.getloadavg()[0]}
        rows.append(row)
        if args.save is not None:
            args.save(row)
        print(f"# {spec} {format_bytes(budget)}: chosen {row['chosen']} ({chosen['off']:+.1%} vs the fastest, "
              f"{row['fastest']}), other {row['other']} ({other['off']:+.1%}); load {row['loadavg']:.1f}", flush=True)
    return rows


def _store_line(machine: dict) -> str:
    store = machine.get("store_at_start")
    if not store:
        return ""
    how = "measured at the start" if store["source"] == "measured" else f"its kept {store['source']}"
    return (f" Swap store: {store['bandwidth'] / 1e6:.0f} MB/s ({how}; each swapped run then moves the kept "
            "estimate the next plans are priced with).")


def summarize(doc: dict) -> list[str]:
    rows = doc["rows"]
    for r in rows:
        if r["fastest"] not in STRATEGY_NAMES:  # a plan no strategy made as is: a cost model's own choice
            r["fastest"] = "the other model's plan" if r["other_off"] <= 0 else "the chosen plan"
    ok = sum(r["chosen_ok"] for r in rows)
    other_ok = sum(r["other_ok"] for r in rows)
    misses = [r for r in rows if not r["chosen_ok"]]
    m = doc["machine"]
    default = "profile" if doc["default_profile"] else "FLOP estimate"
    alt = "FLOP estimate" if doc["default_profile"] else "profile"
    lines = [
        "# The budget layer's choice against measurement (benchmarks/decision.py)", "",
        (f"{len(rows)} budgets over {len({r['model'] for r in rows})} models. The chosen strategy (default cost "
        f"model: {default}) is the fastest measured or within {WITHIN:.0%} of it at **{ok}/{len(rows)}** "
        f"({ok / max(len(rows), 1):.0%}) budgets; "
        + (f"with the {alt} instead: {other_ok}/{len(rows)}." if any(r["other"] != "-" for r in rows)
           else f"the {alt}'s plans not measured (--no-other).")),
        "" if not doc.get("not_reached") else "Not reached (--minutes): " + ", ".join(doc["not_reached"]) + ".",
        "" if not misses else "Where not: " + "; ".join(
            f"{r['model']} at {format_bytes(r['budget_bytes'])}: {r['chosen']} {r['chosen_off']:+.1%} vs "
            f"{r['fastest']}" for r in misses) + ".", "",
        (f"Machine: {m['host']}, {m['cpus']} CPUs shared with other work; load average {m['load_start']} at the "
        f"start, {m['load_end']} at the end. Threads: one in every measured process and in the profile "
        f"(threads=1; the FLOP estimate runs no kernel). {doc['rounds']} paired rounds, the plans' order rotated each round; each round one fresh "
        f"process per distinct plan, {doc['steps']} steps after one warm-up, its fastest step kept. Off = the "
        "median over rounds of chosen / fastest of the same round, - 1. Wall time "
        f"{doc['wall_seconds'] / 60:.1f} min." + _store_line(m)), "",
        ("| model | budget (f of arena) | chosen | other model's | fastest measured | chosen off | other off | "
        f"measured ms: {' / '.join(STRATEGY_NAMES)} | predicted ms: {' / '.join(AUTO_NAMES)} | plan s |"),
        "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = " / ".join(f"{r['measured'][n] * 1e3:.1f}" if n in r["measured"] else "-" for n in STRATEGY_NAMES)
        pred = " / ".join(f"{r['predicted'][n] * 1e3:.1f}" if n in r["predicted"] else "-" for n in AUTO_NAMES)
        lines.append(f"| {r['model']} | {format_bytes(r['budget_bytes'])} ({r['fraction']}) | {r['chosen']} | "
                     f"{r['other']} | {r['fastest']} | {r['chosen_off']:+.1%} | {r['other_off']:+.1%} | {ms} | "
                     f"{pred} | {r['plan_seconds']:.1f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS))
    ap.add_argument("--per-model", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--joint-seconds", type=float, default=6.0)
    ap.add_argument("--json", default="reports/decision.json")
    ap.add_argument("-o", "--out", default="reports/decision.md")
    ap.add_argument("--summarize", default=None, metavar="JSON")
    ap.add_argument("--other", action=argparse.BooleanOptionalAction, default=True,
                    help="also plan and measure the other cost model's choice")
    ap.add_argument("--minutes", type=float, default=None, help="start no budget after this many minutes")
    ap.add_argument("--measure-store", action=argparse.BooleanOptionalAction, default=True,
                    help="measure the swap store at the start (its kept estimate moves with every swapped run, "
                         "e.g. runs on a loaded machine); the plans are priced with it")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1:
        ap.error("--rounds and --steps must be >= 1")
    args.save = None
    args.not_reached = []
    if args.summarize:
        doc = json.loads(Path(args.summarize).read_text())
    else:
        t0, load_start = time.perf_counter(), round(os.getloadavg()[0], 2)
        args.deadline = None if args.minutes is None else t0 + 60 * args.minutes
        doc = {"rounds": args.rounds, "steps": args.steps, "default_profile": DEFAULT_PROFILE, "rows": []}
        kept = store_rates(refresh=args.measure_store)
        store = {"bandwidth": kept.bandwidth, "cpu_per_byte": kept.cpu_per_byte, "source": kept.source}

        def save(row: dict | None) -> None:  # after every budget: an interrupted run keeps what it measured
            if row is not None:
                doc["rows"].append(row)
            doc["machine"] = {"host": platform.node(), "cpus": os.cpu_count(), "load_start": load_start,
                              "load_end": round(os.getloadavg()[0], 2), "store_at_start": store}
            doc["wall_seconds"] = time.perf_counter() - t0
            doc["not_reached"] = args.not_reached
            Path(args.json).write_text(json.dumps(doc, indent=1))

        args.save = save
        for spec in args.models:
            if args.deadline is not None and time.perf_counter() > args.deadline:
                print(f"# {spec}: not started (--minutes {args.minutes} spent)", flush=True)
                args.not_reached.append(spec)
                continue
            bench_model(spec, args)
        save(None)
    Path(args.out).write_text("\n".join(summarize(doc)) + "\n")
    print("\n".join(summarize(doc)))


if __name__ == "__main__":
    main()
