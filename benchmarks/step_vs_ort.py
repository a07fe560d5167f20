"""Step time of our arena executor against ONNX Runtime's training API and PyTorch eager, all in
this one process, one thread each, interleaved round by round; and "before": the same plan on a
second executor built with the kernels' bind rules off (ONNXPLAN_BIND_KERNELS=0's path: every
node calls its plain kernel) and torch's operators only from 16K elements (the previous
_torch.MIN_ELEMS), i.e. the executor as it was before the per-node overhead work (issue 12).

Per model and round: `--steps` steps of each implementation in turn (ours, ours-before, ORT,
PyTorch), after one warm-up step each; the table gives the median step over all rounds. A per-op
profile (a clock around every kernel, one step) of ours before and after follows the table.

--scale bench measures the real-architecture corpus at its bench scale (models/hf.py: hf-ARCH@bench,
realistic small training configs where kernel time makes the step) instead of the default list
(the zoo and the tiny CI corpus); --no-before leaves out the `before` executor (half the time).

Usage: python benchmarks/step_vs_ort.py [MODEL[:BATCH] ...] [--scale tiny|bench] [--rounds 3]
           [--steps 3] [--no-before] [--out reports/kernels-cpu.md]
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
BENCH_MODELS = [f"{m}@bench" for m in DEFAULT_MODELS if m.startswith("hf-")]  # --scale bench
DEPTHWISE = {"hf-mobilenet-v2", "hf-efficientnet", "hf-convnext", "hf-regnet"}  # depthwise/grouped conv
BEFORE_MIN_ELEMS = 1 << 14  # _torch.MIN_ELEMS before issue 12's per-node work
TARGET = {"mlp": 1.5}  # ours/ORT; 1.0 elsewhere (2.0 for DEPTHWISE, with the corpus median <= 1.0)


class _Ort:
    def __init__(self, folder: str, scratch: str) -> None:
        import onnxruntime
        from onnxruntime.training import api

        from onnxplan.verification.reference import artifact_paths

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


def bench(name: str, batch: int | None, rounds: int, steps: int, with_before: bool = True) -> dict:
    from onnxplan import settings
    from onnxplan.data import make_step_batch, read_input_specs, read_metadata
    from onnxplan.executor.prepare import prepare
    from onnxplan.executor.runner import Executor, initial_parameters
    from onnxplan.kernels import _torch
    from onnxplan.loading.request import LoadRequest
    from onnxplan.planning import PlanOptions
    from onnxplan.torch_peer import TorchTrainer

    prep = prepare(LoadRequest(name, batch), PlanOptions())
    folder = str(prep.folder)
    specs, labels = read_input_specs(folder)
    batches = [make_step_batch(specs, labels, 0, k) for k in range(steps)]
    params = initial_parameters(folder)
    ex = Executor(prep.graph, prep.plan)
    ex.load_state(params)
    ex_before = None
    if with_before:
        with settings.override(bind_kernels=False):
            ex_before = Executor(prep.graph, prep.plan)
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

        if ex_before is not None:
            impls["before"] = unbound(ex_before.step)
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
        prof_before = unbound(ex_before.timed_step)(batches[0])[1] if ex_before is not None else None
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": name, "batch": batch or int(batches[0][specs[0].name].shape[0]),
            "ms": {k: 1e3 * v for k, v in med.items()},
            "cpu_ms": {k: 1e3 * statistics.median(v) for k, v in cpu.items()},
            "profile_after": prof_after, "profile_before": prof_before}


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _ratio(a, b) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def _target(model: str) -> float:
    base = model.partition("@")[0]  # hf-ARCH@bench has hf-ARCH's target
    return TARGET.get(base, 2.0 if base in DEPTHWISE else 1.0)


def table(rows: list[dict]) -> list[str]:
    out = ["| model | batch | ours ms | ORT ms | ours/ORT | target | before ms | before/ORT | ours/before "
           "| CPU: ours/ORT | CPU: before/ORT | PyTorch ms | ours/PyTorch |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r["ms"]
        ratio = ms["ours"] / ms["ort"]
        target = _target(r["model"])
        mark = "met" if ratio <= target else "**missed**"
        tp = ms.get("torch")
        vs_torch = "-" if tp is None else f"{ms['ours'] / tp:.2f}"
        cpu = r["cpu_ms"]
        out.append(f"| {r['model']} | {r['batch']} | {_fmt(ms['ours'])} | {_fmt(ms['ort'])} | {ratio:.2f} | "
                   f"<= {target} {mark} | {_fmt(ms.get('before'))} | {_ratio(ms.get('before'), ms['ort'])} | "
                   f"{_ratio(ms['ours'], ms.get('before'))} | {cpu['ours'] / cpu['ort']:.2f} | "
                   f"{_ratio(cpu.get('before'), cpu['ort'])} | {_fmt(tp)} | {vs_torch} |")
    corpus = [r for r in rows if r["model"].startswith("hf-")]
    if corpus:
        def med(key, a, b):
            if any(a not in r[key] for r in corpus):
                return "-"
            return f"{statistics.median(r[key][a] / r[key][b] for r in corpus):.2f}"

        out.append("")
        out.append(f"Corpus (hf-*, {len(corpus)} models) median ours/ORT: wall {med('ms', 'ours', 'ort')} "
                   f"(before {med('ms', 'before', 'ort')}), CPU {med('cpu_ms', 'ours', 'ort')} "
                   f"(before {med('cpu_ms', 'before', 'ort')}); target <= 1.0.")
    return out


def profiles(rows: list[dict], top: int = 6) -> list[str]:
    keys = [k for k in ("profile_before", "profile_after") if any(r[k] is not None for r in rows)]
    out = ["| model | " + " | ".join(f"{k.split('_')[1]}: top ops (ms)" for k in keys) + " |",
           "|---" * (len(keys) + 1) + "|"]
    for r in rows:
        cells = []
        for key in keys:
            prof = r[key]
            if prof is None:
                cells.append("-")
                continue
            total = sum(prof.values())
            ops = sorted(prof.items(), key=lambda kv: -kv[1])[:top]
            cells.append(f"total {1e3 * total:.1f}: " + ", ".join(f"{k} {1e3 * v:.1f}" for k, v in ops))
        out.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--scale", choices=("tiny", "bench"), default="tiny",
                    help="default model list: the zoo and tiny corpus, or the corpus at bench scale")
    ap.add_argument("--no-before", action="store_true", help="leave out the `before` executor")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not args.models:
        args.models = BENCH_MODELS if args.scale == "bench" else DEFAULT_MODELS
    import torch

    torch.set_num_threads(1)
    from onnxplan.threads import use_threads

    use_threads(1)
    rows = []
    for item in args.models:
        name, _, b = item.partition(":")
        t0 = time.perf_counter()
        try:
            row = bench(name, int(b) if b else None, args.rounds, args.steps, not args.no_before)
        except Exception as exc:  # one model's failure (an export, ORT) should not cost the others
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        rows.append(row)
        ms = row["ms"]
        print(f"{name}: ours {ms['ours']:.1f} ms, before {ms.get('before', float('nan')):.1f}, "
              f"ORT {ms['ort']:.1f}, "
              f"torch {ms.get('torch', float('nan')):.1f}  ({time.perf_counter() - t0:.0f} s)",
              flush=True)
        _write(args, rows, torch)
    print(_write(args, rows, torch))


def _write(args, rows: list[dict], torch) -> str:
    """The report of `rows` so far, written to --out after every model (a long run keeps what it measured)."""
    from onnxplan.threads import current as current_threads

    load = os.getloadavg()
    head = [f"# CPU kernels: step time against ONNX Runtime and PyTorch ({date.today().isoformat()})", "",
            f"`python benchmarks/step_vs_ort.py {' '.join(args.models)} --rounds {args.rounds} "
            f"--steps {args.steps}{' --no-before' if args.no_before else ''}`"
            f" on {platform.processor() or platform.machine()}, {os.cpu_count()} cores; one thread each "
            f"(OMP/MKL/OPENBLAS_NUM_THREADS=1, OpenBLAS threads {current_threads().blas}, torch "
            f"{torch.get_num_threads()}, ORT intra/inter-op 1); load average after the run "
            f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (a shared machine). All in one process, "
            f"interleaved: per round each implementation runs {args.steps} steps; medians over "
            f"{args.rounds} rounds. `before` = a second executor of the same plan with the kernels' bind "
            "rules off and torch's operators from 16K elements only (the executor before the "
            "per-node overhead work).", ""]
    lines = head + table(rows) + ["", "## Per-op profile (one step, ours)", ""] + profiles(rows)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    return text


if __name__ == "__main__":
    main()
