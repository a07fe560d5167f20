"""Three implementations of the same training steps, compared pairwise: ONNX Runtime's training
API, PyTorch eager (the same forward graph as a torch module, onnxplan.torch_peer) and our arena
executor, all on the CPU, 3 seeded steps from the same checkpoint.

Shows whether a difference between us and ONNX Runtime is ours or the problem's: where two
correct implementations with different kernels (summation orders) disagree by as much as we do,
the step is ill-conditioned at that tolerance.

Usage: python benchmarks/three_way.py [--models resnet18:adamw,resnet18:sgd] [--out reports/three-way.md]
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import date
from pathlib import Path

PAIRS = ("ours vs ORT", "ORT, input +1 ulp vs ORT", "PyTorch vs ORT", "ours vs PyTorch")


def ort_one_ulp(folder) -> tuple[list[float], dict]:
    """ONNX Runtime on the same steps with every float input of the step data moved by one
    float32 ulp (x * (1 + 2^-23)): how far the result moves for a change at rounding level."""
    import tempfile

    import numpy as np

    from onnxplan.data import run_steps
    from onnxplan.verification.reference import _OrtTrainer, _step_batches, artifact_paths

    specs, batches = _step_batches(folder, 3, 0)
    nudged = [{k: (v * np.float32(1 + 2 ** -23)).astype(v.dtype) if v.dtype.kind == "f" else v
               for k, v in b.items()} for b in batches]
    with tempfile.TemporaryDirectory(prefix="onnxplan-ulp-") as scratch:
        trainer = _OrtTrainer(artifact_paths(folder, scratch), None)
        trainer.check_feeds(specs)
        losses = run_steps(trainer, nudged)["losses"]
        return losses, trainer.parameters()


def compare_model(name: str, optimizer: str) -> dict:
    import onnx

    from onnxplan.data import make_step_batch, read_input_specs, read_metadata
    from onnxplan.executor.runner import run_plan
    from onnxplan.loading.request import LoadRequest
    from onnxplan.loading.resolve import resolve_artifacts
    from onnxplan.planning import PlanOptions
    from onnxplan.torch_peer import TorchTrainer
    from onnxplan.verification.compare import compare_results
    from onnxplan.verification.reference import run_reference

    req = LoadRequest(name, None, optimizer)
    folder = resolve_artifacts(req)
    ref = run_reference(folder, steps=3, seed=0)
    ours = run_plan(req, PlanOptions(planner="best-fit"), steps=3)
    meta = read_metadata(folder)
    inputs, labels = read_input_specs(folder)
    trainer = TorchTrainer(onnx.load(str(Path(folder) / "forward.onnx")), meta)
    torch_losses = [trainer.step(make_step_batch(inputs, labels, 0, k))[0] for k in range(3)]
    keys = [n for n in meta["trainable"] if n in ref.params]  # trained weights (not BN statistics)
    ulp_losses, ulp_params = ort_one_ulp(folder)
    runs = {"ours": (ours.losses, {k: ours.params[k] for k in keys}),
            "ORT, input +1 ulp": (ulp_losses, {k: ulp_params[k] for k in keys}),
            "ORT": (ref.losses, {k: ref.params[k] for k in keys}),
            "PyTorch": (torch_losses, {k: trainer.module.tensor(k).detach().numpy().copy() for k in keys})}
    row = {"model": name, "optimizer": optimizer}
    for pair in PAIRS:
        a, b = pair.split(" vs ")
        c = compare_results(*runs[a], *runs[b])
        row[pair] = {"ok": c.ok, "max_rel_diff": c.max_rel_diff,
                     "loss_max_abs_diff": max(abs(x - y) for x, y in zip(runs[a][0], runs[b][0]))}
    return row


def report(rows: list[dict]) -> str:
    lines = [f"# Three implementations of one training step, {date.today()}", "",
             (f"`python benchmarks/three_way.py` ({platform.machine()}, Python {platform.python_version()}): "
              "3 seeded steps from the artifacts' checkpoint by ONNX Runtime's training API, PyTorch eager "
              "(onnxplan.torch_peer) and our executor, all on the CPU; every trained weight and loss "
              "compared pairwise as `run --verify` does (rtol 1e-4, atol 1e-5)."), "",
             "| model | optimizer | " + " | ".join(f"{p}: max rel diff (loss diff)" for p in PAIRS) + " |",
             "|---|---|" + "---|" * len(PAIRS)]
    for r in rows:
        cells = [f"{'ok' if r[p]['ok'] else 'DIFFERS'} {r[p]['max_rel_diff']:.1e} ({r[p]['loss_max_abs_diff']:.1e})"
                 for p in PAIRS]
        lines.append(f"| {r['model']} | {r['optimizer']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18:adamw,resnet18:sgd,transformer:adamw,vgg16:adamw")
    p.add_argument("--out", type=Path, default=Path("reports/three-way.md"))
    args = p.parse_args(argv)
    rows = []
    for spec in args.models.split(","):
        name, optimizer = spec.split(":")
        rows.append(compare_model(name, optimizer))
        print(json.dumps(rows[-1]), flush=True)
    text = report(rows)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
