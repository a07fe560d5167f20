"""Plan every zoo model with every order and planner; print peaks against ONNX Runtime's.

Usage: python benchmarks/plan_zoo.py [MODEL ...] [--time-limit S] [--no-ort] > reports/plan-zoo.md
Prints, per model: order x planner -> peak, lower bound, fragmentation, solve seconds (the
pipeline realize -> interleave -> inplace), the savings of in-place and interleaving measured
separately (each switched off alone, best order, best planner), and the same step's peak in
ONNX Runtime from the foundation's probe (a fresh subprocess, peak RSS increase).
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import date

from onnxplan.ir.analysis import alias_roots
from onnxplan.ir.load import read_step
from onnxplan.loading.artifacts import build_artifacts
from onnxplan.models import build_forward, get_model, list_models
from onnxplan.offsets import PLANNERS, lower_bound, plan_offsets
from onnxplan.orders import order_nodes
from onnxplan.passes.lifetimes import lifetimes
from onnxplan.pipeline import run_pipeline
from onnxplan.planning import PlanOptions, pipeline_names, plan_step
from onnxplan.sizes import format_bytes
from onnxplan.verify import verify_offsets

ORDERS = ("given", "nntrainer", "greedy", "ilp")


def mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def sweep(name: str, time_limit: float, ort_peak: int | None) -> None:
    spec = get_model(name)
    folder = build_artifacts(build_forward(name), None, optimizer=spec.default_optimizer)
    graph = read_step(folder)
    g, _ = run_pipeline(graph, pipeline_names(PlanOptions()))
    roots = alias_roots(g)
    print(f"\n## {name} (batch {spec.default_batch}, {spec.default_optimizer}, {len(g.nodes)} nodes)\n")
    print("| order | planner | peak MiB | lower bound MiB | fragmentation | seconds | order seconds |")
    print("|---|---|---|---|---|---|---|")
    best = None
    for policy in ORDERS:
        res = order_nodes(g, policy, buffer_of=roots, time_limit=time_limit)
        lt = lifetimes(g, res.order)
        bound = lower_bound(lt.buffers)
        seed = None
        for planner in PLANNERS:
            kw = {"time_limit": time_limit}
            if planner == "ilp" and seed is not None:
                kw["seed_plan"] = seed
            t0 = time.perf_counter()
            op = plan_offsets(planner, lt.buffers, **kw)
            secs = time.perf_counter() - t0
            verify_offsets(lt.buffers, op)
            if planner not in ("naive", "ilp") and (seed is None or op.arena_bytes < seed.arena_bytes):
                seed = op
            peak = lt.persistent_bytes + op.arena_bytes
            frag = op.arena_bytes / bound - 1 if bound else 0.0
            print(f"| {policy} | {planner} | {mib(peak)} | {mib(lt.persistent_bytes + bound)} | "
                  f"{frag:.2%} | {secs:.3f} | {res.solve_seconds:.2f} |", flush=True)
            if best is None or peak < best[0]:
                best = (peak, policy, planner, frag)
    chosen = {}
    for label, opts in (("all passes", PlanOptions(order="auto", time_limit=time_limit)),
                        ("no in-place", PlanOptions(order="auto", inplace=False, time_limit=time_limit)),
                        ("no interleave", PlanOptions(order="auto", interleave=False, time_limit=time_limit))):
        chosen[label] = plan_step(graph, opts).plan
    full = chosen["all passes"].peak_bytes
    print(f"\nbest: {mib(best[0])} MiB by {best[1]} + {best[2]} (fragmentation {best[3]:.2%}); "
          f"ONNX Runtime peak (probe): {format_bytes(ort_peak) if ort_peak else 'not measured'}"
          + (f" -> onnxplan / ORT = {best[0] / ort_peak:.2f}" if ort_peak else ""))
    print(f"savings (auto order, auto planner): in-place {mib(chosen['no in-place'].peak_bytes - full)} MiB "
          f"({(chosen['no in-place'].peak_bytes - full) / chosen['no in-place'].peak_bytes:.1%} of the peak without it), "
          f"interleave {mib(chosen['no interleave'].peak_bytes - full)} MiB "
          f"({(chosen['no interleave'].peak_bytes - full) / chosen['no interleave'].peak_bytes:.1%})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--no-ort", action="store_true", help="skip the ONNX Runtime probe")
    args = ap.parse_args()
    names = args.models or [m.name for m in list_models()]
    print(f"# Planning the zoo — {date.today()} — {platform.machine()}, Python {platform.python_version()}")
    print(f"\nILP time limit {args.time_limit:g} s per solve. Peaks include persistent state "
          "(parameters, optimizer state); MiB = 2^20 bytes.")
    for name in names:
        ort_peak = None
        if not args.no_ort:
            from onnxplan.memprobe import probe_reference

            spec = get_model(name)
            folder = build_artifacts(build_forward(name), None, optimizer=spec.default_optimizer)
            ort_peak = probe_reference(folder, steps=3).peak_increase_bytes
        sweep(name, args.time_limit, ort_peak)


if __name__ == "__main__":
    main()
