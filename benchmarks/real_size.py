"""Models at the sizes users train (issue 26): planned and measured peak, step time and planning time
of our plan (plain, and at budgets of 50% and 25% of the transient peak above the persistent state),
against ONNX Runtime's training API and PyTorch eager (the Hugging Face module itself, with and
without torch.utils.checkpoint per block), every run in a fresh process at the same threads.

Usage: python benchmarks/real_size.py [--models hf-resnet@full,hf-bert@full,hf-gpt2-lm@full]
           [--steps 2] [--budgets 0.5,0.25] [--threads N] [--out reports/real-size.md]

Peaks: the increase of the process's peak RSS over its baseline (onnxplan.memprobe), the
baseline taken before any of the model is loaded (ours: before the arena and the state; ORT:
before the checkpoint and sessions; PyTorch: before the module is built), so parameters,
gradients, optimizer state and activations all count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import date
from pathlib import Path

DEFAULT_MODELS = ("hf-resnet@full", "hf-bert@full", "hf-gpt2-lm@full")
MIB = 1 << 20


# -- PyTorch eager: the Hugging Face module, as its users train it -------------------------------

def torch_eager(name: str, steps: int, checkpointing: bool, threads: int | None, seed: int = 0) -> dict:
    """Probe target: `steps` AdamW steps of the corpus model's torch module (the module the
    export was made from), with the loss onnxplan trains it with; each block recomputed in the
    backward pass when `checkpointing` (gradient_checkpointing_enable: transformers' own
    torch.utils.checkpoint per layer)."""
    import torch

    from onnxplan.memprobe import mark_baseline
    from onnxplan.models import hf
    from onnxplan.threads import use_threads

    settings = use_threads(threads, torch_alone=True)
    spec, _ = hf.require_spec(name)
    x = hf.example_inputs(spec, spec.default_batch)
    gen = torch.Generator().manual_seed(seed + 1)
    mark_baseline()
    model = hf.build_torch_model(spec)
    inner = getattr(model, "inner", model)
    if checkpointing and getattr(inner, "supports_gradient_checkpointing", False):
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif checkpointing:  # transformers has none for it (ResNet): each residual block by hand
        blocks = _checkpoint_blocks(inner)
        if not blocks:
            return {"error": f"{type(inner).__name__}: no blocks to checkpoint"}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seconds, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model(x)
        if spec.loss == "causal-lm":
            logits = logits.reshape(x.shape[0], x.shape[1], -1)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                     x[:, 1:].reshape(-1))
        else:
            labels = torch.randint(0, logits.shape[-1], logits.shape[:1], generator=gen)
            loss = torch.nn.functional.cross_entropy(logits.reshape(logits.shape[0], -1), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seconds.append(time.perf_counter() - t0)
        losses.append(float(loss))
    return {"step_seconds": seconds, "losses": losses, "threads": settings.as_dict()}


def _checkpoint_blocks(module) -> int:
    """Recompute every outermost submodule whose class is a layer or block (ResNetBottleNeckLayer)
    in the backward pass: torch.utils.checkpoint around its forward. Returns how many."""
    import torch.utils.checkpoint as ckpt

    count = 0
    for child in module.children():
        if type(child).__name__.endswith(("Layer", "Block")) and any(True for _ in child.parameters()):
            forward = child.forward
            child.forward = lambda *a, _f=forward, **k: ckpt.checkpoint(_f, *a, use_reentrant=False, **k)
            count += 1
        else:
            count += _checkpoint_blocks(child)
    return count


def _torch_row(name: str, steps: int, checkpointing: bool, threads: int | None) -> dict:
    from onnxplan.memprobe import ProbeError, probe_peak
    from onnxplan.threads import peer_environment

    kwargs = {"name": name, "steps": steps + 1, "checkpointing": checkpointing, "threads": threads}
    try:
        probe = probe_peak(f"{Path(__file__).resolve()}:torch_eager", kwargs, timeout_s=1800, env=peer_environment())
    except ProbeError as exc:
        return {"peak": None, "step": None, "error": str(exc)[:200]}
    if probe.result.get("error"):
        return {"peak": None, "step": None, "error": probe.result["error"]}
    return {"peak": probe.peak_increase_bytes, "step": statistics.median(probe.result["step_seconds"][1:]),
            "error": None}


# -- ours and ONNX Runtime -------------------------------------------------------------------------

def _ours(folder: Path, plan, steps: int, threads: int | None) -> dict:
    from onnxplan.bench.measure import measure_plan

    m = measure_plan(folder, plan, repeat=steps, warmup=1, threads=threads)
    return {"peak": m["measured_peak_bytes"], "step": m["median_step_seconds"], "error": m["measure_error"]}


def _ort(folder: Path, steps: int, threads: int | None) -> dict:
    from onnxplan.bench.peers import measure_peer

    m = measure_peer("ort", folder, repeat=steps, warmup=1, threads=threads, timeout_s=1800)
    return {"peak": m["peak_bytes"], "step": m["median_step_seconds"], "error": m["error"]}


def _planned(step, threads: int | None, budget: int | None = None) -> tuple[object, float]:
    import onnxplan

    t0 = time.perf_counter()
    plan = onnxplan.plan(step, budget=budget, threads=threads) if budget else onnxplan.plan(step, threads=threads)
    return plan, time.perf_counter() - t0


def measure_model(name: str, steps: int, budgets: list[float], threads: int | None) -> dict:
    import onnxplan
    from onnxplan.errors import BudgetError

    t0 = time.perf_counter()
    step = onnxplan.load(name)
    load_s = time.perf_counter() - t0
    folder = Path(step.folder)
    plain, plain_s = _planned(step, threads)
    transient = plain.peak_bytes - plain.persistent_bytes
    row = {"model": name, "batch": step.graph.values[step.graph.inputs[0]].spec.shape[0], "load_seconds": load_s,
           "persistent": plain.persistent_bytes, "plans": []}
    row["plans"].append({"budget": None, "strategy": "none", "planned": plain.peak_bytes, "plan_seconds": plain_s,
                         **_ours(folder, plain, steps, threads)})
    for frac in budgets:
        budget = plain.persistent_bytes + int(frac * transient)
        try:
            plan, secs = _planned(step, threads, budget)
        except BudgetError as exc:
            row["plans"].append({"budget": budget, "fraction": frac, "strategy": "-", "planned": None,
                                 "plan_seconds": None, "peak": None, "step": None, "error": str(exc)[:200]})
            continue
        strategy = plan.strategy.chosen if plan.strategy is not None else "-"
        row["plans"].append({"budget": budget, "fraction": frac, "strategy": strategy, "planned": plan.peak_bytes,
                             "plan_seconds": secs, **_ours(folder, plan, steps, threads)})
    row["ort"] = _ort(folder, steps, threads)
    row["torch"] = _torch_row(name, steps, False, threads)
    row["torch_checkpoint"] = _torch_row(name, steps, True, threads)
    return row


# -- the table -------------------------------------------------------------------------------------

def _mib(b) -> str:
    return "-" if b is None else f"{b / MIB:,.0f}"


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _threads_used(threads: int | None) -> str:
    """The thread count the runs got: `threads`, else the default (onnxplan.threads)."""
    if threads:
        return str(threads)
    from onnxplan.threads import resolve_threads
    return f"{resolve_threads(None)} (the default)"


def markdown(rows: list[dict], args, started: str, load: str) -> str:
    lines = [f"# Models at real size: memory and speed ({date.today()})", "",
             f"`python benchmarks/real_size.py --models {','.join(args.models)} --steps {args.steps} "
             f"--budgets {args.budgets}" + (f" --threads {args.threads}" if args.threads else "") + "` on "
             f"{platform.machine()}, {os.cpu_count()} cores, at {_threads_used(args.threads)} threads; load "
             f"average {started} at the start, {load} at the end. Every cell: a "
             "fresh process, one warm-up step and the median of the timed steps; peaks are the process's peak "
             "RSS increase over a baseline taken before the model is loaded (parameters, gradients, optimizer "
             "state and activations count). Budgets: persistent state + 50% / 25% of the plain plan's "
             "transient peak. PyTorch: the Hugging Face module the export was made from, AdamW, the same loss; "
             "`+ckpt`: transformers' gradient checkpointing (torch.utils.checkpoint per layer).", "",
             "| model | batch | plan | strategy | planned MiB | measured MiB | step s | plan s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for p in r["plans"]:
            label = "plain" if p["budget"] is None else f"{int(p['fraction'] * 100)}% ({_mib(p['budget'])} MiB)"
            lines.append(f"| {r['model']} | {r['batch']} | {label} | {p['strategy']} | {_mib(p['planned'])} | "
                         f"{_mib(p['peak'])} | {_s(p['step'])} | {_s(p['plan_seconds'])} |")
    lines += ["", "| model | ours plain MiB | ORT MiB | PyTorch MiB | PyTorch+ckpt MiB | ours step s | ORT step s | "
              "PyTorch step s | PyTorch+ckpt step s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ours, ort, pt, ck = r["plans"][0], r["ort"], r["torch"], r["torch_checkpoint"]
        lines.append(f"| {r['model']} | {_mib(ours['peak'])} | {_mib(ort['peak'])} | {_mib(pt['peak'])} | "
                     f"{_mib(ck['peak'])} | {_s(ours['step'])} | {_s(ort['step'])} | {_s(pt['step'])} | "
                     f"{_s(ck['step'])} |")
    errors = [f"- {r['model']} {k}: {v['error']}" for r in rows for k, v in
              (("ort", r["ort"]), ("torch", r["torch"]), ("torch+ckpt", r["torch_checkpoint"]),
               *((f"plan {p.get('fraction', 'plain')}", p) for p in r["plans"])) if v.get("error")]
    if errors:
        lines += ["", "Errors:", *errors]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--budgets", default="0.5,0.25")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="reports/real-size.md")
    args = ap.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    budgets = [float(b) for b in args.budgets.split(",") if b]
    started = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    for name in args.models:
        print(f"{name} ...", flush=True)
        rows.append(measure_model(name, args.steps, budgets, args.threads))
        print(json.dumps(rows[-1], default=str), flush=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    out = Path(args.out)
    out.write_text(markdown(rows, args, started, load))
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))
    print(out.read_text())


if __name__ == "__main__":
    main()
