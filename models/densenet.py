"""A DAG-heavy model for the joint solver's benchmark: a small DenseNet-BC written in PyTorch and
exported with `torch.onnx.export`, as a user would (onnxplan.models.hf's TorchScript export:
opset 17, training mode, no constant folding; nothing edited after export).

Every layer of a dense block reads the concatenation of all the block's earlier feature maps,
so no single tensor cuts a block: the recompute chain (onnxplan.checkpoint.chain) sees a block
as one stage, while the whole-graph solver sees every layer. Ops: Conv, BatchNormalization,
Relu, Concat, AveragePool, GlobalAveragePool, Gemm (all with ONNX Runtime CPU gradients).

`export_densenet(batch)` writes (once, cached under $ONNXPLAN_CACHE/densenet) the forward
.onnx; `densenet_artifacts(batch)` builds its training artifacts from that file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["BLOCKS", "GROWTH", "densenet_artifacts", "export_densenet"]

SEED = 0
IMAGE = 32
CLASSES = 10
GROWTH = 12
BLOCKS = (4, 4)  # dense layers per block
STEM = 16


def _module():
    import torch
    from torch import nn

    class DenseLayer(nn.Module):
        """BN-ReLU-Conv1x1 (4k) - BN-ReLU-Conv3x3 (k), its output appended to its input."""

        def __init__(self, cin: int, k: int) -> None:
            super().__init__()
            self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, 4 * k, 1, bias=False)
            self.bn2, self.conv2 = nn.BatchNorm2d(4 * k), nn.Conv2d(4 * k, k, 3, padding=1, bias=False)

        def forward(self, x):
            y = self.conv1(torch.relu(self.bn1(x)))
            return torch.cat([x, self.conv2(torch.relu(self.bn2(y)))], dim=1)

    class DenseNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers, c = [nn.Conv2d(3, STEM, 3, padding=1, bias=False)], STEM
            for b, n in enumerate(BLOCKS):
                for _ in range(n):
                    layers.append(DenseLayer(c, GROWTH))
                    c += GROWTH
                if b + 1 < len(BLOCKS):  # transition: BN-ReLU-Conv1x1 (halve channels), 2x2 average pool
                    layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2)]
                    c //= 2
            layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
            self.features = nn.Sequential(*layers)
            self.head = nn.Linear(c, CLASSES)

        def forward(self, x):
            return self.head(self.features(x))

    torch.manual_seed(SEED)
    model = DenseNet()
    model.train()
    return model


def export_densenet(batch: int = 8, cache_dir: Path | None = None) -> Path:
    """The forward .onnx of the DenseNet at `batch` (input [batch, 3, 32, 32] 'pixel_values',
    output 'logits'), exported once into the cache (written to a temp name and renamed)."""
    import torch

    from onnxplan.loading.artifacts import default_cache_dir
    from onnxplan.models.hf import export_to

    h = hashlib.sha256(f"{batch}|{torch.__version__}".encode())
    h.update(Path(__file__).read_bytes())
    folder = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "densenet" / h.hexdigest()[:16]
    path = folder / f"densenet-b{batch}.onnx"
    if path.is_file():
        return path
    x = torch.rand(batch, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(SEED))
    export_to(path, _module(), x, "torchscript", "pixel_values")
    return path


def densenet_artifacts(batch: int = 8, optimizer: str = "adamw") -> Path:
    """The training artifacts (cross-entropy loss, `optimizer`) of the exported DenseNet."""
    from onnxplan.loading.request import make_request
    from onnxplan.loading.resolve import resolve_artifacts

    return resolve_artifacts(make_request(export_densenet(batch), optimizer=optimizer, loss="ce"))
