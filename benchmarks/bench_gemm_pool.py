"""The GEMM pool (onnxplan/kernels/gemm_calls.py) against the products it replaced, at 2+ threads.

1. Products alone: one product computed whole (one BLAS call on the calling thread), cut in two
   on the GEMM pool, and its two pieces both on the calling thread (what a split costs when no
   worker comes); the least of 10 calls per round, `--rounds` rounds interleaved, the median of
   the rounds' least. `--evict` bytes of other memory touched before each call (a step's other
   kernels between two products).
2. A training step: one executor, blocks of `--block` steps with the GEMM pool on and off
   (products on the Python pool as before, cut from 8 M multiply-adds a piece) interleaved,
   `--step-rounds` rounds; per round the ratio of the blocks' median steps.

Usage: python benchmarks/bench_gemm_pool.py [--threads 2] [--rounds 15] [--evict 8000000]
           [--models mlp:64,transformer:16] [--block 10] [--step-rounds 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onnxplan import settings  # noqa: E402
from onnxplan.kernels import gemm_calls, matmul  # noqa: E402
from onnxplan.threads import use_threads  # noqa: E402

# (m, k, n, b transposed): mlp b64's fc1 and its dW, a transformer b16 projection, fc2 (2 M: too small)
SHAPES = [(64, 784, 256, True), (784, 64, 256, False), (1024, 128, 128, True), (512, 128, 512, False),
          (64, 256, 128, True)]


def _products(rounds: int, evict: int) -> None:
    rng = np.random.default_rng(0)
    junk = np.ones(max(1, evict // 4), np.float32)
    pool = gemm_calls.pool()
    if pool is None:
        sys.exit("no GEMM pool here (no C compiler, or numpy's BLAS is not an ILP64 OpenBLAS)")
    print(f"| m x k x n | whole us | pool, 2 pieces us | 2 pieces on the caller us | pool/whole |  (evict {evict} B)")
    print("|---|---|---|---|---|")
    for m, k, n, trans in SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((n, k), dtype=np.float32).T if trans else rng.standard_normal((k, n), dtype=np.float32)
        out = np.empty((m, n), np.float32)
        cut = ("columns", [(0, n // 2), (n // 2, n)]) if n >= 256 else ("rows", [(0, m // 2), (m // 2, m)])
        calls = gemm_calls.product_calls(a, b, out, *cut, matmul.BLAS_ROW_BLOCK)
        runs = {"whole": lambda: np.matmul(a, b, out=out), "pool": lambda: pool.run(calls, 1),
                "alone": lambda: pool.run(calls, 0)}
        least: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name, fn in runs.items():
                times = []
                for _ in range(10):
                    if evict:
                        junk *= np.float32(1.0000001)
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                least[name].append(min(times))
        med = {name: statistics.median(v) * 1e6 for name, v in least.items()}
        print(f"| {m} x {k} x {n}{' (b^T)' if trans else ''} | {med['whole']:.1f} | {med['pool']:.1f} | "
              f"{med['alone']:.1f} | {med['pool'] / med['whole']:.2f} |")


def _step(model: str, block: int, rounds: int) -> None:
    from onnxplan.executor.prepare import prepare
    from onnxplan.executor.runner import Executor, initial_parameters, step_batches
    from onnxplan.loading.request import LoadRequest

    name, _, batch = model.partition(":")
    prep = prepare(LoadRequest(name, batch=int(batch)) if batch else LoadRequest(name))
    ex = Executor(prep.graph, prep.plan)
    ex.load_state(initial_parameters(prep.folder))
    feed = step_batches(prep.folder, 1, 0)[0]
    real = gemm_calls.pool
    modes = {"pool": real, "off": lambda: None}
    medians: dict[str, list[float]] = {k: [] for k in modes}
    for _ in range(3):
        ex.step(feed)
    for r in range(rounds):
        for mode in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            gemm_calls.pool = modes[mode]  # type: ignore[assignment]
            settings.use(replace(settings.current()))  # new settings: every product works its cut out again
            ex.step(feed)
            times = []
            for _ in range(block):
                t0 = time.perf_counter()
                ex.step(feed)
                times.append(time.perf_counter() - t0)
            medians[mode].append(statistics.median(times))
    gemm_calls.pool = real  # type: ignore[assignment]
    ratios = [p / o for p, o in zip(medians["pool"], medians["off"])]
    print(f"| {model} | {statistics.median(medians['pool']) * 1e3:.3f} | {statistics.median(medians['off']) * 1e3:.3f} "
          f"| {statistics.median(ratios):.3f} | {min(ratios):.2f}-{max(ratios):.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--evict", type=int, default=8_000_000)
    p.add_argument("--models", default="mlp:64,transformer:16")
    p.add_argument("--block", type=int, default=10)
    p.add_argument("--step-rounds", type=int, default=12)
    args = p.parse_args()
    use_threads(args.threads)
    for evict in (0, args.evict):
        _products(args.rounds, evict)
        print()
    print(f"| model | pool step ms | off step ms | pool/off (median of rounds) | range |  ({args.threads} threads, "
          f"{args.step_rounds} rounds of {args.block} steps)")
    print("|---|---|---|---|---|")
    for model in filter(None, args.models.split(",")):
        _step(model, args.block, args.step_rounds)


if __name__ == "__main__":
    main()
