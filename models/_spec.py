"""The zoo's data types: model specs, input specs and built forward models."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import onnx

from onnxplan.errors import ModelError, UsageError

__all__ = ["ModelSpec", "InputSpec", "ForwardModel", "LOSSES", "OPTIMIZERS", "labels_for_output"]

LOSSES = ("ce", "mse")
OPTIMIZERS = ("adamw", "sgd")
_SAMPLE_CHUNK = 1 << 20  # elements drawn at once by InputSpec.sample


@dataclass
class InputSpec:
    """A step input (data or labels): name, numpy dtype name, static shape, data range.

    Seeded random data is drawn uniformly from [low, high) (integers: low..high-1).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    low: float
    high: float

    def __post_init__(self) -> None:
        self.dtype = np.dtype(self.dtype).name
        self.shape = tuple(int(d) for d in self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of one drawn array."""
        return int(np.prod(self.shape, dtype=object)) * np.dtype(self.dtype).itemsize

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """Draw one array of this spec from `rng` (uniform in [low, high)), straight into
        an array of its dtype: the 64-bit draws come in chunks of _SAMPLE_CHUNK (the same
        numbers as one draw of the whole shape, without a full-size 64-bit temporary)."""
        dtype = np.dtype(self.dtype)
        out = np.empty(self.shape, dtype)
        flat = out.reshape(-1)
        for start in range(0, flat.size, _SAMPLE_CHUNK):
            n = min(_SAMPLE_CHUNK, flat.size - start)
            if dtype.kind in "iu":
                flat[start:start + n] = rng.integers(int(self.low), int(self.high), size=n)
            elif dtype.kind == "b":
                flat[start:start + n] = rng.integers(0, 2, size=n)
            else:
                flat[start:start + n] = rng.uniform(self.low, self.high, size=n)
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "InputSpec":
        return cls(d["name"], d["dtype"], tuple(d["shape"]), d["low"], d["high"])


@dataclass
class ForwardModel:
    """A forward-only ONNX model plus what is needed to train it.

    `trainable` and `frozen` name initializers of `model`; `inputs` are the data inputs
    in graph order; `labels` is the loss target that generate_artifacts appends as the
    last training input ("labels" for ce, "target" for mse).
    """

    name: str
    model: onnx.ModelProto
    trainable: list[str]
    frozen: list[str]
    inputs: list[InputSpec]
    labels: InputSpec
    loss: str
    # forward .onnx files only: what onnxplan.forward.prepare_forward rewrote and chose
    prep: dict | None = None

    @property
    def parameter_count(self) -> int:
        """Elements in trainable plus frozen parameters."""
        names = set(self.trainable) | set(self.frozen)
        return sum(
            int(np.prod(t.dims, dtype=np.int64)) for t in self.model.graph.initializer if t.name in names
        )


@dataclass(frozen=True)
class ModelSpec:
    """A zoo entry: name, one-line description, defaults and the builder."""

    name: str
    description: str
    default_batch: int
    default_loss: str
    default_optimizer: str
    builder: Callable[..., ForwardModel]


def labels_for_output(shape: tuple[int, ...], loss: str) -> InputSpec:
    """The loss target generate_artifacts expects for an output of `shape`.

    ce: int64 class ids [N] in [0, C) for an [N, C] output (the ORT block drops the last
    dim, and SoftmaxCrossEntropyLoss reads classes from dim 1, so only rank 2 works);
    mse: float32 in [0, 1) with the output's shape. A scalar output (a model that computes its
    own loss) is refused for either: ModelError.
    """
    shape = tuple(int(d) for d in shape)
    if not shape:  # a loss on top of a loss would train something else than the model says
        raise ModelError("the model's output is a scalar: it already ends in its loss (e.g. an exported "
                         "CrossEntropyLoss), and onnxplan adds the loss itself (--loss ce or mse); export the "
                         "model without its loss, its logits or predictions as the only output")
    if loss == "ce":
        if len(shape) != 2:
            raise UsageError(f"loss 'ce' needs an [N, classes] output, got shape {list(shape)}; use mse")
        return InputSpec("labels", "int64", (shape[0],), 0, shape[1])
    if loss == "mse":
        return InputSpec("target", "float32", shape, 0.0, 1.0)
    raise UsageError(f"unknown loss {loss!r}; known: {', '.join(LOSSES)}")
