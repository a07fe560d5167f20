"""`run --verify` over the zoo: models x batches x optimizers x memory policies (plain, every swap
policy, every checkpoint policy), each verified step by step against ONNX Runtime
(onnxplan.verification). Resumable: rows are appended to a JSON-lines file; a row already there
is skipped.

Usage: python benchmarks/verify_matrix.py [--models mlp,resnet18] [--batches 2,4,8,default]
       [--optimizers adamw,sgd] [--policies plain,on-demand,...,rotor] [--steps 2]
       [--out reports/verify-matrix.jsonl] [--markdown reports/verify-matrix.md]
       [--skip-in a.jsonl,b.jsonl]   (rows already in these files are skipped too)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SWAPS = ("on-demand", "reduced", "proactive", "window")
CHECKPOINTS = ("sqrt", "chen", "rotor")
POLICIES = ("plain", *SWAPS, *CHECKPOINTS)


def verify_one(model: str, batch: int | None, optimizer: str, policy: str, steps: int) -> dict:
    from onnxplan.budget import MemoryRequest, plan_for_budget
    from onnxplan.executor.prepare import Prepared
    from onnxplan.loading import open_step
    from onnxplan.loading.request import LoadRequest
    from onnxplan.planning import PlanOptions
    from onnxplan.verification.step_check import verify_run

    req = LoadRequest(model, batch, optimizer)
    folder, graph = open_step(req)
    memory = MemoryRequest(swap=policy if policy in SWAPS else None,
                           checkpoint=policy if policy in CHECKPOINTS else None)
    t0 = time.perf_counter()
    res = plan_for_budget(graph, PlanOptions(), memory)
    v = verify_run(Prepared(folder, res.graph, res.plan), steps=steps)
    worst = {}
    for s in v.steps:
        for k, c in s.checks.items():
            if k not in worst or c.error / c.tolerance > worst[k]["ratio"]:
                worst[k] = {"name": c.name, "error": c.error, "ratio": c.error / c.tolerance}
    return {"model": model, "batch": batch or "default", "optimizer": optimizer, "policy": policy,
            "ok": v.ok, "steps": len(v.steps), "worst": worst, "summary": v.summary(),
            "swaps": len(res.plan.swaps), "seconds": time.perf_counter() - t0}


def _cell(worst: dict, key: str) -> str:
    w = worst.get(key)
    if w is None:
        return "-"
    if w["error"] is None or w["error"] == float("inf"):
        return f"{w['name']} inf"
    return f"{w['name']} {w['error']:.1e} ({w['ratio']:.2f}x)"


def markdown(rows: list[dict]) -> str:
    lines = [("| model | batch | optimizer | policy | verified | worst gradient (rel. norm error, x tol) | "
              "worst update | worst running stat | seconds |"), "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['optimizer']} | {r['policy']} | ERROR | "
                         f"{r['error'][:80]} | | | |")
            continue
        cells = [_cell(r["worst"], k) for k in ("gradient", "update", "running")]
        lines.append(f"| {r['model']} | {r['batch']} | {r['optimizer']} | {r['policy']} | "
                     f"{'yes' if r['ok'] else 'NO: ' + r['summary'][:80]} | {' | '.join(cells)} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="")
    ap.add_argument("--batches", default="2,4,8,default")
    ap.add_argument("--optimizers", default="adamw,sgd")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default="reports/verify-matrix.jsonl")
    ap.add_argument("--markdown", default="")
    ap.add_argument("--inputs", default="", help="with --markdown: only write the table of these JSON-lines files")
    ap.add_argument("--skip-in", default="", help="comma-separated JSON-lines files whose rows count as done")
    a = ap.parse_args()
    if a.inputs:
        rows = [json.loads(line) for f in a.inputs.split(",") for line in Path(f).read_text().splitlines()]
        Path(a.markdown).write_text(markdown(rows))
        return
    from onnxplan.models import list_models

    models = a.models.split(",") if a.models else [m.name for m in list_models()]
    out = Path(a.out)
    done = set()
    rows = []
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            rows.append(r)
            done.add((r["model"], str(r["batch"]), r["optimizer"], r["policy"]))
    for f in filter(None, a.skip_in.split(",")):
        for line in Path(f).read_text().splitlines():
            r = json.loads(line)
            done.add((r["model"], str(r["batch"]), r["optimizer"], r["policy"]))
    for model in models:
        for b in a.batches.split(","):
            for opt in a.optimizers.split(","):
                for policy in a.policies.split(","):
                    key = (model, b, opt, policy)
                    if key in done:
                        continue
                    batch = None if b == "default" else int(b)
                    try:
                        row = verify_one(model, batch, opt, policy, a.steps)
                    except Exception as exc:  # noqa: BLE001 - a row per failure, the sweep goes on
                        row = {"model": model, "batch": b, "optimizer": opt, "policy": policy,
                               "error": f"{type(exc).__name__}: {exc}"}
                    row["batch"] = b
                    print(json.dumps(row), flush=True)
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    rows.append(row)
    if a.markdown:
        Path(a.markdown).write_text(markdown(rows))


if __name__ == "__main__":
    main()
