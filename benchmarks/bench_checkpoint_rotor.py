"""Benchmark: rotor's dynamic program on deep transformer chains (24 layers and more), 500 slots.

Prints, per model: chain stages, time to cut the chain, to fill the table, and to read back
the schedules of 10 memory limits. The target is under 5 s for a chain of 100+ stages.
Run: python benchmarks/bench_checkpoint_rotor.py [--layers 24 52] [--batch 16]
"""

from __future__ import annotations

import argparse
import time

from onnxplan.checkpoint.chain import build_chain
from onnxplan.checkpoint.rotor import rotor_schedule, rotor_table_for_chain
from onnxplan.checkpoint.schedule import simulate, store_all
from onnxplan.ir.load import read_step
from onnxplan.loading.artifacts import build_artifacts
from onnxplan.models import build_transformer
from onnxplan.pipeline import run_pipeline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[24, 52])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--slots", type=int, default=500)
    args = ap.parse_args()

    print("| layers | stages | step nodes | chain cut (s) | rotor table (s) | 10 schedules (s) | min / store-all model peak |")
    print("|---|---|---|---|---|---|---|")
    for layers in args.layers:
        g = read_step(build_artifacts(build_transformer(args.batch, layers=layers), None, optimizer="adamw"))
        pre = run_pipeline(g, ["realize", "interleave"])[0]
        t0 = time.perf_counter()
        chain = build_chain(pre)
        t1 = time.perf_counter()
        costs = chain.costs()
        top = simulate(costs, store_all(costs.length)).peak
        tab = rotor_table_for_chain(costs, args.slots)
        t2 = time.perf_counter()
        lo, hi = tab.min_feasible(), tab.slots
        peaks = [simulate(costs, rotor_schedule(tab, lo + k * (hi - lo) // 9).ops).peak for k in range(10)]
        t3 = time.perf_counter()
        print(f"| {layers} | {chain.length} | {len(pre.nodes)} | {t1 - t0:.2f} | {tab.solve_seconds:.2f} | "
              f"{t3 - t2:.3f} | {peaks[0] / top:.1%} |")


if __name__ == "__main__":
    main()
