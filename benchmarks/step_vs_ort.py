"""Step time of our arena executor against ONNX Runtime's training API and PyTorch eager, all in
this one process, one thread each, interleaved round by round; and "before": the same plan on a
second executor built with the kernels' bind rules off (ONNXPLAN_BIND_KERNELS=0's path: every
node calls its plain kernel) and torch's operators only from 16K elements (the previous
_torch.MIN_ELEMS), i.e. the executor as it was before the per-node overhead work (issue 12).

Per model and round: `--steps` steps of each implementation in turn (ours, ours-before, ORT,
PyTorch), after one warm-up step each; the table gives the median step over all rounds. A per-op
profile (a clock around every kernel, one step) of ours before and after follows the table.

Usage: python benchmarks/step_vs_ort.py [MODEL[:BATCH] ...] [--rounds 3] [--steps 3]
           [--out reports/kernels-cpu.md]
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # before numpy/torch load
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import date  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

DEFAULT_MODELS = ["transformer", "gpt", "vgg16", "resnet18", "mlp", "hf-resnet", "hf-mobilenet-v2",
                  "hf-efficientnet", "hf-regnet", "hf-convnext", "hf-vit", "hf-swin", "hf-bert",
                  "hf-distilbert", "hf-albert", "hf-roberta", "hf-gpt2", "hf-llama", "hf-t5-encoder"]
DEPTHWISE = {"hf-mobilenet-v2", "hf-efficientnet", "hf-convnext", "hf-regnet"}  # depthwise/grouped conv
BEFORE_MIN_ELEMS = 1 << 14  # _torch.MIN_ELEMS before issue 12's per-node work
TARGET = {"mlp": 1.5}  # ours/ORT; 1.0 elsewhere (2.0 for DEPTHWISE, with the corpus median <= 1.0)


class _Ort:
    def __init__(self, folder: str, scratch: str) -> None:
        import onnxruntime
        from onnxruntime.training import api

        from onnxplan.reference import artifact_paths

        onnxruntime.set_default_logger_severity(3)
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        paths = artifact_paths(folder, scratch)
        self.state = api.CheckpointState.load_checkpoint(str(paths.checkpoint))
        self.module = api.Module(str(paths.training_model), self.state, session_options=opts)
        self.optimizer = api.Optimizer(str(paths.optimizer_model), self.module)
        self.names = list(self.module.input_names())

    def step(self, batch) -> float:
        self.module.train()
        loss = self.module(*[batch[n] for n in self.names])
        self.optimizer.step()
        self.module.lazy_reset_grad()
        return float(np.asarray(loss).reshape(-1)[0])


def _timed(step, batches, steps: int) -> tuple[list[float], list[float]]:
    """(wall seconds, this thread's CPU seconds) per step. Every implementation runs on the
    calling thread here (one thread each), so the CPU time is its step without the time other
    processes held the core: the fairer ratio on a loaded machine, where a 1 ms step mostly
    fits in one time slice and a 20 ms one is preempted many times."""
    wall, cpu = [], []
    for k in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        step(batches[k % len(batches)])
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return wall, cpu


def bench(name: str, batch: int | None, rounds: int, steps: int) -> dict:
    from onnxplan.data import make_step_batch, read_input_specs, read_metadata
    from onnxplan.executor.prepare import prepare
    from onnxplan.executor.runner import Executor, initial_parameters
    from onnxplan.kernels import _torch, registry
    from onnxplan.planning import PlanOptions
    from onnxplan.resolve import ModelRequest
    from onnxplan.torch_peer import TorchTrainer

    prep = prepare(ModelRequest(name, batch), PlanOptions())
    folder = str(prep.folder)
    specs, labels = read_input_specs(folder)
    batches = [make_step_batch(specs, labels, 0, k) for k in range(steps)]
    params = initial_parameters(folder)
    ex = Executor(prep.graph, prep.plan)
    ex.load_state(params)
    registry.BIND = False
    try:
        ex_before = Executor(prep.graph, prep.plan)
    finally:
        registry.BIND = True
    ex_before.load_state(params)
    impls = {"ours": ex.step}
    with tempfile.TemporaryDirectory(prefix="onnxplan-bench-") as scratch:
        impls["ort"] = _Ort(folder, scratch).step
        try:
            import onnx

            trainer = TorchTrainer(onnx.load(str(Path(folder) / "forward.onnx")), read_metadata(folder))
            impls["torch"] = lambda b: trainer.step(b)[0]
        except Exception as exc:  # the peer covers the zoo's ops, not every export's
            print(f"  {name}: no PyTorch peer ({type(exc).__name__}: {str(exc)[:80]})")

        def unbound(fn):
            def run(*args):
                now, _torch.MIN_ELEMS = _torch.MIN_ELEMS, BEFORE_MIN_ELEMS
                try:
                    return fn(*args)
                finally:
                    _torch.MIN_ELEMS = now
            return run

        before = unbound(ex_before.step)

        impls["before"] = before
        times: dict[str, list[float]] = {k: [] for k in impls}
        cpu: dict[str, list[float]] = {k: [] for k in impls}
        for fn in impls.values():  # warm-up
            try:
                fn(batches[0])
            except Exception as exc:
                print(f"  {name}: warm-up failed: {exc}")
                raise
        for _ in range(rounds):
            for k, fn in impls.items():
                wall, used = _timed(fn, batches, steps)
                times[k] += wall
                cpu[k] += used
        _, prof_after = ex.timed_step(batches[0])
        _, prof_before = unbound(ex_before.timed_step)(batches[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": name, "batch": batch or int(batches[0][specs[0].name].shape[0]),
            "ms": {k: 1e3 * v for k, v in med.items()},
            "cpu_ms": {k: 1e3 * statistics.median(v) for k, v in cpu.items()},
            "profile_after": prof_after, "profile_before": prof_before}


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(rows: list[dict]) -> list[str]:
    out = ["| model | batch | ours ms | ORT ms | ours/ORT | target | before ms | before/ORT | ours/before "
           "| CPU: ours/ORT | CPU: before/ORT | PyTorch ms | ours/PyTorch |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r["ms"]
        ratio = ms["ours"] / ms["ort"]
        target = TARGET.get(r["model"], 2.0 if r["model"] in DEPTHWISE else 1.0)
        mark = "met" if ratio <= target else "**missed**"
        tp = ms.get("torch")
        vs_torch = "-" if tp is None else f"{ms['ours'] / tp:.2f}"
        cpu = r["cpu_ms"]
        out.append(f"| {r['model']} | {r['batch']} | {_fmt(ms['ours'])} | {_fmt(ms['ort'])} | {ratio:.2f} | "
                   f"<= {target} {mark} | {_fmt(ms['before'])} | {ms['before'] / ms['ort']:.2f} | "
                   f"{ms['ours'] / ms['before']:.2f} | {cpu['ours'] / cpu['ort']:.2f} | "
                   f"{cpu['before'] / cpu['ort']:.2f} | {_fmt(tp)} | {vs_torch} |")
    corpus = [r for r in rows if r["model"].startswith("hf-")]
    if corpus:
        def med(key, a, b):
            return statistics.median(r[key][a] / r[key][b] for r in corpus)

        out.append("")
        out.append(f"Corpus (hf-*, {len(corpus)} models) median ours/ORT: wall {med('ms', 'ours', 'ort'):.2f} "
                   f"(before {med('ms', 'before', 'ort'):.2f}), CPU {med('cpu_ms', 'ours', 'ort'):.2f} "
                   f"(before {med('cpu_ms', 'before', 'ort'):.2f}); target <= 1.0.")
    return out


def profiles(rows: list[dict], top: int = 6) -> list[str]:
    out = ["| model | before: top ops (ms) | after: top ops (ms) |", "|---|---|---|"]
    for r in rows:
        cells = []
        for key in ("profile_before", "profile_after"):
            prof = r[key]
            total = sum(prof.values())
            ops = sorted(prof.items(), key=lambda kv: -kv[1])[:top]
            cells.append(f"total {1e3 * total:.1f}: " + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in ops))
        out.append(f"| {r['model']} | {cells[0]} | {cells[1]} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from onnxplan.executor.threads import blas_threads, set_blas_threads

    set_blas_threads(1)
    rows = []
    for item in args.models:
        name, _, b = item.partition(":")
        t0 = time.perf_counter()
        row = bench(name, int(b) if b else None, args.rounds, args.steps)
        rows.append(row)
        ms = row["ms"]
        print(f"{name}: ours {ms['ours']:.1f} ms, before {ms['before']:.1f}, ORT {ms['ort']:.1f}, "
              f"torch {ms.get('torch', float('nan')):.1f}  ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    load = os.getloadavg()
    head = [f"# CPU kernels: step time against ONNX Runtime and PyTorch ({date.today().isoformat()})", "",
            f"`python benchmarks/step_vs_ort.py {' '.join(args.models)} --rounds {args.rounds} "
            f"--steps {args.steps}`"
            f" on {platform.processor() or platform.machine()}, {os.cpu_count()} cores; one thread each "
            f"(OMP/MKL/OPENBLAS_NUM_THREADS=1, OpenBLAS threads {blas_threads()}, torch "
            f"{torch.get_num_threads()}, ORT intra/inter-op 1); load average after the run "
            f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (a shared machine). All in one process, "
            f"interleaved: per round each implementation runs {args.steps} steps; medians over "
            f"{args.rounds} rounds. `before` = a second executor of the same plan with the kernels' bind "
            "rules off and torch's operators from 16K elements only (the executor before the "
            "per-node overhead work).", ""]
    lines = head + table(rows) + ["", "## Per-op profile (one step, ours)", ""] + profiles(rows)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
