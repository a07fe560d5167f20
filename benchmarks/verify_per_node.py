"""Two probes of `run --verify`'s per-node check (onnxplan/verification/node_check.py), as
reports/verify-faults-full.md quotes them:

    python benchmarks/verify_per_node.py time hf-resnet@full:4 --rounds 2
        one verified step of the correct run with the per-node check on and off, interleaved
        in one process after a warm-up (least of the rounds);
    python benchmarks/verify_per_node.py unbiased hf-efficientnet@full
        with tests/faults.py's unbiased-var planted, each BatchNorm's per-node check of its
        running variance (error, tolerance, values per channel), largest error / tolerance first.

MODEL[:BATCH]; the full-size artifacts are cached under $ONNXPLAN_CACHE.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxplan.verification.step_check as step_check  # noqa: E402
from onnxplan.verification.step_check import verify_run  # noqa: E402
from tests.faults import FAULTS, prepared  # noqa: E402


def _prepared(arg: str):
    model, _, b = arg.partition(":")
    return prepared(model, int(b) if b else None)


def time_on_off(arg: str, rounds: int) -> None:
    prep = _prepared(arg)
    real = step_check.NodeReference
    verify_run(prep, steps=1)  # warm-up: artifacts, imports, caches
    seconds: dict[str, list[float]] = {"off": [], "on": []}
    with pytest.MonkeyPatch.context() as mp:
        for _ in range(rounds):
            for mode in ("off", "on"):
                mp.setattr(step_check, "NodeReference", real if mode == "on" else (lambda model: None))
                t0 = time.perf_counter()
                v = verify_run(prep, steps=1)
                seconds[mode].append(time.perf_counter() - t0)
                assert v.ok, v.summary()
                print(f"{mode}: {seconds[mode][-1]:.1f} s (load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"least: on {min(seconds['on']):.1f} s, off {min(seconds['off']):.1f} s, "
          f"ratio {min(seconds['on']) / min(seconds['off']):.2f}")


def unbiased(arg: str) -> None:
    rows: list[tuple[float, float, float, int, str]] = []
    real = step_check.compare_node

    def recording(node, outputs, theirs, floors, inputs):
        checks = real(node, outputs, theirs, floors, inputs)
        if node.op_type == "BatchNormInternal":
            n = inputs[0].size // inputs[0].shape[1]
            rows.extend((c.error / c.tolerance, c.error, c.tolerance, n, node.name) for c in checks
                        if c.name == node.outputs[2])
        return checks

    fault = next(f for f in FAULTS if f.name == "unbiased-var")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_check, "compare_node", recording)
        planted = fault.plant(mp, _prepared(arg))
        assert planted is not None, f"{arg} has no BatchNormInternal"
        v = verify_run(planted.prepared, steps=1)
    print(f"{arg}: {'caught' if not v.ok else 'missed'}; {len(rows)} BatchNorms; error / tolerance, error, "
          "tolerance, values per channel, node:")
    for r in sorted(rows, reverse=True)[:8]:
        print(f"  {r[0]:.3g}  {r[1]:.3g}  {r[2]:.3g}  {r[3]}  {r[4]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("probe", choices=["time", "unbiased"])
    ap.add_argument("model", help="MODEL[:BATCH]")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.probe == "time":
        time_on_off(args.model, args.rounds)
    else:
        unbiased(args.model)


if __name__ == "__main__":
    main()
