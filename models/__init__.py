"""The model zoo: training-ready forward models built in code with seeded weights."""

from __future__ import annotations

import hashlib
import numbers
from pathlib import Path

import numpy as np
import onnx

from onnxplan.errors import UsageError
from onnxplan.forward.spec import LOSSES, ForwardModel
from onnxplan.loading.zoo import register_source
from onnxplan.models._spec import ModelSpec
from onnxplan.models.cnn import build_resnet18, build_vgg16
from onnxplan.models.mlp import build_mlp, build_mlp_frozen
from onnxplan.models.nntrainer import (
    build_nnt_conv2d,
    build_nnt_conv_ac_fl,
    build_nnt_fc3,
    build_nnt_fc3_frozen,
    build_nnt_linear,
)
from onnxplan.models.source import SOURCE
from onnxplan.models.transformer import build_gpt, build_transformer

__all__ = [
    "ModelSpec",
    "build_forward",
    "build_gpt",
    "build_recipe",
    "build_transformer",
    "get_model",
    "list_models",
]

_ZOO: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("mlp", "MLP 784-256-128-10 (Gemm, Relu)", 64, "ce", "adamw", build_mlp),
        ModelSpec("mlp-frozen", "mlp with its middle layer frozen (non-trainable)", 64, "ce", "adamw",
                  build_mlp_frozen),
        ModelSpec("nnt-linear", "NNTrainer Table 4 Linear: 150528 -> 300", 64, "mse", "sgd",
                  build_nnt_linear),
        ModelSpec("nnt-conv2d", "NNTrainer Table 4 Conv2D: 3x224x224 -> 3x112x112", 64, "mse", "sgd",
                  build_nnt_conv2d),
        ModelSpec("nnt-fc3", "NNTrainer Table 4 FC-FC-FC: 784 -> 4096 -> 768 -> 100", 2048, "mse", "sgd",
                  build_nnt_fc3),
        ModelSpec("nnt-fc3-frozen", "nnt-fc3 with the second layer non-trainable (Figure 10)", 2048,
                  "mse", "sgd", build_nnt_fc3_frozen),
        ModelSpec("nnt-conv-ac-fl", "NNTrainer Table 4 Conv-AC-FL: conv, ReLU, flatten -> 37632", 64,
                  "mse", "sgd", build_nnt_conv_ac_fl),
        ModelSpec("vgg16", "VGG16 for 3x32x32, 10 classes", 64, "ce", "adamw", build_vgg16),
        ModelSpec("resnet18", "ResNet18 (CIFAR stem, BatchNorm) for 3x32x32, 10 classes", 64, "ce",
                  "adamw", build_resnet18),
        ModelSpec("transformer", "2-layer encoder classifier, d128 h4 seq64 vocab1000", 16, "ce", "adamw",
                  build_transformer),
        ModelSpec("gpt", "2-layer causal decoder LM, d128 h4 seq64 vocab1000", 16, "ce", "adamw",
                  build_gpt),
    )
}


def list_models() -> list[ModelSpec]:
    """All zoo entries, in a stable order."""
    return list(_ZOO.values())


def get_model(name: str) -> ModelSpec:
    """The zoo entry called `name`; UsageError naming the known ones otherwise."""
    try:
        return _ZOO[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}; known: {', '.join(_ZOO)}") from None


def _checked(name: str, batch: int | None, loss: str | None) -> tuple[ModelSpec, int, str]:
    spec = get_model(name)
    if batch is not None and (not isinstance(batch, numbers.Integral) or batch < 1):
        raise UsageError(f"batch must be a positive integer, got {batch!r}")
    if loss is not None and loss not in LOSSES:
        raise UsageError(f"unknown loss {loss!r}; known: {', '.join(LOSSES)}")
    return spec, int(batch or spec.default_batch), loss or spec.default_loss


def build_forward(name: str, batch: int | None = None, loss: str | None = None) -> ForwardModel:
    """Build zoo model `name` at `batch` (default: its own) with `loss` (default: its own)."""
    spec, batch, loss = _checked(name, batch, loss)
    return spec.builder(batch=batch, loss=loss)


def _builder_sources() -> str:
    """sha256 of this package's builder code: a changed builder is a different recipe."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def build_recipe(name: str, batch: int | None = None, loss: str | None = None) -> dict:
    """Everything build_forward(name, batch, loss)'s output depends on: the entry, the batch
    and loss it resolves to, the builders' source and the numpy / onnx versions that draw the
    seeded weights and serialise the model. Equal recipes build byte-identical models, so an
    artifact cache may key on the recipe without building (onnxplan.loading.artifacts.recipe_entry)."""
    spec, batch, loss = _checked(name, batch, loss)
    return {"zoo": spec.name, "batch": batch, "loss": loss, "builders": _builder_sources(),
            "numpy": np.__version__, "onnx": onnx.__version__}


register_source(SOURCE)  # the load stage finds zoo names through it (onnxplan.loading.zoo)
