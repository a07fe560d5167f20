"""LayerNormalization (and the RMS norm) and its gradient by the fused C loops
(onnxplan/kernels/norm_loops.py) against the numpy/torch path (ONNXPLAN_NATIVE_KERNELS=0), each
node bound and called as the executor calls it (the declared scratch): per shape the typical
(10th percentile) call after a warm-up, the two paths interleaved in `--rounds` rounds.
`fused/numpy` under 1 is a gain.

Usage: python benchmarks/bench_layer_norm.py [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_sce import _bound, fused_bench_args, print_fused_table, use_path  # noqa: E402

MS = "com.microsoft"
# (rows, normalized size, simplified): the zoo transformer's and GPT's b16 rows, GPT-2 small and
# BERT-base at 4 x 512 tokens, a Llama-like RMS norm
CASES = [(1024, 128, False), (4096, 768, False), (2048, 2048, True)]


def _nodes(rows: int, m: int, simplified: bool, native: bool, rng) -> tuple:
    """(the forward's call, the gradient's call) on the fused or the numpy path."""
    use_path(native)
    f = np.float32
    x, scale, bias = (rng.standard_normal(s, dtype=f) for s in ((rows, m), (m,), (m,)))
    y, mean, inv = np.empty((rows, m), f), np.empty((rows, 1), f), np.empty((rows, 1), f)
    dy, dx, dscale, dbias = rng.standard_normal((rows, m), dtype=f), np.empty((rows, m), f), np.empty(m, f), np.empty(m, f)
    attrs = {"axis": -1, "epsilon": 1e-5}
    if simplified:
        fwd = _bound("SimplifiedLayerNormalization", "", [x, scale], [y, inv], attrs)
        fwd()
        grad = _bound("SimplifiedLayerNormalizationGrad", MS, [dy, x, scale, inv], [dx, dscale], attrs)
    else:
        fwd = _bound("LayerNormalization", "", [x, scale, bias], [y, mean, inv], attrs)
        fwd()
        grad = _bound("LayerNormalizationGrad", MS, [dy, x, scale, mean, inv], [dx, dscale, dbias], attrs)
    return fwd, grad


def main() -> None:
    args = fused_bench_args(__doc__).parse_args()
    rng = np.random.default_rng(0)
    cases = [(f"{rows}x{m} | {'RMS' if simplified else 'LN'}",
              lambda native, rows=rows, m=m, simplified=simplified: _nodes(rows, m, simplified, native, rng),
              max(5, min(500, 50_000_000 // (rows * m)))) for rows, m, simplified in CASES]
    print_fused_table(args, "rows x m | norm", "fwd", cases)


if __name__ == "__main__":
    main()
