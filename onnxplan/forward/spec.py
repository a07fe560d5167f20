"""What a forward model is to the load stage: its step inputs (InputSpec), the model with what
to train (ForwardModel), the losses and optimizers a step can have, and the labels a loss needs.
The zoo builds ForwardModels; a user's .onnx becomes one in onnxplan.forward."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from onnxplan.errors import ModelError, UsageError

__all__ = ["LOSSES", "OPTIMIZERS", "ForwardModel", "InputSpec", "chosen_token_ids", "labels_for_output", "losses_for",
           "token_ids"]

LOSSES = ("ce", "mse", "causal-lm")
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
    def from_dict(cls, d: dict) -> InputSpec:
        return cls(d["name"], d["dtype"], tuple(d["shape"]), d["low"], d["high"])


@dataclass
class ForwardModel:
    """A forward-only ONNX model plus what is needed to train it.

    `trainable` and `frozen` name initializers of `model`; `inputs` are the data inputs
    in graph order; `labels` is the loss target that generate_artifacts appends as the
    last training input ("labels" for ce, "target" for mse; None for causal-lm, whose labels are
    the token ids among `inputs`).
    """

    name: str
    model: onnx.ModelProto
    trainable: list[str]
    frozen: list[str]
    inputs: list[InputSpec]
    labels: InputSpec | None
    loss: str
    # forward .onnx files only: what onnxplan.forward.prepare_forward rewrote and chose
    prep: dict | None = None
    # forward .onnx files only: the folder its large initializers' external data lives in, where
    # `model` still holds them as references (onnxplan.ir.onnx_files.load_onnx(weights=False));
    # None: every value is in `model`
    weights_dir: Path | None = None
    # forward .onnx files only: built with its parameters left in weights_dir (a model over
    # protobuf's 2 GiB: onnxplan.loading.by_reference), the checkpoint a nominal one
    by_reference: bool = False

    @property
    def parameter_count(self) -> int:
        """Elements in trainable plus frozen parameters."""
        names = set(self.trainable) | set(self.frozen)
        return sum(
            int(np.prod(t.dims, dtype=np.int64)) for t in self.model.graph.initializer if t.name in names
        )


def token_ids(inputs, shape: tuple[int, ...]) -> InputSpec | None:
    """The input a causal LM's output [B, S, V] predicts the next of: an integer input of shape
    [B, S] (`input_ids` where there are several); None if there is none or no way to choose."""
    ids = [s for s in inputs or () if np.dtype(s.dtype).kind in "iu" and s.shape == tuple(shape[:2])]
    if len(ids) > 1:
        ids = [s for s in ids if s.name == "input_ids"]
    return ids[0] if len(ids) == 1 else None


def chosen_token_ids(inputs, shape: tuple[int, ...]) -> InputSpec:
    """token_ids of a model whose causal-lm loss was accepted (labels_for_output checked it has them)."""
    ids = token_ids(inputs, shape)
    if ids is None:
        raise RuntimeError(f"causal-lm loss on an output of shape {list(shape)} without token ids")
    return ids


def losses_for(shape: tuple[int, ...], inputs=None) -> list[str]:
    """The losses an output of `shape` can train with (model inputs `inputs`): mse on any tensor,
    ce on [N, classes] and [B, S, classes], causal-lm on [B, S, vocab] given its token ids."""
    shape = tuple(int(d) for d in shape)
    if not shape:
        return []
    fits = ["ce"] if len(shape) in (2, 3) else []
    if len(shape) == 3 and shape[1] > 1 and token_ids(inputs, shape) is not None:
        fits.append("causal-lm")
    return [*fits, "mse"]


def _misfit(loss: str, need: str, shape: tuple[int, ...], inputs) -> UsageError:
    return UsageError(f"loss {loss!r} needs {need}, got shape {list(shape)}; losses that fit this output: "
                      f"{', '.join(losses_for(shape, inputs))}")


def labels_for_output(shape: tuple[int, ...], loss: str, inputs=None) -> InputSpec | None:
    """The loss target generate_artifacts' training model takes for an output of `shape`
    (the model's inputs `inputs`), fed each step beside them; None for causal-lm, whose labels
    are the token ids the model already reads (onnxplan.losses builds the loss).

    ce: int64 class ids in [0, C): [N] for an [N, C] output (ORT's CrossEntropyLoss), [B, S] for a
    [B, S, C] output (one class per token, the mean over tokens; onnxplan.losses);
    causal-lm: an output [B, S, V] and an integer input [B, S] of token ids in [0, V) (`input_ids`
    where there are several); mse: float32 in [0, 1) with the output's shape. A scalar output (a
    model that computes its own loss) is refused for any: ModelError.
    """
    shape = tuple(int(d) for d in shape)
    if not shape:  # a loss on top of a loss would train something else than the model says
        raise ModelError("the model's output is a scalar: it already ends in its loss (e.g. an exported "
                         "CrossEntropyLoss), and onnxplan adds the loss itself (--loss ce, causal-lm or mse); "
                         "export the model without its loss, its logits or predictions as the only output")
    if loss == "ce":
        if len(shape) not in (2, 3):
            raise _misfit(loss, "an [N, classes] or [B, S, classes] output", shape, inputs)
        return InputSpec("labels", "int64", shape[:-1], 0, shape[-1])
    if loss == "causal-lm":
        if len(shape) != 3 or shape[1] < 2:
            raise _misfit(loss, "a [B, S, vocab] output with S >= 2", shape, inputs)
        ids = token_ids(inputs, shape)
        if ids is None:
            raise _misfit(loss, f"one integer input of shape {list(shape[:2])} (the token ids; "
                          "'input_ids' where there are several)", shape, inputs)
        if not (0 <= ids.low and ids.high <= shape[2]):
            raise UsageError(f"loss 'causal-lm' predicts the next of the token ids {ids.name!r}, drawn in "
                             f"[{ids.low:g}, {ids.high:g}), from {shape[2]} classes: the ids must be in "
                             f"[0, {shape[2]})")
        return None
    if loss == "mse":
        return InputSpec("target", "float32", shape, 0.0, 1.0)
    raise UsageError(f"unknown loss {loss!r}; known: {', '.join(LOSSES)}")
