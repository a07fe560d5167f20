"""LayerNormalization (and the RMS norm) and its gradient by the fused C loops
(onnxplan/kernels/norm_loops.py) against the numpy/torch path (ONNXPLAN_NATIVE_KERNELS=0), each
node bound and called as the executor calls it (the declared scratch): per shape the typical
(10th percentile) call after a warm-up, the two paths interleaved in `--rounds` rounds.
`fused/numpy` under 1 is a gain.

Usage: python benchmarks/bench_layer_norm.py [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_sce import _bound, fused_against_numpy  # noqa: E402
from onnxplan import settings  # noqa: E402
from onnxplan.threads import use_threads  # noqa: E402

MS = "com.microsoft"
# (rows, normalized size, simplified): the zoo transformer's and GPT's b16 rows, GPT-2 small and
# BERT-base at 4 x 512 tokens, a Llama-like RMS norm
CASES = [(1024, 128, False), (4096, 768, False), (2048, 2048, True)]


def _nodes(rows: int, m: int, simplified: bool, native: bool, rng) -> tuple:
    """(the forward's call, the gradient's call) on the fused or the numpy path."""
    os.environ["ONNXPLAN_NATIVE_KERNELS"] = "1" if native else "0"
    settings.reload()
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    use_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}, load average {os.getloadavg()[0]:.2f}\n")
    print("| rows x m | norm | fwd fused us | fwd numpy us | fused/numpy | grad fused us | grad numpy us | fused/numpy |")
    print("|---|---|---|---|---|---|---|---|")
    for rows, m, simplified in CASES:
        calls = max(5, min(500, 50_000_000 // (rows * m)))
        cells = fused_against_numpy(lambda native: _nodes(rows, m, simplified, native, rng), args.rounds, calls)
        print(f"| {rows}x{m} | {'RMS' if simplified else 'LN'} | {cells[0]} | {cells[1]} |")
    os.environ.pop("ONNXPLAN_NATIVE_KERNELS", None)
    settings.reload()


if __name__ == "__main__":
    main()
