"""The CI memory gate's wall time: this checkout against another, interleaved, warm cache.

Usage: python benchmarks/gate_time.py --before /path/to/other/.venv/bin/python [--rounds 5]

The gate is what .ci/run runs after the tests: plan every zoo model with the CI strategies
(planned peaks only, no runs) and compare with the committed baseline, i.e.
`onnxplan bench --all --strategies ci --no-measure -o F` then `onnxplan check F --baseline
reports/baseline.json` (`onnxplan check` with no arguments does both). Each checkout runs
both commands from its own root, in fresh processes. One warm-up round each first builds
the artifacts into the shared cache ($ONNXPLAN_CACHE), so the rounds time planning, not
onnxruntime-training's artifact generation (the gate in CI finds most of them built by the
tests). Rounds alternate between the two checkouts; wall seconds and the children's CPU
seconds (user + sys) are printed per round with the load average, then the medians, and the
planned peaks of the two are compared row by row.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CLI = "from onnxplan.cli.app import main; main()"


def _root(python: str) -> Path:
    out = subprocess.run([python, "-c", "import onnxplan, pathlib; print(pathlib.Path(onnxplan.__file__).parents[1])"],
                         capture_output=True, text=True, check=True, cwd="/")
    return Path(out.stdout.strip())


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _gate(python: str, out: Path) -> tuple[float, float]:
    """One gate run of `python`'s checkout: (wall s, CPU s)."""
    root = _root(python)
    env = {**os.environ, "ONNXPLAN_PROGRESS": "off"}
    w0, c0 = time.perf_counter(), _children_cpu()
    for argv in (["bench", "--all", "--strategies", "ci", "--no-measure", "-o", str(out)],
                 ["check", str(out), "--baseline", "reports/baseline.json"]):
        done = subprocess.run([python, "-c", _CLI, *argv], cwd=root, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"{root}: onnxplan {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return time.perf_counter() - w0, _children_cpu() - c0


def _peaks(path: Path) -> dict[tuple, int]:
    rows = json.loads(path.read_text())["rows"]
    return {(r["model"], r["batch"], r["strategy"]): r["planned_peak_bytes"] for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="a Python whose onnxplan is the checkout to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gate-time-"))
    sides = {"after": sys.executable, "before": args.before}
    outs = {side: tmp / f"{side}.json" for side in sides}
    for side, python in sides.items():  # warm-up: artifacts into the cache
        _gate(python, outs[side])
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    print(f"threads: OMP/MKL/OPENBLAS = {os.environ.get('OMP_NUM_THREADS', 'unset')}; "
          f"cache {os.environ.get('ONNXPLAN_CACHE', '~/.cache/onnxplan/artifacts')}\n")
    print("| round | before wall s | before CPU s | after wall s | after CPU s | load avg |")
    print("|---|---|---|---|---|---|")
    for k in range(args.rounds):
        order = ("before", "after") if k % 2 == 0 else ("after", "before")
        for side in order:
            times[side].append(_gate(sides[side], outs[side]))
        (bw, bc), (aw, ac) = times["before"][-1], times["after"][-1]
        print(f"| {k + 1} | {bw:.2f} | {bc:.2f} | {aw:.2f} | {ac:.2f} | {os.getloadavg()[0]:.1f} |", flush=True)
    med = {side: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for side, ts in times.items()}
    print(f"| **median** | **{med['before'][0]:.2f}** | **{med['before'][1]:.2f}** | **{med['after'][0]:.2f}** "
          f"| **{med['after'][1]:.2f}** | |")
    print(f"\nafter / before: wall {med['after'][0] / med['before'][0]:.2f}x, CPU {med['after'][1] / med['before'][1]:.2f}x")
    before, after = _peaks(outs["before"]), _peaks(outs["after"])
    common = before.keys() & after.keys()
    worse = sorted(k for k in common if after[k] > before[k])
    lower = sorted(k for k in common if after[k] < before[k])
    print(f"planned peaks: {len(common)} rows in both, {len(worse)} higher, {len(lower)} lower, "
          f"{len(common) - len(worse) - len(lower)} equal; only before {len(before.keys() - common)}, "
          f"only after {len(after.keys() - common)}")
    for k in worse + lower:
        print(f"  {k[0]} b{k[1]} {k[2]}: {before[k]:,} -> {after[k]:,} B")


if __name__ == "__main__":
    main()
