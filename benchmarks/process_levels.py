"""How much a fresh process's speed level moves on this machine, with no onnxplan code in it.

Each of N fresh interpreters runs the same plain numpy loop (four 64 x 4096 x 256 float32
products and eight passes over 4 MiB, numpy's BLAS at one thread) for SECONDS, and reports the
median of its first five steps, of steps 10-30, of its second half, and its least step. Where the
medians differ between processes by a third with no onnxplan code in them, a benchmark cell of one
process is a draw from the machine's spells (what the host runs beside this VM), for any program:
compare with several alternating processes (`bench --rounds`; reports/threads.md, session 20).

Usage: python benchmarks/process_levels.py [--processes 8] [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
from threadpoolctl import threadpool_limits
threadpool_limits(1)
rng = np.random.default_rng(0)
a = rng.standard_normal((64, 4096), dtype=np.float32)
w = rng.standard_normal((4096, 256), dtype=np.float32)
b = np.empty((64, 256), np.float32)
x = rng.standard_normal(1 << 20, dtype=np.float32)
y = np.empty_like(x)
ts = []
end = time.perf_counter() + float(sys.argv[1])
while time.perf_counter() < end:
    t = time.perf_counter()
    for _ in range(4):
        np.matmul(a, w, out=b)
    for _ in range(4):
        np.multiply(x, 1.01, out=y)
        np.add(y, x, out=y)
    ts.append(time.perf_counter() - t)
print(json.dumps(ts))
"""


def one_process(seconds: float) -> list[float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(seconds)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    ms = lambda v: f"{v * 1e3:.2f}"  # noqa: E731
    print(f"load average {os.getloadavg()[0]:.2f}; {args.processes} fresh processes, {args.seconds} s each (ms)\n")
    print("| process | steps | first 5 | steps 10-30 | second half | least |")
    print("|---|---|---|---|---|---|")
    halves, least = [], []
    for i in range(args.processes):
        ts = one_process(args.seconds)
        half = statistics.median(ts[len(ts) // 2:])
        halves.append(half)
        least.append(min(ts))
        print(f"| {i + 1} | {len(ts)} | {ms(statistics.median(ts[:5]))} | {ms(statistics.median(ts[10:30]))} "
              f"| {ms(half)} | {ms(min(ts))} |")
    print(f"\nsecond halves: {ms(min(halves))}-{ms(max(halves))} ms (+{max(halves) / min(halves) - 1:.0%}); "
          f"least steps: {ms(min(least))}-{ms(max(least))} ms (+{max(least) / min(least) - 1:.0%})")


if __name__ == "__main__":
    main()
