"""Thread scaling: onnxplan's training step against ONNX Runtime's and PyTorch eager's, at one thread
and at every core, each run as a user gets it (a fresh process, the default plan).

Per model: the default plan (`onnxplan plan MODEL`) is made once; then, round by round and
thread count by thread count, three fresh processes run `--steps` timed steps after one warm-up
step: ours (the plan in the executor, `onnxplan.executor.measure_run`), ONNX Runtime training and
PyTorch eager (the bench peers, `onnxplan.bench.peers.measure_peer`), every pool of each process
sized by onnxplan.threads for that count (ORT intra-op N / inter-op 1, torch N / 1, OpenMP N;
numpy's BLAS 1 in ours, whose GEMMs split across its own kernel pool). A cell is the median over rounds of each round's median step; `spread` is the largest
relative distance of a round from that median. "default" is ours with no --threads: every core
this process may use (what `onnxplan run` does).

A ratio is given twice: the ratio of the two cells, and "paired", the median over rounds of
the ratio within a round (the two runs seconds apart, not a whole pass over the thread counts
apart), which a slow spell of a shared machine moves less: it weighs on both runs of a round.

`--peers ''` runs ours alone: ours at each thread count in fresh processes, interleaved round by
round (the paired figure of ours at every core against ours at one thread, reports/threads.md).

Usage: python benchmarks/thread_scaling.py [MODEL[:BATCH] ...] [--corpus] [--threads 1,2]
           [--rounds 3] [--steps 5] [--warmup 3] [--peers ort,torch] [--out reports/threads.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import onnxplan
from onnxplan.bench.peers import measure_peer
from onnxplan.bench.sweep import DEFAULT_WARMUP, DEFAULT_WARMUP_SECONDS
from onnxplan.executor.measure import measure_run
from onnxplan.executor.prepare import Prepared, adopt_plan
from onnxplan.threads import available_cores

ZOO = ["mlp:64", "transformer:16", "gpt:16", "resnet18:16", "vgg16:16"]
README_JOB = ["mlp", "nnt-conv2d", "transformer"]  # the README's main job, at their own batches
CORPUS = ["hf-resnet@bench", "hf-mobilenet-v2@bench", "hf-efficientnet@bench", "hf-regnet@bench",
          "hf-convnext@bench", "hf-vit@bench", "hf-swin@bench", "hf-bert@bench", "hf-distilbert@bench",
          "hf-albert@bench", "hf-roberta@bench", "hf-gpt2@bench", "hf-llama@bench", "hf-t5-encoder@bench"]
RUNNERS = ("ours", "ort", "torch")


def _median_of_rounds(values: list[float]) -> tuple[float | None, float | None]:
    """(median over rounds, largest relative distance of a round from it)."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    mid = statistics.median(values)
    return mid, max(abs(v - mid) / mid for v in values)


def _ours(step, prep: Prepared, steps: int, threads: int, warmup: int = DEFAULT_WARMUP) -> tuple[float | None, dict | None, str | None]:
    try:
        res, _ = measure_run(step.request, None, steps=steps, warmup=warmup, prepared=prep, threads=threads,
                             warmup_seconds=DEFAULT_WARMUP_SECONDS)
    except Exception as exc:  # noqa: BLE001 - a failed run is a cell of the table
        return None, None, f"{type(exc).__name__}: {str(exc)[:200]}"
    return statistics.median(res["step_seconds"]), res.get("threads"), None


def bench_model(item: str, counts: list[int], rounds: int, steps: int, peers: tuple[str, ...] = ("ort", "torch"),
                warmup: int = DEFAULT_WARMUP) -> dict:
    name, _, b = item.partition(":")
    step = onnxplan.load(name, batch=int(b) if b else None)
    plan = onnxplan.plan(step)
    prep = Prepared(step.folder, adopt_plan(step.graph, plan), plan)
    samples: dict[tuple[str, int], list[float | None]] = {}
    pools: dict[str, dict | None] = {}
    errors: list[str] = []
    for _ in range(rounds):
        for n in counts:
            sec, got, err = _ours(step, prep, steps, n, warmup)
            samples.setdefault(("ours", n), []).append(sec)
            pools[f"ours@{n}"] = got
            errors += [f"ours@{n}: {err}"] if err else []
            for peer in peers:
                fig = measure_peer(peer, step.folder, steps, warmup=warmup, threads=n,
                                   warmup_seconds=DEFAULT_WARMUP_SECONDS)
                samples.setdefault((peer, n), []).append(fig["median_step_seconds"])
                pools[f"{peer}@{n}"] = fig.get("threads")
                errors += [f"{peer}@{n}: {fig['error']}"] if fig.get("error") else []
    cells = {f"{r}@{n}": _median_of_rounds(samples.get((r, n), [])) for r in RUNNERS for n in counts}
    lo, hi = counts[0], counts[-1]
    paired = {f"ours@{hi}/ours@{lo}": _paired(samples.get(("ours", hi), []), samples.get(("ours", lo), []))}
    paired.update({f"ours@{n}/ort@{n}": _paired(samples.get(("ours", n), []), samples.get(("ort", n), []))
                   for n in counts})
    return {"model": item, "batch": step.request.batch, "peak_bytes": plan.peak_bytes,
            "ms": {k: (v[0] * 1e3 if v[0] is not None else None) for k, v in cells.items()},
            "spread": {k: v[1] for k, v in cells.items()}, "paired": paired,
            "rounds_ms": {f"{r}@{n}": [None if v is None else v * 1e3 for v in vs] for (r, n), vs in samples.items()},
            "pools": pools, "errors": sorted(set(errors))}


def _paired(a: list[float | None], b: list[float | None]) -> float | None:
    """The median over rounds of round i's a / b (rounds where both ran): the docstring's "paired"."""
    ratios = [x / y for x, y in zip(a, b) if x is not None and y]
    return statistics.median(ratios) if ratios else None


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def _both(ratio: float | None, paired: float | None) -> str:
    return f"{_fmt(ratio, '.2f')} ({_fmt(paired, '.2f')} paired)" if paired is not None else _fmt(ratio, ".2f")


def _fmt(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[dict], counts: list[int]) -> list[str]:
    lo, hi = counts[0], counts[-1]
    head = ["model"] + [f"{r} {n}t ms" for n in counts for r in RUNNERS] + \
        [f"ours/ORT {n}t" for n in counts] + [f"ours/torch {n}t" for n in counts] + [f"ours {hi}t / ours {lo}t"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ms = r["ms"]
        cells = [r["model"]]
        cells += [f"{_fmt(ms[f'{x}@{n}'])} (±{_fmt(100 * (r['spread'][f'{x}@{n}'] or 0), '.0f')}%)"
                  for n in counts for x in RUNNERS]
        paired = r.get("paired", {})
        cells += [_both(_ratio(ms[f"ours@{n}"], ms[f"ort@{n}"]), paired.get(f"ours@{n}/ort@{n}")) for n in counts]
        cells += [_fmt(_ratio(ms[f"ours@{n}"], ms[f"torch@{n}"]), ".2f") for n in counts]
        cells += [_both(_ratio(ms[f"ours@{hi}"], ms[f"ours@{lo}"]), paired.get(f"ours@{hi}/ours@{lo}"))]
        out.append("| " + " | ".join(cells) + " |")
    return out


def summary(rows: list[dict], counts: list[int], label: str) -> list[str]:
    out = []
    for n in counts:
        ratios = [x for x in (_ratio(r["ms"][f"ours@{n}"], r["ms"][f"ort@{n}"]) for r in rows) if x is not None]
        paired = [x for x in (r.get("paired", {}).get(f"ours@{n}/ort@{n}") for r in rows) if x is not None]
        if ratios:
            out.append(f"- {label}, {n} thread(s): median ours/ORT **{statistics.median(ratios):.2f}** "
                       f"over {len(ratios)} models (best {min(ratios):.2f}, worst {max(ratios):.2f})"
                       + (f"; paired {statistics.median(paired):.2f}" if paired else ""))
    return out


def write(args, groups: dict[str, list[dict]], counts: list[int], started: list[float]) -> str:
    load = os.getloadavg()
    lines = [f"# Thread scaling: ours, ONNX Runtime and PyTorch at {' and '.join(map(str, counts))} threads "
             f"({date.today().isoformat()})", "",
             f"`python benchmarks/thread_scaling.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}` on "
             f"{platform.processor() or platform.machine()}, {available_cores()} cores available; load average "
             f"{started[0]:.1f} at the start, {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at the end. Every cell: "
             f"a fresh process per run (the default plan for ours), {args.warmup} warm-up steps (at least "
             f"{DEFAULT_WARMUP_SECONDS:g} s of them) + "
             f"{args.steps} timed steps, the median over the rounds of each round's median step "
             "(± the largest distance of a round from it). Pools per process (onnxplan.threads): "
             "OpenMP and torch intra-op N, torch inter-op 1, ORT intra-op N / inter-op 1, numpy's BLAS 1 "
             "in ours (its GEMMs split across its kernel pool), idle OpenMP workers asleep "
             "(OMP_WAIT_POLICY=PASSIVE); the ORT peer keeps ORT's own spinning (it is alone in its "
             "process).", ""]
    for label, rows in groups.items():
        if not rows:
            continue
        lines += [f"## {label}", "", *table(rows, counts), "", *summary(rows, counts, label), ""]
        errs = [f"- {r['model']}: {e}" for r in rows for e in r["errors"]]
        lines += (["Errors:", *errs, ""] if errs else [])
    if any(groups.values()):
        first = next(r for rows in groups.values() for r in rows)
        lines += ["What each pool got (first model, as each process read it back):", "", "```",
                  json.dumps(first["pools"], indent=1, sort_keys=True), "```", ""]
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(groups, indent=1))
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help=f"MODEL[:BATCH] (default: {' '.join(ZOO)})")
    ap.add_argument("--readme-job", action="store_true", help=f"also the README main job's models ({', '.join(README_JOB)})")
    ap.add_argument("--corpus", action="store_true", help="also the real-architecture corpus at bench scale")
    ap.add_argument("--threads", default=f"1,{available_cores()}", help="thread counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--corpus-rounds", type=int, default=None, help="rounds for the corpus (default: --rounds)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                    help="untimed steps first, every runner alike (how warm the timed steps are moved ours by "
                         "5-24%% of a cell under load, ONNX Runtime by 0-10%%: reports/threads.md, session 14)")
    ap.add_argument("--peers", default="ort,torch", help="peers to run beside ours, comma-separated ('' for none)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.models = args.models or ZOO
    counts = sorted({int(x) for x in args.threads.split(",")})
    groups: dict[str, list[dict]] = {"zoo": [], "README main job": [], "corpus at bench scale": []}
    plan = [("zoo", m) for m in args.models] + [("README main job", m) for m in README_JOB if args.readme_job] + \
        [("corpus at bench scale", m) for m in CORPUS if args.corpus]
    started = list(os.getloadavg())
    for label, item in plan:
        t0 = time.perf_counter()
        try:
            rounds = args.corpus_rounds if label.startswith("corpus") and args.corpus_rounds else args.rounds
            row = bench_model(item, counts, rounds, args.steps, tuple(p for p in args.peers.split(",") if p),
                              args.warmup)
        except Exception as exc:  # noqa: BLE001 - one model's failure (an export) should not cost the others
            print(f"{item}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        groups[label].append(row)
        print(f"{item}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in row["ms"].items())
              + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
        write(args, groups, counts, started)
    print(write(args, groups, counts, started))


if __name__ == "__main__":
    main()
