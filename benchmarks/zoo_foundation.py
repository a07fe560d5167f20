"""Print the zoo table: nodes, parameter/activation bytes, ORT step latency and ORT peak.

Usage: python benchmarks/zoo_foundation.py [MODEL ...] [--steps N] > reports/zoo-foundation.md
Full-size zoo models; ORT figures come from the peak-RSS probe (a fresh subprocess per model,
peak RSS increase from just before the session is created); latency = median step of N.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from datetime import date

from onnxplan.ir.load import read_step
from onnxplan.loading.artifacts import build_artifacts
from onnxplan.memprobe import probe_reference
from onnxplan.models import build_forward, get_model, list_models
from onnxplan.sizes import format_bytes


def row(name: str, steps: int) -> dict:
    spec = get_model(name)
    folder = build_artifacts(build_forward(name), None, optimizer=spec.default_optimizer)
    g = read_step(folder)
    by_class = g.bytes_by_class()
    probe = probe_reference(folder, steps=steps)
    lat = probe.result["step_seconds"][1:] or probe.result["step_seconds"]  # first step warms up
    return {
        "model": name, "batch": spec.default_batch, "optimizer": spec.default_optimizer,
        "nodes": len(g.nodes), "parameter_bytes": by_class["parameter"],
        "activation_bytes": by_class["activation"],
        "ort_step_seconds": statistics.median(lat), "ort_peak_bytes": probe.peak_increase_bytes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    names = args.models or [m.name for m in list_models()]
    print(f"# Zoo at full size — {date.today()} — {platform.machine()}, {platform.python_version()}\n")
    print("| model | batch | optimizer | nodes | parameter bytes | activation bytes | ORT step (median) | ORT peak (probe) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        r = row(name, args.steps)
        print(f"| {r['model']} | {r['batch']} | {r['optimizer']} | {r['nodes']} | {format_bytes(r['parameter_bytes'])} "
              f"| {format_bytes(r['activation_bytes'])} | {r['ort_step_seconds'] * 1000:.1f} ms "
              f"| {format_bytes(r['ort_peak_bytes'])} |", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
