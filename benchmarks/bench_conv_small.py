"""The fused loops for convs with few output channels (onnxplan/kernels/conv_small.py) against the
BLAS path (im2col + OpenBLAS) on the same shapes: Conv and ConvGrad's dW (+ dB), each kernel
called as the executor calls it (bound, its declared scratch), the least of `--rounds` calls,
the two paths interleaved round by round. A row per shape; `fused/BLAS` under 1 is a gain.

Usage: python benchmarks/bench_conv_small.py [--threads 1] [--rounds 5]
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
from onnxplan.ir.windows import window  # noqa: E402
from onnxplan.kernels import conv, conv_grad, conv_small  # noqa: E402
from onnxplan.threads import use_threads  # noqa: E402
from tests.kernel_harness import call_kernel, make_node  # noqa: E402

# (X shape, output channels, kernel, stride, pad): nnt-conv2d's stem, other stems, and unit-stride
# convs with few outputs (which the rule leaves to the BLAS path)
CASES = [
    ((64, 3, 224, 224), 3, 3, 2, 1), ((16, 3, 224, 224), 8, 3, 2, 1), ((16, 3, 224, 224), 8, 7, 2, 3),
    ((16, 16, 112, 112), 8, 3, 2, 1), ((16, 3, 224, 224), 4, 3, 1, 1), ((16, 16, 56, 56), 4, 3, 1, 1),
    ((16, 64, 56, 56), 4, 3, 1, 1), ((32, 1, 28, 28), 8, 5, 1, 2),
]


def call_ms(fn) -> float:
    """One call's wall time, in ms."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def use_path(native: bool, threads: int) -> None:
    """The fused loops (native) or the numpy / BLAS paths from here on, at `threads`."""
    os.environ["ONNXPLAN_NATIVE_KERNELS"] = "1" if native else "0"
    settings.reload()
    use_threads(threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    native_on = [True]

    def forced(*_args) -> bool:  # the fused loops on every shape here, or none (the rule: `fused rule`)
        return native_on[0]

    conv.by_small = conv_grad.by_small = forced
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}, least of {args.rounds}, load average {os.getloadavg()[0]:.2f}\n")
    print("| X | M | kernel, stride | fused rule | Conv fused ms | Conv BLAS ms | fused/BLAS | dW fused ms "
          "| dW BLAS ms | fused/BLAS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for x_shape, m, k, s, p in CASES:
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal((m, x_shape[1], k, k), dtype=np.float32)
        b = rng.standard_normal(m, dtype=np.float32)
        side = (x_shape[2] + 2 * p - k) // s + 1
        y = np.empty((x_shape[0], m, side, side), np.float32)
        dy = rng.standard_normal(y.shape, dtype=np.float32)
        attrs = {"pads": [p] * 4, "strides": [s, s], "kernel_shape": [k, k]}
        fwd, grad = make_node("Conv", [x, w, b], 1, attrs), make_node("ConvGrad", [dy, x, w], 3, attrs, "com.microsoft")
        dw, db = np.empty_like(w), np.empty_like(b)
        use_path(True, args.threads)
        ruled = conv_small.by_small(x, w, y, 1, window(attrs, x_shape[2:], y.shape[2:], w.shape[2:]))
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.rounds):
            for native in (True, False):
                native_on[0] = native
                use_path(native, args.threads)
                times.setdefault(("fwd", native), []).append(call_ms(lambda: call_kernel(fwd, [x, w, b], [y])))
                times.setdefault(("dw", native), []).append(call_ms(lambda: call_kernel(grad, [dy, x, w], [None, dw, db])))
        f = {key: min(v) for key, v in times.items()}
        print(f"| {'x'.join(map(str, x_shape))} | {m} | {k}x{k}, {s} | {'fused' if ruled else 'BLAS'} "
              f"| {f['fwd', True]:.2f} | {f['fwd', False]:.2f} | {f['fwd', True] / f['fwd', False]:.2f} "
              f"| {f['dw', True]:.2f} | {f['dw', False]:.2f} | {f['dw', True] / f['dw', False]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
