"""Depthwise and grouped Conv / ConvGrad: our kernels against ONNX Runtime's, per shape, by CPU time.

Usage: python benchmarks/bench_dwconv.py [--set tiny,real] [--rounds 7] [--ops Conv,ConvGrad]
           [--filter TEXT] [--model MODEL ...]

Each case is one Conv node (and its ConvGrad: dX, dW, and dB when the conv has a bias) on seeded
random inputs: ORT's Conv and com.microsoft ConvGrad kernels in a one-node InferenceSession of the
onnxruntime-training build (benchmarks/bench_kernels.py's session), ours writing into preallocated
outputs with the scratch we declare. One thread each (OpenBLAS, torch and ORT's intra-op pool),
interleaved round by round after a warm-up; a round repeats each call until it has used ~20 ms of
CPU; the table gives medians of the per-call CPU time of the calling thread (time.thread_time: ORT
runs a one-thread session on the caller), and ours / ORT. Sets: "tiny" = the corpus's own shapes at
batch 2 (reports/kernels-conv.md), "real" = MobileNetV2 x1.0 at 96x96 batch 8 (3x3 depthwise,
stride 1 and 2), EfficientNet-B0-like 5x5 depthwise, ConvNeXt 7x7 depthwise, RegNet grouped 3x3
(group width 8 and 16), all at batch 8. --model takes instead each distinct grouped or depthwise
Conv/ConvGrad node of a model's training step (e.g. hf-regnet, or hf-regnet@bench where the
corpus has that scale), with how many nodes share it. Prints Markdown.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # before numpy/torch load
    os.environ[_v] = "1"

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import _ort_session

from onnxplan.ir.graph import Node
from onnxplan.ir.tensor import TensorSpec
from onnxplan.kernels.registry import KernelContext, find_kernel, scratch_bytes

__all__ = ["CASES", "cases", "main"]

# (set, label, x shape (n, C, *spatial), M, kernel, stride, group, bias); pads keep "same" size / s
CASES = [
    ("tiny", "mobilenet-v2 dw", (2, 48, 10, 10), 48, 3, 1, 48, False),
    ("tiny", "mobilenet-v2 dw", (2, 48, 17, 17), 48, 3, 2, 48, False),
    ("tiny", "mobilenet-v2 dw", (2, 144, 4, 4), 144, 3, 1, 144, False),
    ("tiny", "efficientnet dw", (2, 48, 19, 19), 48, 5, 2, 48, False),
    ("tiny", "convnext dw", (2, 16, 8, 8), 16, 7, 1, 16, True),
    ("tiny", "convnext dw", (2, 32, 4, 4), 32, 7, 1, 32, True),
    ("tiny", "regnet g4", (2, 32, 8, 8), 32, 3, 2, 4, False),
    ("tiny", "regnet g2", (2, 16, 16, 16), 16, 3, 2, 2, False),
    ("real", "mobilenet-v2 dw", (8, 32, 48, 48), 32, 3, 1, 32, False),
    ("real", "mobilenet-v2 dw", (8, 96, 48, 48), 96, 3, 2, 96, False),
    ("real", "mobilenet-v2 dw", (8, 144, 24, 24), 144, 3, 1, 144, False),
    ("real", "mobilenet-v2 dw", (8, 144, 24, 24), 144, 3, 2, 144, False),
    ("real", "mobilenet-v2 dw", (8, 192, 12, 12), 192, 3, 1, 192, False),
    ("real", "mobilenet-v2 dw", (8, 384, 6, 6), 384, 3, 1, 384, False),
    ("real", "mobilenet-v2 dw", (8, 576, 6, 6), 576, 3, 2, 576, False),
    ("real", "mobilenet-v2 dw", (8, 960, 3, 3), 960, 3, 1, 960, False),
    ("real", "efficientnet dw", (8, 144, 24, 24), 144, 5, 2, 144, False),
    ("real", "efficientnet dw", (8, 240, 12, 12), 240, 5, 1, 240, False),
    ("real", "efficientnet dw", (8, 672, 6, 6), 672, 5, 1, 672, False),
    ("real", "convnext dw", (8, 96, 24, 24), 96, 7, 1, 96, True),
    ("real", "convnext dw", (8, 192, 12, 12), 192, 7, 1, 192, True),
    ("real", "convnext dw", (8, 384, 6, 6), 384, 7, 1, 384, True),
    ("real", "convnext dw", (8, 384, 3, 3), 384, 7, 1, 384, True),
    ("real", "regnet g6 (gw 8)", (8, 48, 48, 48), 48, 3, 2, 6, False),
    ("real", "regnet g6 (gw 8)", (8, 48, 24, 24), 48, 3, 1, 6, False),
    ("real", "regnet g13 (gw 8)", (8, 104, 12, 12), 104, 3, 1, 13, False),
    ("real", "regnet g4 (gw 16)", (8, 64, 24, 24), 64, 3, 1, 4, False),
    ("real", "regnet g14 (gw 16)", (8, 224, 6, 6), 224, 3, 1, 14, False),
]


def cases(sets: set[str], ops: set[str], text: str = ""):
    """(label, node, input specs, output specs) of each selected case and op."""
    for kind, label, x_shape, m, k, s, group, bias in CASES:
        if kind not in sets or text not in label:
            continue
        n, c, *dims = x_shape
        pad = (k - 1) // 2
        out = [(d + 2 * pad - k) // s + 1 for d in dims]
        attrs = {"group": group, "kernel_shape": [k] * len(dims), "strides": [s] * len(dims),
                 "pads": [pad] * (2 * len(dims))}
        x = TensorSpec("float32", x_shape)
        w = TensorSpec("float32", (m, c // group, *[k] * len(dims)))
        y = TensorSpec("float32", (n, m, *out))
        b = TensorSpec("float32", (m,))
        name = f"{label} {'x'.join(map(str, x_shape))} k{k} s{s}"
        if "Conv" in ops:
            node = Node("conv", "Conv", "", ["x", "w"] + (["b"] if bias else []), ["y"], attrs)
            yield f"Conv {name}", node, [x, w] + ([b] if bias else []), [y]
        if "ConvGrad" in ops:
            node = Node("grad", "ConvGrad", "com.microsoft", ["dy", "x", "w"],
                        ["dx", "dw"] + (["db"] if bias else []), attrs)
            yield f"ConvGrad {name}", node, [y, x, w], [x, w] + ([b] if bias else [])


def model_cases(name: str, ops: set[str]):
    """(label, node, input specs, output specs, count) of each distinct grouped Conv/ConvGrad of the step."""
    from onnxplan.executor.prepare import prepare
    from onnxplan.loading.request import LoadRequest
    from onnxplan.planning import PlanOptions

    graph = prepare(LoadRequest(name, None), PlanOptions()).graph
    found: dict[tuple, list] = {}
    for node in graph.nodes:
        if node.op_type not in ops or int(node.attrs.get("group", 1)) == 1:
            continue
        ins = [graph.values[i].spec for i in node.inputs if i]
        outs = [graph.values[o].spec if o else None for o in node.outputs]
        key = (node.op_type, tuple(ins), tuple(outs), repr(sorted(node.attrs.items())))
        if key in found:
            found[key][4] += 1
            continue
        x = ins[1] if node.op_type == "ConvGrad" else ins[0]
        w = ins[2] if node.op_type == "ConvGrad" else ins[1]
        s = node.attrs.get("strides", [1])[0]
        label = (f"{node.op_type} {name} {'x'.join(map(str, x.shape))} g{node.attrs['group']} "
                 f"k{'x'.join(map(str, w.shape[2:]))} s{s}")
        if node.op_type == "ConvGrad":
            label += " ->" + ",".join(n for n, o in zip(("dX", "dW", "dB"), outs) if o is not None)
        found[key] = [label, node, ins, outs, 1]
    return [tuple(v) for v in found.values()]


def _per_call(run, budget: float = 0.02) -> float:
    """CPU seconds per call, repeating the call until it has used `budget` seconds."""
    calls, t0 = 0, time.thread_time()
    while True:
        run()
        calls += 1
        used = time.thread_time() - t0
        if used >= budget:
            return used / calls


def time_case(node, ins, outs, rounds: int) -> tuple[float, float, int]:
    """(ORT median CPU s per call, ours, our scratch bytes)."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s.shape).astype(s.dtype) for s in ins]
    session, names = _ort_session(node, ins, outs, 1)
    feeds = {n: a for n, a in zip(names, arrays) if n}
    nbytes = scratch_bytes(node, ins, outs)
    scratch = np.zeros(nbytes, np.uint8) if nbytes else None
    out_arrays = [np.empty(s.shape, s.dtype) if s is not None else None for s in outs]
    ctx = KernelContext(np, node, ins, outs, scratch)
    fn = find_kernel(node).fn
    runs = [lambda: session.run(None, feeds), lambda: fn(ctx, arrays, out_arrays)]
    for run in runs:
        run()
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for k, run in enumerate(runs):
            times[k].append(_per_call(run))
    return statistics.median(times[0]), statistics.median(times[1]), nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="tiny,real")
    ap.add_argument("--ops", default="Conv,ConvGrad")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--filter", default="")
    ap.add_argument("--model", nargs="*", default=[], help="a model's own grouped convs instead of the sets")
    args = ap.parse_args()
    import onnxruntime as ort
    import torch

    torch.set_num_threads(1)
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, numpy {np.__version__}, torch {torch.__version__}, "
          f"onnxruntime {ort.__version__}; one thread each, median of {args.rounds} interleaved rounds, "
          f"CPU time per call; load {os.getloadavg()[0]:.1f} at start\n")
    ops = set(args.ops.split(","))
    if args.model:
        todo = [c for m in args.model for c in model_cases(m, ops)]
    else:
        todo = [(*c, 1) for c in cases(set(args.set.split(",")), ops, args.filter)]
    print("| case | n | ORT us | ours us | ours/ORT | scratch KiB |")
    print("|---|--:|--:|--:|--:|--:|")
    ratios: dict[str, list[float]] = {}
    totals: dict[str, list[float]] = {}
    for label, node, ins, outs, count in todo:
        t_ort, t_ours, nbytes = time_case(node, ins, outs, args.rounds)
        ratios.setdefault(node.op_type, []).append(t_ours / t_ort)
        total = totals.setdefault(node.op_type, [0.0, 0.0])
        total[0] += count * t_ort
        total[1] += count * t_ours
        print(f"| {label} | {count} | {t_ort * 1e6:.0f} | {t_ours * 1e6:.0f} | {t_ours / t_ort:.2f} "
              f"| {nbytes / 1024:.0f} |", flush=True)
    for op, rs in ratios.items():
        print(f"\n{op}: median ours/ORT {statistics.median(rs):.2f} over {len(rs)} shapes "
              f"(min {min(rs):.2f}, max {max(rs):.2f}); sum over nodes {totals[op][1] * 1e3:.2f} ms vs ORT "
              f"{totals[op][0] * 1e3:.2f} ms")
    print(f"\nload {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
