"""Planning at scale: LLaMA-style training steps of 1k-30k nodes, and the default on the zoo.

Usage: python benchmarks/plan_large.py [--layers 6,30,60,180] [--ilp-limit 10]
                                       [--before PYTHON] > reports/plan-large.md

Part 1 (models/llama.py, batch 2, seq 32, d 64): nodes and values of the step graph, the
seconds of each stage of the default `plan` (load = read the artifacts + shape inference;
passes = realize, interleave, inplace; orders = memory and lifetime models, the three
heuristic orders; planners = every heuristic planner on the chosen order (and any other
order whose bound is below the best arena), the ILP if the anytime rule runs it; verify =
the independent re-derivation of lifetimes and overlap check), wall and CPU, peak, lower
bound, fragmentation; then `--planner ilp --time-limit S` on the graphs of 2,500+ nodes.
Artifact generation (onnxruntime-training) is timed apart: it is not planning.

Part 2: load + default plan_step on every zoo model, this checkout against `--before`
(a Python whose onnxplan is the code to compare with), each in a fresh process, in turn.
The machine is shared: the load average (1 min) is printed with every row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _load() -> float:
    return os.getloadavg()[0]


def _llama(layers: int, ilp_limit: float) -> None:
    from onnxplan.ir.load import read_step
    from onnxplan.loading.artifacts import build_artifacts
    from onnxplan.models.llama import build_llama
    from onnxplan.planning import PlanOptions, plan_step

    t0 = time.perf_counter()
    folder = build_artifacts(build_llama(layers=layers), None)
    art = time.perf_counter() - t0
    w0, c0 = time.perf_counter(), time.process_time()
    g = read_step(folder)
    load_w, load_c = time.perf_counter() - w0, time.process_time() - c0
    w1, c1 = time.perf_counter(), time.process_time()
    res = plan_step(g, PlanOptions())
    plan_w, plan_c = time.perf_counter() - w1, time.process_time() - c1
    p, st = res.plan, res.stage_seconds
    mib = 2**20
    print(f"| {layers} | {len(g.nodes)} | {len(g.values)} | {art:.1f} | {load_w:.2f} | {st['passes']:.2f} "
          f"| {st['orders']:.2f} | {st['planners']:.2f} | {st['verify']:.2f} | **{load_w + plan_w:.2f}** "
          f"| {load_c + plan_c:.2f} | {p.order_policy}+{p.planner} | {p.peak_bytes / mib:.2f} "
          f"| {p.lower_bound_bytes / mib:.2f} | {p.fragmentation:.3%} | {_load():.1f} |", flush=True)
    if len(g.nodes) >= 2500 and ilp_limit > 0:
        w2 = time.perf_counter()
        ilp = plan_step(g, PlanOptions(planner="ilp", time_limit=ilp_limit))
        row = ilp.rows[-1]
        best_h = min(r.arena_bytes for r in res.rows if r.planner not in ("naive", "ilp"))
        _ILP_ROWS.append(f"| {len(g.nodes)} | {ilp_limit:g} | {time.perf_counter() - w2:.1f} | {row.solve_seconds:.1f} "
                         f"| {best_h / mib:.3f} | {row.arena_bytes / mib:.3f} | {row.fragmentation:.3%} "
                         f"| {'optimal' if row.optimal else f'{row.gap:.3%}'} | {_load():.1f} |")


_ILP_ROWS: list[str] = []

_TIMER = r"""
import json, os, sys, time
from onnxplan.ir.load import read_step
from onnxplan.models import get_model
from onnxplan.planning import PlanOptions, plan_step
from onnxplan.loading.resolve import resolve_artifacts
from onnxplan.cli.common import model_request
req = model_request(sys.argv[1], None, None, None, None)
folder = resolve_artifacts(req)
w, c = time.perf_counter(), time.process_time()
g = read_step(folder, dims=dict(req.dims), batch=req.batch)
r = plan_step(g, PlanOptions())
print(json.dumps({"wall": time.perf_counter() - w, "cpu": time.process_time() - c, "nodes": len(g.nodes),
                  "peak": r.plan.peak_bytes, "how": r.plan.order_policy + "+" + r.plan.planner}))
"""


def _time_default(python: str, model: str) -> dict:
    out = subprocess.run([python, "-c", _TIMER, model], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", default="6,30,60,180")
    ap.add_argument("--ilp-limit", type=float, default=10.0)
    ap.add_argument("--before", default=None, help="Python of the code to compare the zoo default with")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--skip-zoo", action="store_true")
    ap.add_argument("--extra", nargs="*", default=[], help="more models (artifact folders, forward .onnx) for part 2")
    args = ap.parse_args()
    print(f"# Planning at scale\n\n{os.cpu_count()} cores; load average at start "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min), shared with other work.\n")
    if not args.skip_llama:
        print("## LLaMA-style training steps (default plan)\n")
        print("| layers | nodes | values | artifacts s (cached: build forward + hash) | load s | passes s | orders s | planners s | verify s "
              "| total wall s | total CPU s | chosen | peak MiB | lower bound MiB | fragmentation | load avg |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for layers in (int(x) for x in args.layers.split(",")):
            _llama(layers, args.ilp_limit)
        if _ILP_ROWS:
            print("\n## `--planner ilp` on the large steps (windowed address ILP)\n")
            print("| nodes | time limit s | wall s | ILP s | best heuristic arena MiB | ILP arena MiB "
                  "| fragmentation | gap | load avg |")
            print("|---|---|---|---|---|---|---|---|---|")
            print("\n".join(_ILP_ROWS))
    from onnxplan.models import list_models

    names = [] if args.skip_zoo else [spec.name for spec in list_models()]
    names += args.extra
    print("\n## Default `plan` (load + plan_step) per model\n")
    cols = "| model | nodes | after wall s | after CPU s | after peak B | after chosen |"
    if args.before:
        cols += " before wall s | before CPU s | before peak B | peak change |"
    print(cols + " load avg |")
    print("|" + "---|" * (cols.count("|") - 1 + 1))
    for name in names:
        try:
            after = _time_default(sys.executable, name)
        except subprocess.CalledProcessError as exc:
            print(f"| {os.path.basename(name)} | this checkout cannot plan it: "
                  f"{(exc.stderr or '').strip().splitlines()[-1][:100]} |", flush=True)
            continue
        line = (f"| {os.path.basename(name)} | {after['nodes']} | {after['wall']:.2f} | {after['cpu']:.2f} | {after['peak']} "
                f"| {after['how']} |")
        if args.before:
            before = _time_default(args.before, name)
            line += (f" {before['wall']:.2f} | {before['cpu']:.2f} | {before['peak']} "
                     f"| {after['peak'] / before['peak'] - 1:+.3%} |")
        print(line + f" {_load():.1f} |", flush=True)


if __name__ == "__main__":
    main()
