"""Swap policies on NNTrainer's VGG16 experiment, and models at 25% of their no-swap peak vs ORT.

Usage: python benchmarks/bench_swap.py [--model vgg16] [--batch 64] [--optimizer sgd]
           [--steps 3] [--warmup 1] [--planner auto] [--time-limit 5] [--budget-models resnet18,transformer]
           [--fraction 0.25] [--pairs 3] [--out reports/swap-vgg16.md]
       python benchmarks/bench_swap.py --budget 51MiB --pairs 7 --out reports/swap-vgg16-51.md

Part 1 (NNTrainer section 5.2, Figures 12 and 13: VGG16, 32x32x3 inputs, batch 64, SGD):
none / on-demand / reduced / proactive (lookahead 1, 2, 4) / window, each with every gap the
policy can swap (no budget: the least memory the policy reaches, as in the paper). Every run
is a fresh subprocess through the peak-RSS probe (baseline just before the arena): planned
peak, measured peak, swaps and transfers, bytes out/in per step, stalls, median step latency
of the measured steps, and the overhead against the no-swap run of the same order. The
losses of every run are compared with the no-swap run's (bit-identical expected).

--split-grad: every swapping policy on the graph with each ConvGrad split into its dW and dX
halves (passes/split_grad.py), against the same fused no-swap baseline.

--budget SIZE: instead, the budget layer's own plan at SIZE (as `onnxplan plan MODEL --budget
SIZE` makes it) beside the plain plan and reduced at the same budget: peaks planned and
measured, and the paired overhead with stall and I/O seconds per step (see budget_table).

Part 2: each of --budget-models planned at --fraction of its no-swap peak (swap auto), run
three steps and compared with ONNX Runtime (loss per step and every parameter), peak measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

from onnxplan.executor.measure import measure_run
from onnxplan.executor.prepare import prepare
from onnxplan.loading.request import LoadRequest
from onnxplan.planning import PlanOptions
from onnxplan.swap import swap_totals

MiB = 1 << 20
POLICIES = [("none", {}), ("on-demand", {}), ("reduced", {}), ("proactive", {"lookahead": 1}),
            ("proactive", {"lookahead": 2}), ("proactive", {"lookahead": 4}), ("window", {})]
PAPER = {  # NNTrainer section 5.2 (peak MiB, latency overhead); on-demand and reduced: same peak
    "none": "181 MiB", "on-demand": "51 MiB, +35.5%", "reduced": "51 MiB (as on-demand), ~10% faster",
    "proactive-1": "71 MiB, +20.1%",
}


NOTES = [
    ("- Peaks: planned = persistent + arena; measured = the probe's RSS increase from just before the "
    "arena is allocated (NNTrainer's figures include its 11 MiB baseline). With no budget each policy "
    "swaps every gap it can, parameters and optimizer state included (an evicted parameter's home is "
    "the swap store; it is in memory only around its uses)."),
    ("- The floor of on-demand and reduced is the largest single working set (`onnxplan plan vgg16 "
    "--optimizer sgd --swap on-demand --budget 1KiB` names it): the ConvGrad of the second convolution, "
    "which reads X and dY and writes dX and dW in one node (3 x 16 MiB). NNTrainer splits that layer's "
    "backward into CG and CD at separate EOs, which is why the paper's theoretical minimum at c2:CD is "
    "32.14 MiB; reaching its 51 MiB would need the ConvGrad split in two nodes."),
    ("- Proactive with lookahead 1 reaches the same planned peak as on-demand here: the prefetched "
    "buffer and the one-EO-late completion fit beside the floor EO; lookahead 2 and 4 keep one more "
    "buffer. The window policy (default window: the largest working set) keeps the most memory and "
    "stalls the least."),
    ("- Transfers: on-demand writes every swap-out and round-trips between adjacent uses; reduced and "
    "the others write only dirty buffers (a weight swapped out before its update is already in the "
    "store), so they move far fewer bytes out than in."),
    ("- Latency: `overhead (runs)` compares the median step of separate runs; on a shared machine "
    "whose load drifts it is noisy. `overhead (paired)` alternates no-swap and swap steps in one "
    "process (median ratio of the pairs) and `stalls / step` is the time the executor waited for a "
    "late prefetch or write, as a fraction of the no-swap step: the direct cost of swapping. The rest "
    "of any difference is the I/O thread's CPU (copies, flushes) competing with the kernels."),
    ("- Every swapped run's losses are bit-identical to the no-swap run's (same kernels, same order); "
    "tests check the parameters too, on every zoo model and policy."),
    ("- resnet18 with AdamW (its zoo default) differs from ONNX Runtime by as much as ONNX Runtime differs "
    "from itself when every input moves by one float32 ulp (`reports/three-way.md`: 3.8e-2; a ReLU mask "
    "flip near zero, made visible by AdamW's sign-like first updates); the swapped run equals the "
    "no-swap run bit for bit. With SGD (`resnet18:sgd`) the same model at 25% matches ONNX Runtime."),
]


def _label(policy: str, kw: dict) -> str:
    return policy + "".join(f"-{v}" for v in kw.values())


def paired_overhead(none_prep, prep, pairs: int) -> tuple[float, list[float]]:
    """Latency overhead of `prep` against `none_prep` from steps alternated in one process
    (none, swap, swap, none, ...), so that a machine whose load drifts affects both alike:
    the median over pairs of (swap step / no-swap step) - 1, and the ratios."""
    got = paired_rounds(none_prep, [prep], pairs)[0]
    return got["overhead"], got["ratios"]


def paired_rounds(none_prep, preps: list, pairs: int) -> list[dict]:
    """Each of `preps` against `none_prep`, in one process: per round and candidate, one
    no-swap step and one candidate step, their order alternating between rounds. Per
    candidate: the median ratio - 1 (`overhead`), the ratios, the median stall and I/O-busy
    seconds per step (the swap runtime's own clocks), and the load average around the rounds."""
    import os

    from onnxplan.executor.runner import Executor, initial_parameters, step_batches

    params = initial_parameters(none_prep.folder)  # BLAS threads: set once in main()
    batch = step_batches(none_prep.folder, 1, 0)[0]
    plain = Executor(none_prep.graph, none_prep.plan)
    exs = [Executor(p.graph, p.plan) for p in preps]
    for ex in (plain, *exs):
        ex.load_state(params)
        ex.step(batch)  # warm-up
    load = [os.getloadavg()[0]]
    rows = [{"ratios": [], "stall_seconds": [], "io_seconds": [], "io_cpu_seconds": [], "seconds": [],
             "plain_seconds": []} for _ in exs]
    for k in range(pairs):
        for ex, row in zip(exs, rows):
            seconds = {}
            for who in ((plain, ex) if k % 2 == 0 else (ex, plain)):
                t0 = time.perf_counter()
                who.step(batch)
                seconds[id(who)] = time.perf_counter() - t0
            row["ratios"].append(seconds[id(ex)] / seconds[id(plain)])
            row["seconds"].append(seconds[id(ex)])
            row["plain_seconds"].append(seconds[id(plain)])
            last = ex.swap.history[-1] if ex.swap is not None else None
            row["stall_seconds"].append(last.stall_seconds if last else 0.0)
            row["io_seconds"].append(last.io_seconds if last else 0.0)
            row["io_cpu_seconds"].append(last.io_cpu_seconds if last else 0.0)
        load.append(os.getloadavg()[0])
    for ex, row in zip(exs, rows):
        row["overhead"] = statistics.median(row["ratios"]) - 1.0
        row["load"] = load
        if ex.swap is not None:
            ex.swap.close()
    return rows


def part1(args) -> list[dict]:
    req = LoadRequest(args.model, args.batch, args.optimizer)
    rows = []
    none_prep = None
    for policy, kw in POLICIES:
        t0 = time.perf_counter()
        opts = PlanOptions(planner=args.planner, time_limit=args.time_limit,
                           swap=policy if policy != "none" else "none",
                           split_grad=args.split_grad and policy != "none", **kw)
        prep = prepare(req, opts)
        plan_s = time.perf_counter() - t0
        none_prep = none_prep or prep
        child, measured = measure_run(req, None, steps=args.steps, warmup=args.warmup, prepared=prep,
                                      timeout_s=3600, threads=args.threads)
        t = swap_totals(prep.plan.swaps)
        sw = child.get("swap") or {"steps": []}
        steps = sw["steps"] or [{}]
        row = {
            "policy": _label(policy, kw) + ("+split" if opts.split_grad else ""), "planned_peak": prep.plan.peak_bytes, "measured_peak": measured,
            "persistent": prep.plan.persistent_bytes, "arena": prep.plan.arena_bytes,
            "swaps": t["swaps"], "transfers": t["transfers"], "bytes_out": t["bytes_out"], "bytes_in": t["bytes_in"],
            "measured_bytes_out": statistics.mean(s.get("bytes_out", 0) for s in steps),
            "measured_bytes_in": statistics.mean(s.get("bytes_in", 0) for s in steps),
            "stalls": statistics.mean(s.get("stalls", 0) for s in steps),
            "stall_seconds": statistics.mean(s.get("stall_seconds", 0.0) for s in steps),
            "io_seconds": statistics.mean(s.get("io_seconds", 0.0) for s in steps),
            "median_step_seconds": statistics.median(child["step_seconds"]), "losses": child["losses"],
            "plan_seconds": plan_s, "store": {k: sw.get(k) for k in ("store_fs", "cache")},
        }
        if args.pairs and prep is not none_prep:
            row["paired_overhead"], row["paired_ratios"] = paired_overhead(none_prep, prep, args.pairs)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "losses"}), flush=True)
    base = rows[0]
    for r in rows:
        r["overhead"] = r["median_step_seconds"] / base["median_step_seconds"] - 1.0
        r["stall_overhead"] = r["stall_seconds"] / base["median_step_seconds"]
        r["same_losses"] = r["losses"] == base["losses"]
    return rows


def part2(args) -> list[dict]:
    out = []
    for name in [m for m in args.budget_models.split(",") if m]:
        try:
            out.append(_budget_row(args, name))
        except Exception as exc:  # noqa: BLE001 - one model's failure is reported, the rest run
            out.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(out[-1]), flush=True)
    return out


def _budget_row(args, name: str) -> dict:
    from onnxplan.budget import attempt
    from onnxplan.executor.prepare import Prepared
    from onnxplan.executor.runner import run_plan
    from onnxplan.loading import open_step
    from onnxplan.verification.compare import compare_results
    from onnxplan.verification.reference import run_reference

    model, _, optimizer = name.partition(":")  # NAME or NAME:OPTIMIZER
    req = LoadRequest(model, None, optimizer or None)
    none = prepare(req, PlanOptions(planner=args.planner, time_limit=args.time_limit))
    budget = int(none.plan.peak_bytes * args.fraction)
    folder, graph = open_step(req)  # a budget swapping cannot reach is a row that does not fit
    out = attempt(graph, PlanOptions(planner=args.planner, time_limit=args.time_limit, swap="auto", budget=budget))
    prep = Prepared(folder, out.graph, out.plan)
    res = run_plan(req, None, steps=3, prepared=prep, threads=args.threads)
    ref = run_reference(prep.folder, steps=3)
    cmp = compare_results(res.losses, res.params, ref.losses, ref.params)
    _, measured = measure_run(req, None, steps=3, warmup=args.warmup, prepared=prep, timeout_s=3600,
                              threads=args.threads)
    base = run_plan(req, None, steps=3, prepared=none, threads=args.threads)
    t = swap_totals(prep.plan.swaps)
    row = {"model": name, "no_swap_peak": none.plan.peak_bytes, "budget": budget,
           "policy": (prep.plan.swap.described or "none"), "planned_peak": prep.plan.peak_bytes,
           "measured_peak": measured, "fits": prep.plan.peak_bytes <= budget, "swaps": t["swaps"],
           "bytes_in": t["bytes_in"], "verified": cmp.ok, "max_rel_diff": cmp.max_rel_diff,
           "overhead": statistics.median(res.step_seconds) / statistics.median(base.step_seconds) - 1.0,
           "same_as_no_swap": res.losses == base.losses}
    return row


BUDGET_RIVALS = ("reduced",)  # swap policies planned at the same budget beside the budget layer's choice


def budget_table(args) -> dict:
    """The budget layer's own plan for --budget (`onnxplan plan MODEL --budget SIZE`, FLOP cost
    model: only the predicted times differ with --profile) beside the plain plan and each of
    BUDGET_RIVALS at the same budget (split-grad as the budget layer chose): planned and
    measured peak (a fresh process each), swaps, bytes, and the paired overhead, stall and
    I/O-busy seconds per step over --pairs rounds in one process."""
    import os

    from onnxplan.api import load, solve
    from onnxplan.budget import MemoryRequest
    from onnxplan.budget.costs import FlopCosts
    from onnxplan.executor.prepare import Prepared
    from onnxplan.executor.runner import run_plan
    from onnxplan.sizes import parse_size

    budget = parse_size(args.budget)
    step = load(args.model, batch=args.batch, optimizer=args.optimizer)
    req = step.request
    base = PlanOptions(planner=args.planner, time_limit=args.time_limit)
    t0 = time.perf_counter()
    chosen = solve(step, base, MemoryRequest.from_flags(budget), FlopCosts())
    plan_s = time.perf_counter() - t0
    split = chosen.plan.settings.split_grad
    plain = solve(step, base, MemoryRequest())
    cands = [("plain", plain, 0.0), (f"budget layer: {chosen.plan.swap.described}", chosen, plan_s)]
    for policy in BUDGET_RIVALS:
        out = solve(step, PlanOptions(planner=args.planner, time_limit=args.time_limit, split_grad=split),
                    MemoryRequest.from_flags(budget, swap=policy))
        cands.append((policy, out, 0.0))
    preps = [Prepared(step.folder, o.graph, o.plan) for _, o, _ in cands]
    rows = []
    for (label, out, secs), prep in zip(cands, preps):
        child, measured = measure_run(req, None, steps=args.steps, warmup=args.warmup, prepared=prep,
                                      timeout_s=3600, threads=args.threads)
        t = swap_totals(out.plan.swaps)
        rows.append({"label": label, "policy": out.plan.swap.described or "none", "split_grad": split,
                     "planned_peak": out.plan.peak_bytes, "measured_peak": measured, "fits": out.plan.peak_bytes <= budget,
                     "swaps": t["swaps"], "bytes_out": t["bytes_out"], "bytes_in": t["bytes_in"],
                     "losses": child["losses"], "plan_seconds": secs, "why": out.plan.strategy.reason if out.plan.strategy else ""})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "losses"}), flush=True)
    base = run_plan(req, None, steps=3, prepared=preps[0], threads=args.threads)
    for row, prep in zip(rows[1:], preps[1:]):  # 3 steps from the same state: losses and every weight
        got = run_plan(req, None, steps=3, prepared=prep, threads=args.threads)
        row["same_losses"] = got.losses == base.losses and row["losses"] == rows[0]["losses"]
        row["same_params"] = set(got.params) == set(base.params) and all(
            np.array_equal(got.params[k], base.params[k]) for k in base.params)
    paired = paired_rounds(preps[0], preps[1:], args.pairs)
    for row, pr in zip(rows[1:], paired):
        row.update(pr)
    return {"budget": budget, "rows": rows, "cpus": os.cpu_count()}


def budget_report(args, table: dict) -> str:
    rows = table["rows"]
    load = rows[1]["load"] if len(rows) > 1 else []
    plain_s = statistics.median(rows[1]["plain_seconds"]) if len(rows) > 1 else float("nan")
    lines = [
        f"# {args.model} (batch {args.batch}, {args.optimizer}) at a budget of {args.budget}, {date.today()}",
        "",
        (f"`python benchmarks/bench_swap.py --budget {args.budget} --pairs {args.pairs} --out {args.out}` on "
         f"{platform.machine()}, {table['cpus']} cores shared with other work, numpy executor with {args.threads} "
         f"BLAS thread(s). The plan is the budget layer's own (`onnxplan plan {args.model} --optimizer "
         f"{args.optimizer} --budget {args.budget}`); each policy below is planned at the same budget. Peaks: "
         f"planned, and measured in a fresh process each ({args.warmup} warm-up + {args.steps} steps). Latency: "
         f"{args.pairs} rounds in one process, each round one plain step and one step of each plan, the order "
         f"alternating; overhead = median of (plan step / plain step) - 1; stall and I/O = the swap "
         f"runtime's clocks, median per step. Load average (1 min) over the rounds: "
         f"{', '.join(f'{x:.1f}' for x in load)}; plain step median {plain_s:.3f} s."),
        "",
        ("| plan | policy | planned peak MiB | measured peak MiB | swaps | out MiB/step | in MiB/step | overhead (paired) "
         "| ratios | stall s/step | stall / plain step | I/O busy s/step | I/O CPU s/step | same losses and weights |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["label"] == "plain":
            lines.append(f"| plain | none | {_mib(r['planned_peak'])} | {_mib(r['measured_peak'])} | 0 | 0 | 0 | "
                         f"| | | | | | |")
            continue
        stall = statistics.median(r["stall_seconds"])
        lines.append(
            f"| {r['label']}{'' if r['fits'] else ' (misses)'} | {r['policy']}{' + split-grad' if r['split_grad'] else ''} "
            f"| {_mib(r['planned_peak'])} | {_mib(r['measured_peak'])} | {r['swaps']} | {_mib(r['bytes_out'])} "
            f"| {_mib(r['bytes_in'])} | {r['overhead']:+.1%} | {', '.join(f'{x:.2f}' for x in r['ratios'])} "
            f"| {stall:.3f} | {stall / plain_s:+.1%} | {statistics.median(r['io_seconds']):.3f} "
            f"| {statistics.median(r['io_cpu_seconds']):.3f} "
            f"| {'yes' if r['same_losses'] and r['same_params'] else 'NO'} |")
    why = rows[1].get("why") if len(rows) > 1 else ""
    if why:
        lines += ["", f"The budget layer: {why}"]
    lines += ["", "## Reading it", "", *BUDGET_NOTES]
    return "\n".join(lines) + "\n"


BUDGET_NOTES = [
    ("- `reduced` is what the budget layer chose before the adaptive policy (auto tried proactive, then "
     "reduced). Both swap the same gaps (chosen with on-demand timing, only as many as the budget needs: 48 "
     "here, against 146 for reduced with no budget); adaptive then gives the transfers lead: a simulated step "
     "(roofline node times, one FIFO I/O worker at the swap store's measured bandwidth) finds the transfer "
     "that stalls most, and its read is issued earlier or its write completed later, EO by EO, only where the "
     "live bytes stay within the budget; repeated until nothing that stalls can move. The timings are "
     "placed by the heuristics and, where they miss, the offset ILP, bisecting the target between the selection's own live bytes and the budget "
     "(a longer lead packs worse), so adaptive's planned peak sits just under the budget."),
    ("- The swap file is opened with O_DIRECT (ext4 here): the bytes go through a 512 KiB bounce block "
     "straight to the device, with no page cache to fill, flush and drop. Measured alone (16 MiB): 3.9 ms of "
     "the I/O thread's CPU per write and 3.6 per read, against 9.5 and 12.6 ms buffered, in half the wall "
     "time. Before it (buffered store, same plans, same day): adaptive +27.3% and reduced +54.0% paired at "
     "load 3, I/O CPU 0.28 s/step each, stalls 0.18 and 0.53 s/step."),
    ("- The stall column is what swapping costs directly (the executor waiting for a transfer); the rest of "
     "the overhead is the I/O thread's CPU competing with the kernels on a machine whose other core is busy "
     "with other work, and noise: single ratios swing by +-20% at these load averages, hence the median."),
    ("- Measured peak: RSS increase of a fresh process from just before the arena. The measured - planned "
     "difference is the plain plan's (7.3 MiB: BLAS and interpreter working memory) plus the store's 0.5 MiB "
     "bounce block: the lead is planned memory."),
    ("- `--strategy joint` at 51 MiB does not fit (55.9 MiB): the joint solver plans the fused graph, whose "
     "conv2 ConvGrad (48.3 MiB touched) is the floor, and with `--split-grad` its lowering refuses the split "
     "graph (the schedule was made for 158 nodes, the split graph has 146)."),
]


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1%}"


def _mib(n: float) -> str:
    return f"{n / MiB:.1f}"


def report(args, rows: list[dict], budget_rows: list[dict]) -> str:
    lines = [
        f"# Swap policies: {args.model} (batch {args.batch or 'default'}, {args.optimizer})"
        f"{', ConvGrad split (--split-grad)' if args.split_grad else ''}, {date.today()}",
        "",
        (f"`python benchmarks/bench_swap.py` on {platform.machine()} ({platform.processor() or 'cpu'}), "
        f"numpy executor on the CPU with {args.threads} BLAS thread(s), swap file on {rows[-1]['store'].get('store_fs') or '?'} "
        f"(page cache: {rows[-1]['store'].get('cache') or '-'}); {args.warmup} warm-up + {args.steps} measured "
        f"steps per run, each run in a fresh process (peak: RSS increase from just before the arena). "
        f"No budget: each policy swaps every gap it can, the least memory it reaches, as in the paper."),
        "",
        ("| policy | planned peak MiB | measured peak MiB | swaps | transfers | out MiB/step | in MiB/step "
         "| stalls/step | stall s/step | step s | overhead (runs) | overhead (paired) | stalls / step "
         "| same losses | NNTrainer (paper) |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        key = r["policy"]
        lines.append(
            f"| {key} | {_mib(r['planned_peak'])} | {_mib(r['measured_peak'])} | {r['swaps']} | {r['transfers']} "
            f"| {_mib(r['measured_bytes_out'])} | {_mib(r['measured_bytes_in'])} | {r['stalls']:.0f} "
            f"| {r['stall_seconds']:.3f} | {r['median_step_seconds']:.3f} | {r['overhead']:+.1%} "
            f"| {_pct(r.get('paired_overhead'))} | {r['stall_overhead']:+.1%} "
            f"| {'yes' if r['same_losses'] else 'NO'} | {PAPER.get(key.removesuffix('+split'), '')} |")
    if budget_rows:
        lines += ["", f"## At {args.fraction:.0%} of the no-swap peak, checked against ONNX Runtime", "",
                  ("| model | no-swap peak MiB | budget MiB | chosen | planned peak MiB | measured peak MiB | swaps "
                  "| in MiB/step | overhead | matches ORT (max rel diff) | same as no swap |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in budget_rows:
            if "error" in r:
                lines.append(f"| {r['model']} | failed: {r['error']} |")
                continue
            lines.append(
                f"| {r['model']} | {_mib(r['no_swap_peak'])} | {_mib(r['budget'])} | {r['policy']} "
                f"| {_mib(r['planned_peak'])} | {_mib(r['measured_peak'])} | {r['swaps']} | {_mib(r['bytes_in'])} "
                f"| {r['overhead']:+.1%} | {'yes' if r['verified'] else 'NO'} ({r['max_rel_diff']:.1e}) "
                f"| {'yes' if r['same_as_no_swap'] else 'no'} |")
    lines += ["", "## Reading it", "", *NOTES]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vgg16")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--planner", default="auto")
    p.add_argument("--time-limit", type=float, default=5.0)
    p.add_argument("--budget-models", default="resnet18,resnet18:sgd,transformer",
                   help="NAME or NAME:OPTIMIZER, comma-separated")
    p.add_argument("--fraction", type=float, default=0.25)
    p.add_argument("--pairs", type=int, default=3, help="alternated step pairs for the paired overhead (0: skip)")
    p.add_argument("--skip-policies", action="store_true")
    p.add_argument("--split-grad", action="store_true",
                   help="plan every swapping policy on the split-grad graph (the no-swap baseline stays fused)")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS threads of every run (default 1: the other core is the I/O worker's)")
    p.add_argument("--budget", default=None,
                   help="instead of the policy table: the budget layer's plan at this budget (e.g. 51MiB) beside "
                        "the plain plan and reduced, paired (--pairs rounds)")
    p.add_argument("--out", type=Path, default=Path("reports/swap-vgg16.md"))
    args = p.parse_args(argv)
    from onnxplan.threads import use_threads

    use_threads(args.threads)  # this process's runs (the paired steps, part 2)
    if args.budget is not None:
        table = budget_table(args)
        text = budget_report(args, table)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(table, indent=1))
        print(text)
        return 0
    if args.skip_policies:
        rows = json.loads(args.out.with_suffix(".json").read_text())["policies"]
    else:
        rows = part1(args)
        _write(args, rows, [])
    budget_rows = part2(args)
    print(_write(args, rows, budget_rows))
    return 0


def _write(args, rows: list[dict], budget_rows: list[dict]) -> str:
    text = report(args, rows, budget_rows)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"policies": rows, "budget": budget_rows}, indent=1))
    return text


if __name__ == "__main__":
    sys.exit(main())
