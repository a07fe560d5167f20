"""Planted faults at the sizes users train: `run --verify` must still fail on a wrong run when
its tolerances have grown with the work (reductions over 224x224 images, long inner dimensions).

For each model: the correct run (must pass), then every fault of tests/faults.py (must fail,
naming the faulty node where the fault has one). One process; each verification its own
executor and ONNX Runtime sessions.

    python benchmarks/verify_faults_full.py hf-mobilenet-v2@full hf-efficientnet@full hf-resnet@full:4 \
        --out reports/verify-faults-full.md

MODEL[:BATCH] (default: the model's batch). The full-size artifacts are cached under
$ONNXPLAN_CACHE (first use exports them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxplan.executor.runner import KernelError  # noqa: E402
from onnxplan.verification.step_check import verify_run  # noqa: E402
from tests.faults import FAULTS, prepared  # noqa: E402


def _row(model: str, fault: str, what: str, expect_ok: bool, v, expected: str | None, kind: str | None,
         seconds: float) -> dict:
    bad = next((s for s in v.steps if not s.ok), None)
    first = bad.first_difference if bad is not None else None
    named = first.node if first is not None else (bad.failures[0].node if bad is not None else "")
    if expect_ok:
        verdict = "ok" if v.ok else "FALSE ALARM"
    elif v.ok:
        verdict = "MISSED"
    elif expected is not None and named != expected:
        verdict = f"caught, named {named!r} (planted at {expected!r})"
    elif kind is not None and bad is not None and not any(c.kind == kind for c in bad.failures):
        verdict = f"caught, but not by a {kind} check"
    else:
        verdict = "caught"
    worst = max(v.steps[0].checks.values(), key=lambda c: c.error / c.tolerance) if v.steps else None
    ratio = (first.error / first.tolerance) if first is not None else (worst.error / worst.tolerance if worst else 0)
    return {"model": model, "fault": fault, "what": what, "verdict": verdict, "named": named or "",
            "planted_at": expected or "", "error_over_tolerance": round(float(ratio), 3), "seconds": round(seconds, 1)}


def run_model(arg: str, only: set[str] | None = None) -> list[dict]:
    model, _, b = arg.partition(":")
    batch = int(b) if b else None
    rows = []
    base = prepared(model, batch)
    if only is None or "none" in only:
        t0 = time.perf_counter()
        v = verify_run(base, steps=1)
        rows.append(_row(model, "none", "the correct run", True, v, None, None, time.perf_counter() - t0))
        print(json.dumps(rows[-1]), flush=True)
    for fault in (f for f in FAULTS if only is None or f.name in only):
        prep = prepared(model, batch, **fault.replan) if fault.replan else prepared(model, batch)
        with pytest.MonkeyPatch.context() as mp:
            planted = fault.plant(mp, prep)
            if planted is None:
                rows.append({"model": model, "fault": fault.name, "what": fault.what, "verdict": "no victim",
                             "named": "", "planted_at": "", "error_over_tolerance": 0, "seconds": 0})
                print(json.dumps(rows[-1]), flush=True)
                continue
            t0 = time.perf_counter()
            try:
                v = verify_run(planted.prepared, steps=1)
            except KernelError as exc:  # garbage in (a stale swap-in of pooling indices): a kernel refuses it
                rows.append({"model": model, "fault": fault.name, "what": fault.what,
                             "verdict": "caught: the run stops with a kernel error", "named": str(exc).split("'")[1] if "'" in str(exc) else str(exc),
                             "planted_at": planted.node or "", "error_over_tolerance": float("inf"),
                             "seconds": round(time.perf_counter() - t0, 1)})
            else:
                rows.append(_row(model, fault.name, fault.what, False, v, planted.node, planted.kind,
                                 time.perf_counter() - t0))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| model | fault | verdict | first difference named | error / tolerance | s |", "|---|---|---|---|---|---|"]
    out += [f"| {r['model']} | {r['fault']} | {r['verdict']} | `{r['named']}` | {r['error_over_tolerance']} | "
            f"{r['seconds']} |" for r in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="MODEL[:BATCH]")
    ap.add_argument("--faults", help="comma-separated fault names (none: the correct run); default all")
    ap.add_argument("--out", help="write the markdown table here (and the rows as JSON beside it)")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    only = set(args.faults.split(",")) if args.faults else None
    rows = [r for m in args.models for r in run_model(m, only)]
    text = (f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {load:.2f} at the start, "
            f"{os.getloadavg()[0]:.2f} at the end; default threads.\n\n" + table(rows) + "\n")
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
