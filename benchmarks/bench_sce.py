"""SoftmaxCrossEntropyLoss and its gradient by the fused C loops (onnxplan/kernels/native.py)
against the numpy/torch path (ONNXPLAN_NATIVE_KERNELS=0), each node bound and called as the
executor calls it (tests/kernel_harness.call_kernel's binding, the declared scratch): per shape
the typical (10th percentile) call of `--calls` after a warm-up, the two paths interleaved in
`--rounds` rounds. `fused/numpy` under 1 is a gain.

Usage: python benchmarks/bench_sce.py [--threads 1] [--rounds 3] [--big]
(--big adds GPT-2's 1024 x 50257 scores: 200 MB a tensor.)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxplan import settings  # noqa: E402
from onnxplan.ir.tensor import TensorSpec  # noqa: E402
from onnxplan.kernels.registry import KernelContext, bound_kernel, find_kernel, scratch_bytes  # noqa: E402
from onnxplan.threads import use_threads  # noqa: E402
from tests.kernel_harness import make_node  # noqa: E402

MS = "com.microsoft"
# (scores shape, reduction): mlp's 64 x 10, a wider classifier, GPT b16's rows, a segmentation map
CASES = [((64, 10), "mean"), ((64, 1000), "mean"), ((1024, 1000), "mean"), ((4, 21, 64, 64), "mean")]
BIG = [((1024, 50257), "mean")]


def _bound(op: str, domain: str, inputs: list, outputs: list, attrs: dict):
    """The node's kernel bound to these arrays, and a call of it."""
    spec = lambda a: TensorSpec(a.dtype, a.shape)  # noqa: E731
    node = make_node(op, inputs, [(o.dtype, o.shape) for o in outputs], attrs, domain)
    nbytes = scratch_bytes(node, [spec(a) for a in inputs], [spec(o) for o in outputs])
    ctx = KernelContext(np, node, [spec(a) for a in inputs], [spec(o) for o in outputs],
                        np.empty(nbytes, np.uint8) if nbytes else None)
    fn = bound_kernel(find_kernel(node), ctx, inputs, outputs)
    return lambda: fn(ctx, inputs, outputs)


def _typical_us(fn, calls: int) -> float:
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 10] * 1e6


def fused_against_numpy(nodes, rounds: int, calls: int) -> list[str]:
    """Per node of `nodes(native)` (the fused path's calls, then the numpy path's), the least over
    `rounds` interleaved rounds of each path's typical call: table cells "fused | numpy | ratio"."""
    best: dict[tuple[bool, int], float] = {}
    for _ in range(rounds):
        for native in (True, False):
            for k, fn in enumerate(nodes(native)):
                t = _typical_us(fn, calls)
                best[native, k] = min(best.get((native, k), t), t)
    count = len(best) // 2
    return [f"{best[True, k]:.1f} | {best[False, k]:.1f} | {best[True, k] / best[False, k]:.2f}" for k in range(count)]


def _nodes(shape: tuple, reduction: str, native: bool, rng) -> tuple:
    """(the loss's call, the gradient's call) on the fused or the numpy path."""
    os.environ["ONNXPLAN_NATIVE_KERNELS"] = "1" if native else "0"
    settings.reload()
    n, c, rest = shape[0], shape[1], shape[2:]
    scores = rng.standard_normal(shape, dtype=np.float32)
    labels = rng.integers(0, c, (n, *rest)).astype(np.int64)
    loss, log_prob = np.empty((), np.float32), np.empty(shape, np.float32)
    attrs = {"reduction": reduction}
    fwd = _bound("SoftmaxCrossEntropyLoss", "", [scores, labels], [loss, log_prob], attrs)
    fwd()
    dlogits = np.empty(shape, np.float32)
    grad = _bound("SoftmaxCrossEntropyLossGrad", MS, [np.array(1.0, np.float32), log_prob, labels], [dlogits], attrs)
    return fwd, grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big", action="store_true")
    args = ap.parse_args()
    use_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}, load average {os.getloadavg()[0]:.2f}\n")
    print("| scores | loss fused us | loss numpy us | fused/numpy | grad fused us | grad numpy us | fused/numpy |")
    print("|---|---|---|---|---|---|---|")
    for shape, reduction in CASES + (BIG if args.big else []):
        calls = max(5, min(2000, 20_000_000 // int(np.prod(shape))))
        cells = fused_against_numpy(lambda native: _nodes(shape, reduction, native, rng), args.rounds, calls)
        print(f"| {'x'.join(map(str, shape))} | {cells[0]} | {cells[1]} |")
    os.environ.pop("ONNXPLAN_NATIVE_KERNELS", None)
    settings.reload()


if __name__ == "__main__":
    main()
