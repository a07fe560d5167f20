"""BatchNormalization in training (BatchNormInternal) and BatchNormalizationGrad by the fused C
loops (onnxplan/kernels/batch_norm_loops.py) against the numpy/torch path
(ONNXPLAN_NATIVE_KERNELS=0), each node bound and called as the executor calls it (the declared
scratch): per shape the typical (10th percentile) call after a warm-up, the two paths
interleaved in `--rounds` rounds. `fused/numpy` under 1 is a gain.

Usage: python benchmarks/bench_batch_norm.py [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_sce import _bound, fused_bench_args, print_fused_table, use_path  # noqa: E402

MS = "com.microsoft"
# (n, c, h, w): resnet18 b8's first stage and last stage, ResNet-50 b8's widest 1x1 output
CASES = [(8, 64, 56, 56), (8, 512, 7, 7), (8, 256, 56, 56)]


def _nodes(shape: tuple, native: bool, rng) -> tuple:
    """(the forward's call, the gradient's call) on the fused or the numpy path."""
    use_path(native)
    f, c = np.float32, shape[1]
    x, dy = rng.standard_normal(shape, dtype=f), rng.standard_normal(shape, dtype=f)
    scale, bias, mean, var = (rng.standard_normal(c, dtype=f) for _ in range(4))
    var = np.abs(var) + f(0.5)
    y, saved_mean, saved_inv = np.empty(shape, f), np.empty(c, f), np.empty(c, f)
    attrs = {"epsilon": 1e-5, "momentum": 0.9}
    fwd = _bound("BatchNormInternal", MS, [x, scale, bias, mean, var], [y, mean, var, saved_mean, saved_inv], attrs)
    fwd()
    dx, dscale, dbias = np.empty(shape, f), np.empty(c, f), np.empty(c, f)
    grad = _bound("BatchNormalizationGrad", MS, [dy, x, scale, saved_mean, saved_inv], [dx, dscale, dbias],
                  {"epsilon": 1e-5})
    return fwd, grad


def main() -> None:
    args = fused_bench_args(__doc__).parse_args()
    rng = np.random.default_rng(0)
    cases = [("x".join(map(str, shape)), lambda native, shape=shape: _nodes(shape, native, rng),
              max(5, min(200, 20_000_000 // int(np.prod(shape))))) for shape in CASES]
    print_fused_table(args, "n x c x h x w", "fwd", cases)


if __name__ == "__main__":
    main()
