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
from collections.abc import Callable
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


def use_path(native: bool) -> None:
    """The fused loops (True) or the numpy path (False) for the kernels bound from now on."""
    os.environ["ONNXPLAN_NATIVE_KERNELS"] = "1" if native else "0"
    settings.reload()


def fused_bench_args(doc: str) -> argparse.ArgumentParser:
    """The fused-against-numpy benches' options: --threads, --rounds."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    return ap


def print_fused_table(args, first: str, nodes: str, cases: list[tuple[str, Callable[[bool], tuple], int]]) -> None:
    """At args.threads, one table row per case (its first cells, its nodes(native) -> (forward's
    call, gradient's call), calls per round): the fused path against the numpy path
    (fused_against_numpy); then the environment's own choice of path again."""
    use_threads(args.threads)
    print(f"threads {args.threads}, load average {os.getloadavg()[0]:.2f}\n")
    print(f"| {first} | {nodes} fused us | {nodes} numpy us | fused/numpy | grad fused us | grad numpy us | fused/numpy |")
    print("|" + "---|" * (first.count("|") + 7))
    for label, make, calls in cases:
        cells = fused_against_numpy(make, args.rounds, calls)
        print(f"| {label} | {cells[0]} | {cells[1]} |")
    os.environ.pop("ONNXPLAN_NATIVE_KERNELS", None)
    settings.reload()


def _nodes(shape: tuple, reduction: str, native: bool, rng) -> tuple:
    """(the loss's call, the gradient's call) on the fused or the numpy path."""
    use_path(native)
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
    ap = fused_bench_args(__doc__)
    ap.add_argument("--big", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cases = [("x".join(map(str, shape)), lambda native, shape=shape, r=reduction: _nodes(shape, r, native, rng),
              max(5, min(2000, 20_000_000 // int(np.prod(shape))))) for shape, reduction in CASES + (BIG if args.big else [])]
    print_fused_table(args, "scores", "loss", cases)


if __name__ == "__main__":
    main()
