"""Kernel timings against ONNX Runtime on the zoo's own Conv, ConvGrad and Gemm layers.

Usage: python benchmarks/bench_kernels.py [MODEL ...] [--repeat 5] [--threads N] [--ops Conv,ConvGrad,Gemm]
           [--clock cpu|wall]

For every distinct Conv, ConvGrad, Gemm, MatMul and FusedMatMul node (shapes, attributes,
present outputs) of each model's training step (default: vgg16 and resnet18 at their batch, 64),
times ONNX Runtime on a one-node session against onnxplan's kernel writing into preallocated
outputs with its declared scratch. The two run interleaved, `repeat` times after one warm-up,
and the table shows medians in ms, ours / ORT, the scratch we declare, and how many nodes of
the step share the shape; a last row per model weighs each shape by that count. Prints
Markdown. --threads N pins both to N threads (OpenBLAS through its environment variable).
--clock cpu (with --threads 1: both run on the calling thread) times each call by the thread's
CPU time (time.thread_time), which a shared machine's other processes disturb far less than the
wall clock. Ours is the kernel as the executor calls it (bound by its bind rule, where it has one).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=["vgg16", "resnet18"])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="threads for both (default: their own)")
    p.add_argument("--ops", default="Conv,ConvGrad,Gemm,MatMul,FusedMatMul")
    p.add_argument("--clock", choices=("cpu", "wall"), default="wall",
                   help="cpu: the calling thread's CPU time (use with --threads 1)")
    return p.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None and ARGS.threads:  # before numpy loads OpenBLAS
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import numpy as np
import onnxruntime as ort
from onnx import helper

from onnxplan.ir.load import read_step
from onnxplan.ir.tensor import numpy_to_onnx_dtype
from onnxplan.kernels.registry import KernelContext, bound_kernel, find_kernel, scratch_bytes
from onnxplan.loading.artifacts import build_artifacts
from onnxplan.models import build_forward, get_model

__all__ = ["layer_cases", "main", "time_case"]


def layer_cases(model: str, ops: set[str]):
    """(node, input specs, output specs, count) for each distinct matching node of the step."""
    spec = get_model(model)
    graph = read_step(build_artifacts(build_forward(model), None, optimizer=spec.default_optimizer))
    cases: dict[tuple, list] = {}
    for node in graph.nodes:
        if node.op_type not in ops:
            continue
        ins = [graph.values[i].spec if i else None for i in node.inputs]
        outs = [graph.values[o].spec if o else None for o in node.outputs]
        key = (node.domain, node.op_type, tuple(ins), tuple(outs), repr(sorted(node.attrs.items())))
        if key in cases:
            cases[key][3] += 1
        else:
            cases[key] = [node, ins, outs, 1]
    return list(cases.values())


def _ort_session(node, ins, outs, threads: int):
    names = [f"i{k}" if s is not None else "" for k, s in enumerate(ins)]
    onames = [f"o{k}" if s is not None else "" for k, s in enumerate(outs)]
    onnx_node = helper.make_node(node.op_type, names, onames, domain=node.domain or None, **node.attrs)
    graph = helper.make_graph(
        [onnx_node], "one",
        [helper.make_tensor_value_info(n, numpy_to_onnx_dtype(s.dtype), s.shape) for n, s in zip(names, ins) if s],
        [helper.make_tensor_value_info(n, numpy_to_onnx_dtype(s.dtype), s.shape) for n, s in zip(onames, outs) if s])
    model = helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]), names


def time_case(node, ins, outs, repeat: int, threads: int = 0, clock=time.perf_counter) -> tuple[float, float, int]:
    """(ORT median s, ours median s, our scratch bytes) on seeded random inputs, by `clock`."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s.shape).astype(s.dtype) if s is not None else None for s in ins]
    session, names = _ort_session(node, ins, outs, threads)
    feeds = {n: a for n, a in zip(names, arrays) if a is not None}
    nbytes = scratch_bytes(node, ins, outs)
    scratch = np.zeros(nbytes, np.uint8) if nbytes else None
    out_arrays = [np.empty(s.shape, s.dtype) if s is not None else None for s in outs]
    ctx = KernelContext(np, node, ins, outs, scratch)
    fn = bound_kernel(find_kernel(node), ctx, arrays, out_arrays)
    runs = [lambda: session.run(None, feeds), lambda: fn(ctx, arrays, out_arrays)]
    times: list[list[float]] = [[], []]
    for r in range(repeat + 1):
        for k, run in enumerate(runs):
            t0 = clock()
            run()
            if r:
                times[k].append(clock() - t0)
    return float(np.median(times[0])), float(np.median(times[1])), nbytes


def _describe(node, ins, outs) -> str:
    shapes = " ".join("x".join(map(str, s.shape)) if s else "-" for s in ins)
    attrs = []
    if node.op_type in ("Conv", "ConvGrad"):
        strides = node.attrs.get("strides", [1])
        attrs.append(f"k{'x'.join(map(str, ins[-1 if node.op_type == 'ConvGrad' else 1].shape[2:]))}"
                     f" s{strides[0]}")
        if node.op_type == "ConvGrad":
            attrs.append("->" + ",".join(n for n, s in zip(("dX", "dW", "dB"), outs) if s))
    for flag in ("transA", "transB"):
        if node.attrs.get(flag):
            attrs.append(flag)
    return f"{shapes} {' '.join(attrs)}".strip()


def main(args: argparse.Namespace) -> None:
    ops = set(args.ops.split(","))
    print(f"# Kernel timings vs ONNX Runtime {ort.__version__}\n")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, numpy {np.__version__}, threads "
          f"{args.threads or 'default'}, {args.clock} time, median of {args.repeat} (interleaved), load "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| model | op | inputs | n | ORT ms | ours ms | ours/ORT | scratch MiB |")
    print("|---|---|---|--:|--:|--:|--:|--:|")
    for model in args.models:
        totals = {}
        for node, ins, outs, count in layer_cases(model, ops):
            t_ort, t_ours, nbytes = time_case(node, ins, outs, args.repeat, args.threads, clock)
            total = totals.setdefault(node.op_type, [0.0, 0.0])
            total[0] += count * t_ort
            total[1] += count * t_ours
            print(f"| {model} | {node.op_type} | {_describe(node, ins, outs)} | {count} | {t_ort * 1e3:.2f} "
                  f"| {t_ours * 1e3:.2f} | {t_ours / t_ort:.2f} | {nbytes / 2**20:.2f} |", flush=True)
        for op, (t_ort, t_ours) in totals.items():
            print(f"| {model} | **{op} total** | (x n) | | {t_ort * 1e3:.1f} | {t_ours * 1e3:.1f} "
                  f"| **{t_ours / t_ort:.2f}** | |", flush=True)


if __name__ == "__main__":
    main(ARGS)
    sys.exit(0)
