"""The fused loops for depthwise convs (onnxplan/kernels/conv_depthwise_loops.py) against the numpy
paths (channels-last columns, or a pass per tap) on MobileNet-, EfficientNet- and ConvNeXt-like
shapes: Conv and ConvGrad (dX and dW), each kernel called as the executor calls it (its declared
scratch), the least of `--rounds` calls, the two paths interleaved round by round. The loops run on
every row here (MIN_WIDTH lifted); `rule` says which path a step takes. `loops/numpy` under 1 is a
gain.

Usage: python benchmarks/bench_conv_depthwise.py [--threads 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_conv_small import call_ms, use_path  # noqa: E402
from onnxplan.ir.windows import window  # noqa: E402
from onnxplan.kernels import conv_depthwise_loops  # noqa: E402
from tests.kernel_harness import call_kernel, make_node  # noqa: E402

# (X shape, kernel, stride, pad): hf-mobilenet-v2@bench's layers (50 down to 5 wide, explicit
# padding before its stride-2 convs), EfficientNet-like 5x5, ConvNeXt's 7x7
CASES = [
    ((8, 32, 50, 50), 3, 1, 0), ((8, 96, 49, 49), 3, 2, 0), ((8, 144, 26, 26), 3, 1, 0),
    ((8, 192, 14, 14), 3, 1, 0), ((8, 192, 13, 13), 3, 2, 0), ((8, 576, 8, 8), 3, 1, 0),
    ((8, 960, 5, 5), 3, 1, 0), ((16, 96, 56, 56), 3, 1, 1), ((16, 240, 28, 28), 5, 1, 2),
    ((8, 96, 56, 56), 7, 1, 3), ((8, 384, 14, 14), 7, 1, 3),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rule_width = conv_depthwise_loops.MIN_WIDTH
    conv_depthwise_loops.MIN_WIDTH = 1  # the loops on every row (the rule's column says where a step takes them)
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}, least of {args.rounds}, load average {os.getloadavg()[0]:.2f}\n")
    print("| X | kernel, stride | rule | Conv loops ms | Conv numpy ms | loops/numpy | ConvGrad loops ms "
          "| ConvGrad numpy ms | loops/numpy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for x_shape, k, s, p in CASES:
        c = x_shape[1]
        x = rng.standard_normal(x_shape, dtype=np.float32)
        w = rng.standard_normal((c, 1, k, k), dtype=np.float32)
        b = rng.standard_normal(c, dtype=np.float32)
        side = (x_shape[2] + 2 * p - k) // s + 1
        y = np.empty((x_shape[0], c, side, side), np.float32)
        dy = rng.standard_normal(y.shape, dtype=np.float32)
        attrs = {"pads": [p] * 4, "strides": [s, s], "kernel_shape": [k, k], "group": c}
        fwd, grad = make_node("Conv", [x, w, b], 1, attrs), make_node("ConvGrad", [dy, x, w], 3, attrs, "com.microsoft")
        dx, dw, db = np.empty_like(x), np.empty_like(w), np.empty_like(b)
        use_path(True, args.threads)
        win = window(attrs, x_shape[2:], y.shape[2:], w.shape[2:])
        loops = conv_depthwise_loops.by_loops(win, c, x, w, y) and x_shape[3] >= rule_width
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.rounds):
            for native in (True, False):
                use_path(native, args.threads)
                times.setdefault(("fwd", native), []).append(call_ms(lambda: call_kernel(fwd, [x, w, b], [y])))
                times.setdefault(("grad", native), []).append(call_ms(lambda: call_kernel(grad, [dy, x, w], [dx, dw, db])))
        f = {key: min(v) for key, v in times.items()}
        print(f"| {'x'.join(map(str, x_shape))} | {k}x{k}, {s} | {'loops' if loops else 'numpy'} "
              f"| {f['fwd', True]:.2f} | {f['fwd', False]:.2f} | {f['fwd', True] / f['fwd', False]:.2f} "
              f"| {f['grad', True]:.2f} | {f['grad', False]:.2f} | {f['grad', True] / f['grad', False]:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
