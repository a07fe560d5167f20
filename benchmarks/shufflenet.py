"""The issue's ShuffleNet case: a user's ShuffleNetV2 export through the default `plan`.

Usage: python benchmarks/shufflenet.py [--batch 8] [--image 64] [--rounds 3]

ShuffleNetV2 x0.5 (Ma et al. 2018; torchvision's layout: stages of 4/8/4 units, channels
24-48-96-192-1024, channel split / concat / channel shuffle) written here in plain torch (the
torchvision wheel does not import beside the CPU torch), seeded, in train mode, exported as a
user would (`torch.onnx.export`, TorchScript exporter, opset 17, TrainingMode.TRAINING) and
planned from the .onnx file: the forward-model path, artifacts, load, then the default
`plan_step` and the issue's fast pair (`--order nntrainer --planner greedy-size`), each timed
in this process `--rounds` times (median; artifacts cached). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def _model():
    import torch
    from torch import nn

    def shuffle(x, groups=2):
        b, c, h, w = x.shape
        return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)

    def conv_bn(cin, cout, k, stride, groups=1, relu=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, *([nn.ReLU(inplace=True)] if relu else []))

    class Unit(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.stride, half = stride, cout // 2
            if stride > 1:
                self.branch1 = nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin, relu=False),
                                             conv_bn(cin, half, 1, 1))
            self.branch2 = nn.Sequential(conv_bn(cin if stride > 1 else half, half, 1, 1),
                                         conv_bn(half, half, 3, stride, groups=half, relu=False),
                                         conv_bn(half, half, 1, 1))

        def forward(self, x):
            if self.stride == 1:
                a, b = x.chunk(2, dim=1)
                out = torch.cat((a, self.branch2(b)), dim=1)
            else:
                out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
            return shuffle(out)

    class ShuffleNetV2(nn.Module):
        def __init__(self, widths=(24, 48, 96, 192, 1024), repeats=(4, 8, 4), classes=10):
            super().__init__()
            self.stem = nn.Sequential(conv_bn(3, widths[0], 3, 2), nn.MaxPool2d(3, 2, 1))
            units, cin = [], widths[0]
            for cout, n in zip(widths[1:4], repeats):
                units += [Unit(cin, cout, 2)] + [Unit(cout, cout, 1) for _ in range(n - 1)]
                cin = cout
            self.units = nn.Sequential(*units)
            self.head = conv_bn(cin, widths[4], 1, 1)
            self.fc = nn.Linear(widths[4], classes)

        def forward(self, x):
            return self.fc(self.head(self.units(self.stem(x))).mean((2, 3)))

    torch.manual_seed(0)
    return ShuffleNetV2().train()


def _export(path: Path, batch: int, image: int) -> None:
    import torch

    model = _model()
    x = torch.randn(batch, 3, image, image)
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["input"], output_names=["logits"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from onnxplan.loading import load_step
    from onnxplan.loading.artifacts import quiet_fds
    from onnxplan.loading.request import LoadRequest
    from onnxplan.planning import PlanOptions, plan_step

    path = Path(tempfile.mkdtemp(prefix="shufflenet-")) / "shufflenetv2.onnx"
    with quiet_fds():
        _export(path, args.batch, args.image)
    w0 = time.perf_counter()
    load_step(LoadRequest(str(path)))  # builds the artifacts once (cached afterwards)
    build = time.perf_counter() - w0
    rows = {"default (anytime)": PlanOptions(), "nntrainer + greedy-size": PlanOptions(order="nntrainer",
                                                                                        planner="greedy-size")}
    times: dict[str, list[float]] = {k: [] for k in rows}
    plans = {}
    for _ in range(args.rounds):
        for name, opts in rows.items():
            t0 = time.perf_counter()
            g = load_step(LoadRequest(str(path)))
            res = plan_step(g, opts)
            times[name].append(time.perf_counter() - t0)
            plans[name] = (len(g.nodes), res)
    print(f"ShuffleNetV2 x0.5, batch {args.batch}, {args.image}x{args.image}, TorchScript export; artifacts "
          f"built in {build:.1f} s (not timed below); {args.rounds} rounds, load avg {os.getloadavg()[0]:.1f}\n")
    print("| plan | nodes | load + plan s (median) | chosen | peak MiB | lower bound MiB | fragmentation |")
    print("|---|---|---|---|---|---|---|")
    for name, (nodes, res) in plans.items():
        p = res.plan
        print(f"| {name} | {nodes} | {statistics.median(times[name]):.2f} | {p.order_policy}+{p.planner} "
              f"| {p.peak_bytes / 2**20:.2f} | {p.lower_bound_bytes / 2**20:.2f} | {p.fragmentation:.2%} |")


if __name__ == "__main__":
    main()
