"""Our matrix products against ONNX Runtime's MatMul, in one process, at the same thread count.

Each shape: our `kernels.matmul.Product` (cut for the compute threads, its BLAS calls on the GEMM
pool) and a one-node ONNX Runtime session (MatMul; `intra_op_num_threads` = --threads, inter-op 1,
its workers not spinning: they would take the cores from ours between blocks), on the same
operands, alternating blocks of --calls calls (who goes first alternates), --blocks blocks; per
block the median call; the table gives each side's median over the blocks and the median of the
per-block ratios (ours / ORT), which moves less than either side on a machine whose speed drifts.
`--evict` bytes of other memory written before each call (the operands cold, as in a step).

Usage: python benchmarks/products_vs_ort.py [--threads 2] [--blocks 10] [--calls 40]
           [--evict 0] [--shapes 1024x128x512,64x784x256t]
A shape is m x k x n; a trailing `t` gives B as the transpose of an (n, k) array (a Linear
layer's weight), a leading `t` gives A as the transpose of a (k, m) array (a weight gradient).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxplan.kernels.matmul import Product  # noqa: E402
from onnxplan.threads import use_threads  # noqa: E402

# transformer / GPT b16's ff and projection products, mlp b64's fc1 (B a weight's transpose), its
# fc1 weight gradient (A transposed) and fc2
SHAPES = "1024x128x512,1024x512x128,1024x128x128,512x128x512,64x784x256t,t256x64x784,64x256x128"


def _operands(spec: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ta, tb = spec.startswith("t"), spec.endswith("t")
    m, k, n = (int(v) for v in spec.strip("t").split("x"))
    a = rng.standard_normal((k, m), dtype=np.float32).T if ta else rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((n, k), dtype=np.float32).T if tb else rng.standard_normal((k, n), dtype=np.float32)
    return a, b, np.empty((m, n), np.float32)


def _ort_matmul(a: np.ndarray, b: np.ndarray, threads: int):
    """A call running ONNX Runtime's MatMul of a and b (bound once: no copies per call)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "matmul",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a.shape)),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b.shape))],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [a.shape[0], b.shape[1]])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    binding.bind_ortvalue_input("a", ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a)))
    binding.bind_ortvalue_input("b", ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(b)))
    binding.bind_output("c")
    return lambda: session.run_with_iobinding(binding)


def _compare(spec: str, args: argparse.Namespace, rng: np.random.Generator) -> str:
    a, b, out = _operands(spec, rng)
    ours, theirs = Product(np, a, b, out), _ort_matmul(a, b, args.threads)
    junk = np.ones(max(1, args.evict // 4), np.float32)
    medians: dict[str, list[float]] = {"ours": [], "ort": []}
    for block in range(args.blocks):
        order = [("ours", ours), ("ort", theirs)]
        for name, fn in order if block % 2 == 0 else order[::-1]:
            for _ in range(3):
                fn()
            times = []
            for _ in range(args.calls):
                if args.evict:
                    np.add(junk, 1.0, out=junk)
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            medians[name].append(statistics.median(times))
    ratio = statistics.median(o / t for o, t in zip(medians["ours"], medians["ort"]))
    cut = ours._cut[0] if ours._cut else "whole"
    return (f"| {spec} | {cut} | {statistics.median(medians['ours']) * 1e6:.0f} | "
            f"{statistics.median(medians['ort']) * 1e6:.0f} | {ratio:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="compute threads for both (default 2)")
    ap.add_argument("--blocks", type=int, default=10, help="alternating blocks per side (default 10)")
    ap.add_argument("--calls", type=int, default=40, help="timed calls per block (default 40)")
    ap.add_argument("--evict", type=int, default=0, help="bytes written before each call (default 0: hot)")
    ap.add_argument("--shapes", default=SHAPES, help=f"comma-separated shapes (default {SHAPES})")
    args = ap.parse_args()
    use_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"{args.threads} threads, {args.blocks} blocks of {args.calls} calls each side, evict {args.evict} B\n")
    print("| m x k x n | our cut | ours us | ORT us | ours/ORT (median of blocks) |\n|---|---|---|---|---|")
    for spec in args.shapes.split(","):
        print(_compare(spec, args, rng), flush=True)


if __name__ == "__main__":
    main()
