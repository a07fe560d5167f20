"""The zoo on a GPU: our arena executor on CuPy against ONNX Runtime (correctness) and PyTorch
eager on the same GPU (peak device memory and step latency).

Usage (on a machine with an NVIDIA GPU and CuPy):
    python benchmarks/bench_cuda.py [--models all] [--steps 5] [--warmup 2] [--time-limit 5]
        [--out reports/cuda.md]

Per model at its zoo size: our plan (order auto, planner auto), run for --warmup + --steps
steps on the GPU; planned peak (persistent + arena) against the measured device peak (the most
bytes live CuPy arrays held at once, from a memory hook on CuPy's pool, counted from just
before the arena is allocated); median step. The 3-step losses and every parameter are
compared with ONNX Runtime's training API (CPU). The PyTorch peer (the same forward graph as a
torch module, TF32 off) runs the same steps on the same GPU: its peak is
torch.cuda.max_memory_allocated above what was allocated before the module was built.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

MiB = 1 << 20


def ours(name: str, args, cp) -> dict:
    from onnxplan.device import DevicePeak, device_name
    from onnxplan.executor.prepare import prepare
    from onnxplan.executor.runner import execute, initial_parameters, step_batches
    from onnxplan.loading.request import LoadRequest
    from onnxplan.planning import PlanOptions
    from onnxplan.verification.compare import compare_results
    from onnxplan.verification.reference import run_reference

    t0 = time.perf_counter()
    prep = prepare(LoadRequest(name), PlanOptions(time_limit=args.time_limit))
    plan_s = time.perf_counter() - t0
    params = initial_parameters(prep.folder)
    batches = step_batches(prep.folder, max(args.steps, args.warmup, 3), 0)
    with DevicePeak(cp) as peak:
        ex, losses, seconds = execute(prep, batches, params, steps=args.steps, warmup=args.warmup,
                                      learning_rate=None, check_arena=False, xp=cp)
    check_ex, check_losses, _ = execute(prep, batches, params, steps=3, warmup=0, learning_rate=None,
                                        check_arena=False, xp=cp)
    ref = run_reference(prep.folder, steps=3, seed=0)
    cmp = compare_results(check_losses, check_ex.parameters(), ref.losses, ref.params)
    return {"model": name, "device": device_name(cp), "order": prep.plan.order_policy,
            "planner": prep.plan.planner, "plan_seconds": plan_s, "planned_peak": prep.plan.peak_bytes,
            "measured_peak": peak.peak, "pool_total": peak.pool_total_bytes,
            "median_step_seconds": statistics.median(seconds), "step_seconds": seconds,
            "ort_match": cmp.ok, "max_rel_diff": cmp.max_rel_diff,
            "worst": [str(o) for o in cmp.worst[:2]], "folder": str(prep.folder),
            "ort_losses": ref.losses, "losses": check_losses}


def torch_peer(folder: str, args) -> dict:
    import onnx
    import torch

    from onnxplan.data import make_step_batch, read_input_specs, read_metadata
    from onnxplan.torch_peer import TorchTrainer

    meta = read_metadata(folder)
    inputs, labels = read_input_specs(folder)
    batches = [make_step_batch(inputs, labels, 0, k) for k in range(max(args.steps, args.warmup))]
    model = onnx.load(str(Path(folder) / "forward.onnx"))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    trainer = TorchTrainer(model, meta, device="cuda")
    for k in range(args.warmup):
        trainer.step(batches[k])
    seconds, losses = [], []
    for k in range(args.steps):
        loss, s = trainer.step(batches[k])
        seconds.append(s)
        losses.append(loss)
    peak = torch.cuda.max_memory_allocated() - base
    del trainer
    torch.cuda.empty_cache()
    return {"torch_peak": peak, "torch_median_step_seconds": statistics.median(seconds)}


def report(rows: list[dict], args) -> str:
    dev = next((r["device"] for r in rows if "device" in r), "?")
    lines = [
        f"# The zoo on a GPU: {dev}, {date.today()}",
        "",
        (f"`python benchmarks/bench_cuda.py` ({platform.machine()}, Python {platform.python_version()}): "
         f"{args.warmup} warm-up + {args.steps} measured steps per model; plan: order auto, planner auto "
         f"(ILP {args.time_limit:g} s). Measured peak: the most bytes live CuPy arrays held at once (memory "
         "hook on CuPy's pool) from just before the arena. PyTorch: the same forward graph as an eager "
         "module, same optimizer, TF32 off; its peak is `max_memory_allocated` above the bytes allocated "
         "before the module was built. Correctness: 3 steps, every loss and parameter against ONNX "
         "Runtime's training API on the CPU (rtol 1e-4, atol 1e-5)."),
        "",
        ("| model | plan | planned peak MiB | measured peak MiB | measured - planned | PyTorch peak MiB "
         "| ours / PyTorch peak | step ms | PyTorch step ms | step / PyTorch | matches ORT (max rel diff) |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error']} |||||||||")
            continue
        tp, ts = r.get("torch_peak"), r.get("torch_median_step_seconds")
        lines.append(
            f"| {r['model']} | {r['order']} + {r['planner']} | {r['planned_peak'] / MiB:.2f} "
            f"| {r['measured_peak'] / MiB:.2f} | {(r['measured_peak'] - r['planned_peak']) / MiB:+.3f} MiB "
            f"| {tp / MiB:.2f} | {r['planned_peak'] / tp:.2f} | {r['median_step_seconds'] * 1e3:.1f} "
            f"| {ts * 1e3:.1f} | {r['median_step_seconds'] / ts:.1f}x "
            f"| {'yes' if r['ort_match'] else 'NO'} ({r['max_rel_diff']:.1e}) |"
            if tp else
            f"| {r['model']} | {r['order']} + {r['planner']} | {r['planned_peak'] / MiB:.2f} "
            f"| {r['measured_peak'] / MiB:.2f} | {(r['measured_peak'] - r['planned_peak']) / MiB:+.3f} MiB "
            f"| - | - | {r['median_step_seconds'] * 1e3:.1f} | - | - "
            f"| {'yes' if r['ort_match'] else 'NO'} ({r['max_rel_diff']:.1e}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="all")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--time-limit", type=float, default=5.0)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--out", type=Path, default=Path("reports/cuda.md"))
    args = p.parse_args(argv)
    from onnxplan.device import array_module
    from onnxplan.models import list_models

    cp = array_module("cuda")
    names = [m.name for m in list_models()] if args.models == "all" else args.models.split(",")
    rows = []
    for name in names:
        try:
            row = ours(name, args, cp)
            cp.get_default_memory_pool().free_all_blocks()
            if not args.no_torch:
                row.update(torch_peer(row["folder"], args))
        except Exception as exc:  # noqa: BLE001 - one model's failure is reported, the rest run
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("losses", "ort_losses", "step_seconds")}),
              flush=True)
    text = report(rows, args)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
