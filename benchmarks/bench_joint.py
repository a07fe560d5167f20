"""Benchmark: the joint solver against rotor (recompute on the chain) and swap-only, measured.

Per model, at `--budgets` budgets evenly spaced from the least feasible one (the least planned
peak any strategy reaches: rotor's least schedule, swap's floor (asked for 1 B: it evicts
parameters and optimizer state too), the joint model's least memory) up to the plain plan's
peak, both included, four strategies are planned:
  rotor            the budget layer's "recompute" strategy (rotor on the chain);
  swap             the budget layer's "swap" strategy (the swap module's own policy);
  joint            onnxplan.joint (recompute on the DAG and paging), at the swap store's bandwidth;
  joint-recompute  the same with swap disabled (recompute on the DAG alone).
The "joint" column is the budget layer's joint strategy (budget/joint.py), which weighs the other
three as candidates and returns the fastest predicted; rotor, swap and joint-recompute are the
candidates it planned (planned here when it planned none: the plain plan fits).
Each row: planned peak, whether it fits, predicted step seconds on one footing for every
strategy (budget.decide.price: one profile of our kernels, CPU clock, one thread, gives
every node its time; transfers on one I/O worker at the swap store's measured bandwidth; wall
prediction = compute + stalls, CPU prediction = compute + the I/O thread's CPU), the wall time of
planning (joint: the whole strategy, every candidate and placement included) and the joint
solver's status and gap.
Measurement: every distinct fitting plan and the plain plan are written as plan files and
measured in a fresh process (measure_apart: no state of the planning process; every plan is
adopted as a plan file is, with every check), one BLAS/torch thread, `--rounds` rounds, the
plans' order rotated each round; each round runs `--steps` steps after one warm-up and keeps its
fastest step (what the profile also keeps), in wall time and in this process's CPU time (the I/O
worker's included, its waits not). There, before the rounds, the cost model's profile of the
plain step is taken again and every plan priced by it too ("re-taken"), so the prediction is
judged apart from the load drift between planning and measuring. Reported: the median over
rounds (wall), the spread (max - min) / median over rounds, the median over rounds of the step
/ the plain step of the same round, the CPU-time median, predicted / measured (wall, CPU; both
profiles) and, per budget, joint against the best single strategy **paired by round** (the two
plans ran in the same round): better or worse only where every round says so.
The swap store's rates are measured once per run (onnxplan.swap.pricing.store_rates(refresh=True):
the executor's own store, O_DIRECT where possible) unless --bandwidth gives them.

Models are NAME:BATCH, NAME a zoo model or `densenet` (models/densenet.py: a DenseNet-BC
written in PyTorch and exported with torch.onnx.export).
Run: PYTHONPATH=. python benchmarks/bench_joint.py --models resnet18:4 transformer:16 gpt:16 densenet:8
     [--budgets 10] [--time-limit 10] [--total 60] [--rounds 3] [--steps 3] [--bandwidth B] [--no-measure]
     [--json reports/joint.json] [-o reports/joint-table.md]
     PYTHONPATH=. python benchmarks/bench_joint.py --summarize ROWS.json [--rows]   # the tables again
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from onnxplan.budget import STRATEGIES, ProfiledCosts
from onnxplan.budget.attempt import step_before_inplace
from onnxplan.budget.decide import price as step_price
from onnxplan.budget.joint import JOINT_SECONDS
from onnxplan.executor.prepare import Prepared, adopt_plan
from onnxplan.executor.runner import run_plan
from onnxplan.ir.load import read_step
from onnxplan.joint.fit import plan_joint
from onnxplan.loading.artifacts import build_artifacts
from onnxplan.models import get_model
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.swap.pricing import StoreRates, planned_step, store_rates
from onnxplan.threads import use_threads

STRATEGY_NAMES = ("rotor", "swap", "joint", "joint-recompute")


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


def _joint_note(out) -> str:
    j = out.plan.joint
    gap = "none" if j.gap is None else f"{j.gap:.2f}"
    solve = sum(r.solve_seconds for r in j.rounds)
    return (f"{j.status} gap {gap}; CP-SAT {solve:.1f} s in {len(j.rounds)} round(s); model "
            f"{j.estimate_bytes / 2**20:.2f} MiB; {j.recomputations} recomputations, {len(out.plan.swaps)} swaps"
            + ("; then swap auto" if any("swap auto" in n for n in j.notes) else "")
            + (f"; chosen {j.chosen}" if j.candidates else ""))


def plan_model(label: str, folder, args, rates) -> tuple[list[dict], dict]:
    """The rows of one model (not yet measured) and the plans to measure (key -> Plan)."""
    graph = read_step(folder)
    opts = PlanOptions()
    plain = plan_step(graph, opts)
    profiled = ProfiledCosts(clock="cpu")  # one profile (cached) gives every strategy its node costs
    times, note = profiled.times(step_before_inplace(graph, opts))
    costs = dict(times.measured)
    top = plain.plan.peak_bytes

    def joint(budget, bw):
        return plan_joint(graph, budget, opts, costs=costs, swap_bandwidth=bw, time_limit=args.time_limit,
                          swap_on_top=bw is not None, total_seconds=args.total, io_cpu_per_byte=rates.cpu_per_byte)

    def price(out) -> dict:
        p = step_price(out, times, rates)
        return {"predicted": p.seconds, "predicted_cpu": p.cpu_seconds, "compute": p.compute, "stall": p.stall,
                "io_cpu": p.io_cpu, "handling": p.handling, "moved": p.moved}

    t0 = time.perf_counter()
    floors = {"rotor": STRATEGIES["recompute"](graph, plain.plan.persistent_bytes, profiled, None, opts),
              "swap": STRATEGIES["swap"](graph, plain.plan.persistent_bytes, profiled, None, opts),
              "joint": joint(plain.plan.persistent_bytes, rates.bandwidth)[0]}
    # below every strategy: what the largest working set holds while its node runs (swap's floor
    # names it), a bound no recomputation or swap goes below; swap, evicting parameters and
    # optimizer state too, may reach below the persistent bytes
    below = STRATEGIES["swap"](graph, 1, profiled, None, opts).swap
    bound = below.floor if below is not None and below.floor is not None else None
    least = min([o.plan.peak_bytes for o in floors.values()] + ([below.peak_bytes] if below is not None else []))
    print(f"# {label}: plain {top / 2**20:.2f} MiB; floors "
          + ", ".join(f"{k} {o.plan.peak_bytes / 2**20:.2f}" for k, o in floors.items())
          + (f"; swap reaches {below.peak_bytes / 2**20:.2f}, {bound.describe()}" if bound else "")
          + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
    n = max(2, args.budgets)
    budgets = [int(least + k * (top - least) / (n - 1)) for k in range(n)]
    plans = {"plain": plain.plan}
    rows = [{"model": label, "budget": top, "strategy": "plain", "peak": top, "fits": True,
             **price(plain), "plan_seconds": 0.0, "key": "plain", "note": note,
             "floors": {k: o.plan.peak_bytes for k, o in floors.items()},
             "bound": bound and {"bytes": bound.bound, "swap_reaches": below.peak_bytes, "text": bound.describe()}}]
    for budget in budgets:
        seen: dict = {}
        t0 = time.perf_counter()
        chosen = STRATEGIES["joint"](graph, budget, profiled, args.time_limit, opts, total_seconds=args.total,
                                     rates=rates, seen=seen)
        joint_seconds = time.perf_counter() - t0
        for strategy in STRATEGY_NAMES:
            t0 = time.perf_counter()
            note, gap = "", None
            name = {"rotor": "recompute"}.get(strategy, strategy)
            if strategy == "joint":
                out = chosen
            elif name in seen:
                out = seen[name]
            elif strategy in ("rotor", "swap"):
                out = STRATEGIES[name](graph, budget, profiled, None, opts)
            else:
                out = joint(budget, None)[0]
            if strategy == "swap":
                note = f"{len(out.plan.swaps)} swaps" + (" (split grads)" if any(
                    "split" in x for x in out.plan.passes) else "")
            elif strategy.startswith("joint"):
                note, gap = _joint_note(out), out.plan.joint.gap
            secs = joint_seconds if strategy == "joint" else time.perf_counter() - t0
            fits = out.plan.peak_bytes <= budget
            key = None
            if fits:
                key = hashlib.sha1(repr((out.plan.order, out.plan.arena_bytes, out.plan.passes)).encode()).hexdigest()[:12]
                plans.setdefault(key, out.plan)
            rows.append({"model": label, "budget": budget, "strategy": strategy, "peak": out.plan.peak_bytes,
                         "fits": fits, **price(out), "plan_seconds": secs, "key": key, "gap": gap,
                         "note": note})
            print(_row(rows[-1]), flush=True)
    return rows, plans


def measure(folder, plans: dict, rounds: int, steps: int, rates=None) -> dict[str, dict]:
    """key -> {"rounds": fastest wall step per round, "cpu": fastest CPU step per round,
    "vs_plain": per round its step / plain's, "repriced": its price by a profile taken here}.
    Every plan is adopted as a plan file is (onnxplan.executor.prepare.adopt_plan: every check a
    fresh plan passes) before it runs. `rates`: the swap store's, for the re-pricing."""
    graph = read_step(folder)
    preps = {k: Prepared(folder, adopt_plan(read_step(folder), p), p) for k, p in plans.items()}
    # the cost model's profile taken again here, in the measuring process, right before its
    # rounds: the same profile code, the plain step's nodes (not the plans measured)
    times, note = ProfiledCosts(clock="cpu").times(step_before_inplace(graph, PlanOptions()))
    repriced = {}
    for k, prep in preps.items():
        p = planned_step(prep.graph, prep.plan.order, prep.plan.swaps,
                         lambda n, g=prep.graph: times.node_seconds(g, n), rates)
        repriced[k] = {"predicted": p.seconds, "predicted_cpu": p.cpu_seconds, "note": note}
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
    return {k: {"rounds": v, "cpu": cpu[k], "vs_plain": [a / b for a, b in zip(v, got["plain"])],
                "repriced": repriced[k]} for k, v in got.items()}


def measure_apart(spec: str, plans: dict, rounds: int, steps: int, rates) -> dict[str, dict]:
    """measure() in a fresh process: the plans written as plan files, read back there (and
    adopted: verified), so the rounds run without the planning process's state (its heap
    after minutes of CP-SAT, every candidate's outcome held)."""
    with tempfile.TemporaryDirectory(prefix="bench-joint-") as tmp:
        for k, p in plans.items():
            Path(tmp, f"{k}.plan.json").write_text(p.dumps())
        out = Path(tmp, "measured.json")
        cmd = [sys.executable, __file__, "--measure-plans", tmp, "--models", spec, "--rounds", str(rounds),
               "--steps", str(steps), "--bandwidth", repr(rates.bandwidth), "--io-cpu", repr(rates.cpu_per_byte)]
        subprocess.run(cmd, check=True)
        return json.loads(out.read_text())


def _measure_plans(folder_spec: str, tmp: str, rounds: int, steps: int, rates) -> None:
    _, folder = model_folder(folder_spec)
    plans = {p.name[: -len(".plan.json")]: Plan.load(p) for p in sorted(Path(tmp).glob("*.plan.json"))}
    got = measure(folder, plans, rounds, steps, rates)
    Path(tmp, "measured.json").write_text(json.dumps(got))


def paired(at: dict, plain: dict) -> dict | None:
    """Joint against the best single strategy (rotor or swap, the least median step / plain) of
    one budget, round by round (the plans ran interleaved in the same rounds): the ratios
    joint / best of each round, wall and CPU; None where joint or both singles miss."""
    singles = [at[n] for n in ("rotor", "swap") if n in at and at[n]["fits"] and at[n].get("vs_plain")]
    j = at.get("joint")
    if not singles or j is None or not j["fits"] or not j.get("rounds"):
        return None
    best = min(singles, key=lambda r: r["vs_plain"])
    wall = [a / b for a, b in zip(j["rounds"], best["rounds"])]
    cpu = [a / b for a, b in zip(j["cpu_rounds"], best["cpu_rounds"])] if j.get("cpu_rounds") else []
    return {"best": best["strategy"], "wall": wall, "cpu": cpu, "both_fit": len(singles) == 2}


def _verdict(qs: list[float]) -> str:
    """better / worse when every round says so (paired: the same round's two steps), else equal."""
    if not qs:
        return "-"
    return "better" if max(qs) < 1 else "worse" if min(qs) > 1 else "equal"


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
                f"predicted {_ms(plain['predicted'])} ms)", ""]
        if plain.get("bound"):
            bd = plain["bound"]
            out += ["Least peaks (budget = the persistent bytes): " + ", ".join(
                f"{k} {v / 2**20:.2f} MiB" for k, v in plain["floors"].items()) + f"; swap alone, asked for 1 B, "
                f"reaches {bd['swap_reaches'] / 2**20:.2f} MiB against the bound {bd['bytes'] / 2**20:.2f} MiB "
                f"({bd['text'].partition(': ')[2]})", ""]
        out += [
                "each cell: wall step / plain (median over rounds) ±spread · CPU step / plain CPU step; "
                "'-': the plan misses the budget", "",
                "| budget MiB | rotor | swap | joint | joint-recompute | best single (wall) | joint / best, paired by round: "
                "wall · CPU, median [least, most] | verdict (every round) |",
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
            pair = paired(at, plain)
            if j is None or not j["fits"] or j.get("vs_plain") is None:
                verdict, ratio = ("none fits" if best is None else "joint misses"), "-"
            elif best is None:
                verdict, ratio = "only joint fits", "-"
            elif pair is None or not pair["wall"]:
                verdict, ratio = "-", "-"
            else:
                ratio = " · ".join(f"{statistics.median(q):.3f} [{min(q):.3f}, {max(q):.3f}]"
                                   for q in (pair["wall"], pair["cpu"]) if q)
                verdict = f"wall {_verdict(pair['wall'])}; CPU {_verdict(pair['cpu'])}"
                verdict += "" if pair["both_fit"] else " (only " + best["strategy"] + " fits)"
            out.append(f"| {b / 2**20:.2f} | {cell('rotor')} | {cell('swap')} | {cell('joint')} | "
                       f"{cell('joint-recompute')} | {best['strategy'] if best else '-'} | {ratio} | {verdict} |")
        measured = [r for r in rs if r.get("measured") and r["predicted"]]
        if measured and plain.get("measured"):
            out += ["", "predicted / measured - 1 (within 15% on / rows; the worst three):", ""]
            for label, key in (("the planning profile", ""), ("the profile re-taken in the measuring process", "re_")):
                for what, meas in (("wall", "measured"), ("CPU", "cpu")):
                    pk = key + ("predicted" if what == "wall" else "predicted_cpu")
                    errs = [(r[pk] / r[meas] - 1, r) for r in measured if r.get(pk)]
                    if errs:
                        xs = [x for x, _ in errs]
                        out.append(f"- {what}, {label}: median {statistics.median(xs):+.1%}, within 15% on "
                                   f"{sum(abs(x) <= 0.15 for x in xs)} / {len(xs)}; worst " + ", ".join(
                                       f"{r['strategy']} at {r['budget'] / 2**20:.2f} MiB {x:+.0%}"
                                       for x, r in sorted(errs, key=lambda xr: -abs(xr[0]))[:3]))
            wins = [paired({r["strategy"]: r for r in rs if r["budget"] == b2 and r["strategy"] != "plain"}, plain)
                    for b2 in budgets]
            both = [w for w in wins if w and w["both_fit"]]
            dag = []
            for b2 in budgets:
                at2 = {r["strategy"]: r for r in rs if r["budget"] == b2}
                a, c = at2.get("joint-recompute"), at2.get("rotor")
                if a and c and a["fits"] and c["fits"] and a.get("rounds") and c.get("rounds") and a["key"] != c["key"]:
                    q = [x / y for x, y in zip(a["rounds"], c["rounds"])]
                    dag.append(f"{b2 / 2**20:.2f} MiB {statistics.median(q):.2f} [{min(q):.2f}, {max(q):.2f}]")
            if dag:
                out.append("- recompute on the DAG (joint-recompute) / rotor on the chain, same budget, paired by "
                           "round (wall, median [least, most]): " + "; ".join(dag))
            joint_secs = [r["plan_seconds"] for r in rs if r["strategy"] == "joint"]
            out.append(f"- planning with the joint strategy (every candidate and placement): at most "
                       f"{max(joint_secs):.1f} s per budget (median {statistics.median(joint_secs):.1f} s)")
            out.append(f"- joint strictly better than the best single strategy in every round, where both fit: "
                       f"wall {sum(_verdict(w['wall']) == 'better' for w in both)} / {len(both)}, CPU "
                       f"{sum(_verdict(w['cpu']) == 'better' for w in both)} / {len(both)}; worse in every round: "
                       f"wall {sum(_verdict(w['wall']) == 'worse' for w in wins if w)}, CPU "
                       f"{sum(_verdict(w['cpu']) == 'worse' for w in wins if w)} of {sum(1 for w in wins if w)} "
                       "budgets where joint and a single strategy fit")
        out.append("")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18:4", "transformer:16", "gpt:16", "densenet:8"])
    ap.add_argument("--budgets", type=int, default=10)
    ap.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT seconds per round at most")
    ap.add_argument("--total", type=float, default=JOINT_SECONDS, help="the joint strategy's seconds per budget")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bandwidth", type=float, default=None, help="the swap store's bytes/s (default: measured)")
    ap.add_argument("--io-cpu", type=float, default=None, help="the swap store's CPU seconds per byte (with --bandwidth)")
    ap.add_argument("--measure-plans", default=None, metavar="DIR", help=argparse.SUPPRESS)  # measure_apart's child
    ap.add_argument("--no-measure", action="store_true", help="plan and predict only")
    ap.add_argument("--json", default=None, help="append every row as a JSON line")
    ap.add_argument("-o", "--output", default=None)
    ap.add_argument("--summarize", nargs="+", default=None, metavar="JSON",
                    help="print the summary tables of rows written by --json, and stop")
    ap.add_argument("--rows", action="store_true", help="with --summarize: every row, as measured, instead")
    args = ap.parse_args()
    if args.summarize:
        rows = [json.loads(line) for path in args.summarize for line in open(path) if line.strip()]
        print("\n".join([HEAD, "|" + "---|" * 13] + [_row(r) for r in rows] if args.rows else summarize(rows)))
        return
    use_threads(1)
    rates = store_rates(override=args.bandwidth, refresh=not args.bandwidth)
    if args.io_cpu is not None:
        rates = StoreRates(rates.bandwidth, args.io_cpu)
    if args.measure_plans:
        _measure_plans(args.models[0], args.measure_plans, args.rounds, args.steps, rates)
        return
    head = [(f"swap store bandwidth {rates.bandwidth / 1e9:.2f} GB/s, I/O CPU {rates.cpu_per_byte * 1e9:.2f} ns/B "
             f"({'given' if args.bandwidth else 'measured'}); "
             f"CP-SAT time limit {args.time_limit:.0f} s per round; {args.rounds} rounds x fastest of "
             f"{args.steps} steps after 1 warm-up; one thread; load average at start "
             f"{os.getloadavg()[0]:.1f}"), "", HEAD, "|" + "---|" * 13]
    print("\n".join(head), flush=True)
    every = []
    for spec in args.models:
        label, folder = model_folder(spec)
        rows, plans = plan_model(label, folder, args, rates)
        if not args.no_measure:
            got = measure_apart(spec, plans, args.rounds, args.steps, rates)
            for r in rows:
                if r["key"] in got:
                    g = got[r["key"]]
                    r["measured"] = statistics.median(g["rounds"])
                    r["spread"] = (max(g["rounds"]) - min(g["rounds"])) / r["measured"]
                    r["vs_plain"] = statistics.median(g["vs_plain"])
                    r["rounds"] = g["rounds"]
                    r["cpu"] = statistics.median(g["cpu"])
                    r["cpu_rounds"] = g["cpu"]
                    r["re_predicted"] = g["repriced"]["predicted"]
                    r["re_predicted_cpu"] = g["repriced"]["predicted_cpu"]
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
