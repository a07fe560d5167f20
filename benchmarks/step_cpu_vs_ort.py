"""Step CPU time of ours against ONNX Runtime (time.thread_time: this thread's CPU seconds, far less
sensitive than wall time to other processes on a shared machine), interleaved, one thread each,
`--rounds` rounds of 2 steps; then our per-op CPU profile (median of 3 steps, top 8 ops).

Usage: python benchmarks/step_cpu_vs_ort.py MODEL[:BATCH] ... [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # before numpy/torch load
    os.environ[_v] = "1"

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def bench(item: str, rounds: int) -> dict:
    from step_vs_ort import _Ort

    from onnxplan.data import make_step_batch, read_input_specs
    from onnxplan.executor.prepare import prepare
    from onnxplan.executor.runner import Executor, initial_parameters
    from onnxplan.planning import PlanOptions
    from onnxplan.resolve import ModelRequest

    name, _, b = item.partition(":")
    prep = prepare(ModelRequest(name, int(b) if b else None), PlanOptions())
    folder = str(prep.folder)
    specs, labels = read_input_specs(folder)
    batches = [make_step_batch(specs, labels, 0, k) for k in range(2)]
    ex = Executor(prep.graph, prep.plan)
    ex.load_state(initial_parameters(folder))
    with tempfile.TemporaryDirectory() as scratch:
        ort = _Ort(folder, scratch)
        ex.step(batches[0])
        ort.step(batches[0])
        ours, theirs = [], []
        for _ in range(rounds):
            for batch in batches:
                t0 = time.thread_time()
                ex.step(batch)
                ours.append(time.thread_time() - t0)
                t0 = time.thread_time()
                ort.step(batch)
                theirs.append(time.thread_time() - t0)
        profs = [ex.timed_nodes(batches[0], clock=time.thread_time)[1] for _ in range(3)]
    ops: dict[str, float] = {}
    for c in ex.calls:
        ops[c.node.op_type] = ops.get(c.node.op_type, 0.0) + statistics.median(p[c.node.name] for p in profs)
    o, t = statistics.median(ours), statistics.median(theirs)
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:8]
    return {"model": name, "ours_ms": 1e3 * o, "ort_ms": 1e3 * t, "ratio": o / t,
            "arena_mib": prep.plan.arena_bytes / 2**20, "ops_ms": {k: 1e3 * v for k, v in top}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from onnxplan.executor.threads import set_blas_threads

    torch.set_num_threads(1)
    set_blas_threads(1)
    rows = []
    for item in args.models:
        r = bench(item, args.rounds)
        rows.append(r)
        print(f"{r['model']}: ours {r['ours_ms']:.2f} ms CPU, ORT {r['ort_ms']:.2f}, ours/ORT {r['ratio']:.2f}, "
              f"arena {r['arena_mib']:.2f} MiB; " + ", ".join(f"{k} {v:.2f}" for k, v in r["ops_ms"].items()),
              flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
