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
    elif kind is not None and bad is not None and not any(c.kind in (kind, "node") for c in bad.failures):
        verdict = f"caught, but not by a {kind} check nor per node"
    else:
        verdict = "caught"
    worst = max(v.steps[0].checks.values(), key=lambda c: c.ratio) if v.steps else None
    ratio = first.ratio if first is not None else (worst.ratio if worst else 0)
    nodes = v.steps[0].nodes if v.steps else None
    return {"model": model, "fault": fault, "what": what, "verdict": verdict, "named": named or "",
            "planted_at": expected or "", "caught_by": caught_by(bad.failures if bad is not None else []),
            "error_over_tolerance": round(float(ratio), 3),
            "end_to_end": round(float(_worst_ratio(v, lambda k: k != "node")), 3),
            "per_node": round(float(_worst_ratio(v, lambda k: k == "node")), 3),
            "nodes_checked": nodes.checked if nodes is not None else 0,
            "nodes_skipped": dict(nodes.skipped) if nodes is not None else {}, "seconds": round(seconds, 1)}


def caught_by(failures: list) -> str:
    """Which check failed: end-to-end (loss, gradients, updates, running statistics), per node, both."""
    kinds = {c.kind for c in failures}
    e2e, node = bool(kinds - {"node"}), "node" in kinds
    return "both" if e2e and node else "per node" if node else "end-to-end" if e2e else ""


def _worst_ratio(v, kind_ok) -> float:
    """The largest error / tolerance of the first step's checks of the kinds `kind_ok` accepts."""
    if not v.steps:
        return 0.0
    s = v.steps[0]
    checks = [c for c in s.checks.values() if kind_ok(c.kind)] + [c for c in s.failures if kind_ok(c.kind)]
    return max((c.ratio for c in checks), default=0.0)


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
                             "named": "", "planted_at": "", "caught_by": "", "error_over_tolerance": 0,
                             "end_to_end": 0, "per_node": 0, "seconds": 0})
                print(json.dumps(rows[-1]), flush=True)
                continue
            t0 = time.perf_counter()
            try:
                v = verify_run(planted.prepared, steps=1)
            except KernelError as exc:  # garbage in (a stale swap-in of pooling indices): a kernel refuses it
                rows.append({"model": model, "fault": fault.name, "what": fault.what,
                             "verdict": "caught: the run stops with a kernel error", "named": str(exc).split("'")[1] if "'" in str(exc) else str(exc),
                             "planted_at": planted.node or "", "caught_by": "the run (a kernel error)",
                             "error_over_tolerance": float("inf"), "end_to_end": float("inf"), "per_node": 0,
                             "seconds": round(time.perf_counter() - t0, 1)})
            else:
                rows.append(_row(model, fault.name, fault.what, False, v, planted.node, planted.kind,
                                 time.perf_counter() - t0))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| model | fault | verdict | caught by | first difference named | error / tolerance | "
           "worst end-to-end | worst per node | s |", "|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['model']} | {r['fault']} | {r['verdict']} | {r['caught_by'] or '-'} | `{r['named']}` | "
            f"{r['error_over_tolerance']} | {r['end_to_end']} | {r['per_node']} | {r['seconds']} |" for r in rows]
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
