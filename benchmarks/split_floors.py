"""Benchmark: the floor of every model with and without node splitting (issue 28, Deliver 4).

Per model (NAME or NAME:BATCH): the plain plan's peak; swap's floor without splitting (the least an
unsplit plan reaches: the node with the largest working set, whatever else is swapped or
recomputed) and with splitting (the floor of the split graph: the node that sets it splits in no
K, and why). Both are bounds the budget layer computes (`plan --budget 1B` names the second);
planning only, nothing runs, so the figures do not depend on the machine's load.

Run: PYTHONPATH=. python benchmarks/split_floors.py [--models transformer:16 gpt:16 ...]
     [--json reports/split-floors.json] [-o reports/split-floors.md]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import onnxplan
from benchmarks.split_steps import swap_floor
from onnxplan.api import solve
from onnxplan.sizes import format_bytes

MODELS = ("mlp", "nnt-linear", "nnt-conv2d", "nnt-fc3", "nnt-conv-ac-fl", "vgg16", "resnet18:16", "transformer:16",
          "gpt:16")


def floors(spec: str) -> dict:
    name, _, batch = spec.partition(":")
    t0 = time.perf_counter()
    step = onnxplan.load(name, batch=int(batch) if batch else None)
    plain = solve(step).plan.peak_bytes
    before, after = swap_floor(step, split=False), swap_floor(step, split=True)
    return {"model": spec, "plain_peak": plain,
            "unsplit_floor": before.bound, "unsplit_node": before.node,
            "split_floor": after.bound, "split_node": after.node, "split_chunks": after.chunks,
            "why_not_split": after.unsplit,
            "seconds": time.perf_counter() - t0}


def table(rows: list[dict]) -> list[str]:
    out = ["| model | plain peak | floor without splits | the node | **floor with splits** | the node, why it does not split | ratio |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {format_bytes(r['plain_peak'])} | {format_bytes(r['unsplit_floor'])} | "
                   f"`{r['unsplit_node']}` | **{format_bytes(r['split_floor'])}** | `{r['split_node']}`"
                   f"{f' (one of {c} chunks)' if (c := r.get('split_chunks')) else ''}: "
                   f"{r['why_not_split'] or '-'} | {r['split_floor'] / r['unsplit_floor']:.2f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    rows = []
    for spec in args.models:
        rows.append(floors(spec))
        print("\n".join(table(rows[-1:])[2:]), flush=True)
    text = "\n".join(table(rows)) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
