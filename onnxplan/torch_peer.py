"""PyTorch eager peer: the zoo's ONNX forward graph as a torch.nn.Module, trained like ORT does."""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

from onnxplan.data import make_step_batch, read_input_specs, read_metadata, run_steps
from onnxplan.errors import UnsupportedOpError
from onnxplan.memprobe import mark_baseline
from onnxplan.ort import DEFAULT_LEARNING_RATE
from onnxplan.threads import use_threads

__all__ = [
    "TORCH_OPS",
    "OnnxModule",
    "TorchTrainer",
    "loss_fn",
    "make_optimizer",
    "probe_target",
    "run_torch",
]

_ADAMW: dict[str, Any] = {"betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0}  # onnxblock AdamW defaults

TORCH_OPS: dict[str, Callable[..., Any]] = {}


def _op(*names: str):
    def register(fn):
        for name in names:
            TORCH_OPS[name] = fn
        return fn
    return register


def _ints(value) -> list[int]:
    return [int(v) for v in (value.tolist() if isinstance(value, torch.Tensor) else value)]


@_op("Gemm")
def _gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    a = a.t() if transA else a
    b = b.t() if transB else b
    y = a @ b if alpha == 1.0 else alpha * (a @ b)
    if c is not None:
        y = y + (c if beta == 1.0 else beta * c)
    return y


_op("MatMul")(lambda a, b: a @ b)
_op("Add")(lambda a, b: a + b)
_op("Sub")(lambda a, b: a - b)
_op("Mul")(lambda a, b: a * b)
_op("Div")(lambda a, b: a / b)
_op("Pow")(lambda a, b: torch.pow(a, b))
_op("Erf")(torch.erf)
_op("Relu")(torch.relu)
_op("Sigmoid")(torch.sigmoid)
_op("Tanh")(torch.tanh)
_op("Sqrt")(torch.sqrt)
_op("Neg")(torch.neg)
_op("Identity")(lambda x: x)


@_op("Conv")
def _conv(x, w, b=None, *, kernel_shape=None, strides=None, pads=None, dilations=None, group=1,
          auto_pad="NOTSET"):
    if auto_pad not in ("NOTSET", b"NOTSET"):
        raise UnsupportedOpError(f"Conv auto_pad={auto_pad!r} is not supported by the torch peer")
    nd = w.dim() - 2
    pads = list(pads or [0] * 2 * nd)
    if pads[:nd] != pads[nd:]:
        raise UnsupportedOpError("Conv with asymmetric pads is not supported by the torch peer")
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    return conv(x, w, b, stride=list(strides or [1] * nd), padding=pads[:nd],
                dilation=list(dilations or [1] * nd), groups=group)


@_op("MaxPool")
def _maxpool(x, *, kernel_shape, strides=None, pads=None, dilations=None, ceil_mode=0, auto_pad="NOTSET",
             storage_order=0):
    nd = len(kernel_shape)
    pads = list(pads or [0] * 2 * nd)
    pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
    return pool(x, kernel_shape, list(strides or kernel_shape), pads[:nd], list(dilations or [1] * nd),
                ceil_mode=bool(ceil_mode))


@_op("AveragePool")
def _avgpool(x, *, kernel_shape, strides=None, pads=None, ceil_mode=0, count_include_pad=0,
             auto_pad="NOTSET"):
    nd = len(kernel_shape)
    pads = list(pads or [0] * 2 * nd)
    pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nd]
    return pool(x, kernel_shape, list(strides or kernel_shape), pads[:nd], bool(ceil_mode),
                bool(count_include_pad))


_op("GlobalAveragePool")(lambda x: x.mean(dim=tuple(range(2, x.dim())), keepdim=True))
_op("GlobalMaxPool")(lambda x: x.amax(dim=tuple(range(2, x.dim())), keepdim=True))


@_op("BatchNormalization")
def _batchnorm(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    # ONNX momentum weighs the old running value; torch's weighs the new one. ORT's training
    # graph does not write the running stats back, so neither does this peer (clones).
    return F.batch_norm(x, mean.clone(), var.clone(), scale, bias, training=bool(training_mode),
                        momentum=1.0 - momentum, eps=epsilon)


@_op("LayerNormalization")
def _layernorm(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    axis = axis % x.dim()
    return F.layer_norm(x, x.shape[axis:], scale, bias, eps=epsilon)


@_op("Softmax")
def _softmax(x, *, axis=-1):
    return torch.softmax(x, dim=axis)


@_op("LogSoftmax")
def _log_softmax(x, *, axis=-1):
    return torch.log_softmax(x, dim=axis)


@_op("Flatten")
def _flatten(x, *, axis=1):
    axis = axis % x.dim() if x.dim() else 0
    return x.reshape(math.prod(x.shape[:axis]), -1)


@_op("Reshape")
def _reshape(x, shape, *, allowzero=0):
    dims = _ints(shape)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@_op("Transpose")
def _transpose(x, *, perm=None):
    return x.permute(*(perm if perm is not None else reversed(range(x.dim()))))


@_op("Squeeze")
def _squeeze(x, axes=None):
    if axes is None:
        return x.squeeze()
    for a in sorted((a % x.dim() for a in _ints(axes)), reverse=True):
        x = x.squeeze(a)
    return x


@_op("Unsqueeze")
def _unsqueeze(x, axes):
    out_rank = x.dim() + len(_ints(axes))
    for a in sorted(a % out_rank for a in _ints(axes)):
        x = x.unsqueeze(a)
    return x


@_op("Concat")
def _concat(*xs, axis):
    return torch.cat(xs, dim=axis)


@_op("Gather")
def _gather(data, indices, *, axis=0):
    if axis == 0 and data.dim() == 2:
        return F.embedding(indices, data)  # the embedding lookup (sparse-free dense gradient)
    return torch.index_select(data, axis, indices.reshape(-1)).reshape(
        *data.shape[:axis], *indices.shape, *data.shape[axis + 1:])


def _reduce(fn):
    def reduce(x, axes=None, *, keepdims=1, noop_with_empty_axes=0, **attrs):
        axes = attrs.get("axes_attr", axes)
        if axes is None or len(_ints(axes)) == 0:
            if noop_with_empty_axes:
                return x
            axes = list(range(x.dim()))
        return fn(x, dim=tuple(_ints(axes)), keepdim=bool(keepdims))
    return reduce


_op("ReduceMean")(_reduce(torch.mean))
_op("ReduceSum")(_reduce(torch.sum))
_op("ReduceMax")(_reduce(torch.amax))


@_op("Constant")
def _constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None):
    if value is not None:
        return torch.from_numpy(numpy_helper.to_array(value).copy())
    for v, dtype in ((value_float, torch.float32), (value_floats, torch.float32),
                     (value_int, torch.int64), (value_ints, torch.int64)):
        if v is not None:
            return torch.tensor(v, dtype=dtype)
    raise UnsupportedOpError("Constant without a value")


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    if node.op_type.startswith("Reduce") and "axes" in out:
        out["axes_attr"] = out.pop("axes")  # opset < 18: axes is an attribute
    return out


class OnnxModule(torch.nn.Module):
    """Runs an ONNX forward graph with torch ops; initializers become parameters or buffers.

    `trainable` initializers are nn.Parameters (same values, same names as in the ONNX
    model, '.' written as '__'), every other initializer a buffer. forward(**inputs) returns
    the graph's single output.
    """

    def __init__(self, model: onnx.ModelProto, trainable: list[str]) -> None:
        super().__init__()
        graph = model.graph
        missing = sorted({n.op_type for n in graph.node if n.domain in ("", "ai.onnx")} - set(TORCH_OPS))
        foreign = sorted({f"{n.domain}.{n.op_type}" for n in graph.node if n.domain not in ("", "ai.onnx")})
        if missing or foreign:
            raise UnsupportedOpError(f"torch peer: no translation for {', '.join(missing + foreign)}")
        self._names: dict[str, str] = {}
        wanted = set(trainable)
        for t in graph.initializer:
            attr = "p_" + "".join(c if c.isalnum() else "_" for c in t.name) + f"_{len(self._names)}"
            value = torch.from_numpy(numpy_helper.to_array(t).copy())
            if t.name in wanted:
                self.register_parameter(attr, torch.nn.Parameter(value))
            else:
                self.register_buffer(attr, value)
            self._names[t.name] = attr
        self._nodes = [(n.op_type, list(n.input), list(n.output), _attrs(n)) for n in graph.node]
        self._inputs = [vi.name for vi in graph.input if vi.name not in self._names]
        self._output = graph.output[0].name

    def tensor(self, onnx_name: str) -> torch.Tensor:
        return getattr(self, self._names[onnx_name])

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        env: dict[str, torch.Tensor] = {name: self.tensor(name) for name in self._names}
        env.update(inputs)
        device = next(iter(inputs.values())).device if inputs else None
        for op, ins, outs, attrs in self._nodes:
            args = [env[n] if n else None for n in ins]
            result = TORCH_OPS[op](*args, **attrs)
            if op == "Constant" and device is not None:
                result = result.to(device)  # made on the host
            env[outs[0]] = result  # extra outputs (BN mean/var, LN stats) are not read by the zoo
        return env[self._output]


def loss_fn(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The artifacts' losses (onnxplan.losses), mean-reduced: CrossEntropyLoss (a [B, S, C] output
    per token), causal-lm (labels: the token ids, shifted by one) and MSELoss."""
    from onnxplan.losses import IGNORE_INDEX

    if kind == "ce":
        return lambda out, labels: F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1),
                                                   ignore_index=IGNORE_INDEX)
    if kind == "causal-lm":
        return lambda out, ids: F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]), ids[:, 1:].reshape(-1),
                                                ignore_index=IGNORE_INDEX)
    if kind == "mse":
        return lambda out, target: F.mse_loss(out, target)
    raise ValueError(f"unknown loss {kind!r}")


def _import_dynamo_without_litter() -> None:
    """Import torch._dynamo (a torch optimizer's first param group imports it) without leaving an
    empty $TMPDIR/torchinductor_<user> behind: the import creates torch's inductor cache folder and
    sets TORCHINDUCTOR_CACHE_DIR, though the peer compiles nothing. Here the import gets a scratch
    folder, removed after, and the environment is left as it was; a cache folder the user chose
    (TORCHINDUCTOR_CACHE_DIR) is used as torch would."""
    if "torch._dynamo" in sys.modules or "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    with tempfile.TemporaryDirectory(prefix="onnxplan-inductor-") as scratch:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = scratch
        try:
            import torch._dynamo  # noqa: F401
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


def make_optimizer(kind: str, params) -> torch.optim.Optimizer:
    """The optimizer equivalent to the artifacts': AdamW (eps 1e-6, no weight decay) or SGD, lr 1e-3."""
    _import_dynamo_without_litter()
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=DEFAULT_LEARNING_RATE, **_ADAMW)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=DEFAULT_LEARNING_RATE)
    raise ValueError(f"unknown optimizer {kind!r}")


class TorchTrainer:
    """One OnnxModule + loss + optimizer built from an artifact folder's forward.onnx and metadata,
    on `device` ("cpu", or "cuda": then TF32 is off, as in our float32 CuPy kernels)."""

    def __init__(self, model: onnx.ModelProto, meta: dict[str, Any], device: str = "cpu") -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.module = OnnxModule(model, meta["trainable"]).to(self.device)
        self.module.train()
        self.loss = loss_fn(meta["loss"])
        self.optimizer = make_optimizer(meta["optimizer"], [p for p in self.module.parameters()])
        self.input_names = [spec["name"] for spec in meta["inputs"]]
        if meta["labels"] is not None:
            self.label_name = meta["labels"]["name"]
        else:  # causal-lm: the token ids (onnxplan.forward.spec.token_ids)
            from onnxplan.data import InputSpec
            from onnxplan.forward.spec import chosen_token_ids

            out = model.graph.output[0].type.tensor_type.shape.dim
            self.label_name = chosen_token_ids([InputSpec.from_dict(row) for row in meta["inputs"]],
                                        tuple(d.dim_value for d in out)).name

    def step(self, batch: dict[str, np.ndarray]) -> tuple[float, float]:
        """One training step (forward, loss, backward, update); returns (loss, seconds)."""
        feeds = {name: torch.from_numpy(batch[name]).to(self.device) for name in self.input_names}
        labels = torch.from_numpy(batch[self.label_name]).to(self.device)
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self.module(**feeds), labels)
        loss.backward()
        self.optimizer.step()
        sync()
        seconds = time.perf_counter() - start
        return float(loss.detach()), seconds


def _setup(artifact_dir: str | Path, steps: int, seed: int):
    meta = read_metadata(artifact_dir)
    inputs, labels = read_input_specs(artifact_dir)
    batches = [make_step_batch(inputs, labels, seed, k) for k in range(steps)]
    model = onnx.load(str(Path(artifact_dir) / "forward.onnx"))
    return meta, batches, model


def run_torch(artifact_dir: str | Path, steps: int = 3, seed: int = 0) -> dict[str, list[float]]:
    """Train `steps` seeded steps (the batches ORT's reference sees); losses and step seconds."""
    meta, batches, model = _setup(artifact_dir, steps, seed)
    return run_steps(TorchTrainer(model, meta), batches)


def probe_target(artifact_dir: str, steps: int = 3, seed: int = 0, threads: int | None = None, warmup: int = 0,
                 warmup_seconds: float = 0.0) -> dict:
    """Memory-probe entry point: baseline after imports, step data and the ONNX file are loaded;
    measured: parameters, gradients, optimizer state and the steps' activations. `threads`:
    torch's pools as onnxplan.threads sizes ours (None: every available core); OpenMP waits as
    for any PyTorch user (bench runs this with threads.peer_environment()). `steps` timed steps
    after the warm-up (data.run_steps: `warmup` steps, on until `warmup_seconds`)."""
    meta, batches, model = _setup(artifact_dir, warmup + steps, seed)
    settings = use_threads(threads, torch_alone=True)
    mark_baseline()
    return {**run_steps(TorchTrainer(model, meta), batches, warmup, warmup_seconds), "threads": settings.as_dict()}
